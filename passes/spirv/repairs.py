"""Repairs of upstream's SPIR-V dialect output: loop results initialized before a loop
that may run zero times, and workgroup arrays unwrapped from their one-member structs."""

from __future__ import annotations

import re

from mlir import ir

from .walk import walk_ops


def initialize_loop_results(spv: ir.Operation) -> None:
    """Store each scf.for result variable's initial value before its spirv.mlir.loop.

    Upstream lowers ``%r = scf.for ... iter_args(%a = %init)`` to a Function variable
    declared before the loop, stored from the back edge (``spirv.Store %var, %next`` then
    ``spirv.Branch ^header(%iv_next, %next)``) and loaded after it: with zero trips
    nothing was stored. The value stored on the back edge is header operand j; the
    initial value is operand j of the loop's entry branch."""
    for op in walk_ops(spv.regions[0].blocks[0]):
        if op.name != "spirv.mlir.loop":
            continue
        blocks = list(op.regions[0].blocks)
        if len(blocks) < 2:
            continue
        entry_ops = list(blocks[0].operations)
        if not entry_ops or entry_ops[-1].operation.name != "spirv.Branch":
            continue
        inits = list(entry_ops[-1].operation.operands)
        header = blocks[1]
        done = set()
        for b in blocks[1:]:
            ops = [o.operation for o in b.operations]
            if not ops or ops[-1].name != "spirv.Branch" or ops[-1].successors[0] != header:
                continue
            back = list(ops[-1].operands)
            for st in ops[:-1]:
                if st.name != "spirv.Store":
                    continue
                var, val = st.operands[0], st.operands[1]
                owner = var.owner
                if isinstance(owner, ir.Block) or owner.name != "spirv.Variable" or \
                        owner.parent != op.parent or id(owner) in done:
                    continue
                j = next((k for k, v in enumerate(back) if v == val), None)
                if j is None or j >= len(inits):
                    continue
                init = st.clone(ip=ir.InsertionPoint(op))
                init.operands[1] = inits[j]
                done.add(id(owner))


def unwrap_workgroup_arrays(spv: ir.Operation) -> None:
    """``!spirv.ptr<!spirv.struct<(!spirv.array<N x T>)>, Workgroup>`` -> ``!spirv.ptr<
    !spirv.array<N x T>, Workgroup>``, dropping the leading 0 of every access chain. A
    variable used any other way keeps its struct."""
    from mlir.dialects import spirv as spirv_d

    body = spv.regions[0].blocks[0]
    wrapped = re.compile(r"^!spirv\.ptr<!spirv\.struct<\((!spirv\.array<[^()]*>)\)>, Workgroup>$")
    globals_ = {}
    for op in body.operations:
        op = op.operation
        if op.name == "spirv.GlobalVariable":
            m = wrapped.match(str(ir.TypeAttr(op.attributes["type"]).value))
            if m:
                globals_[op.attributes["sym_name"].value] = (op, m.group(1))
    if not globals_:
        return
    uses: dict[str, list] = {name: [] for name in globals_}
    ok = dict.fromkeys(globals_, True)
    for op in walk_ops(body):
        if op.name != "spirv.mlir.addressof":
            continue
        name = ir.FlatSymbolRefAttr(op.attributes["variable"]).value
        if name not in globals_:
            continue
        uses[name].append(op)
        for use in op.results[0].uses:
            user = use.owner
            if user.name != "spirv.AccessChain" or use.operand_number != 0 or len(user.operands) < 3 or \
                    not _is_zero_constant(user.operands[1]):
                ok[name] = False
    for name, (var, array) in globals_.items():
        if not ok[name]:
            continue
        new_type = ir.Type.parse(f"!spirv.ptr<{array}, Workgroup>")
        var.attributes["type"] = ir.TypeAttr.get(new_type)
        for addr in uses[name]:
            addr.results[0].set_type(new_type)
            for chain in [u.owner for u in addr.results[0].uses]:
                with chain.location:
                    new = spirv_d.AccessChainOp(chain.results[0].type, chain.operands[0], list(chain.operands)[2:],
                                                ip=ir.InsertionPoint(chain))
                chain.results[0].replace_all_uses_with(new.result)
                chain.erase()


def _is_zero_constant(v: ir.Value) -> bool:
    owner = v.owner
    return not isinstance(owner, ir.Block) and owner.name == "spirv.Constant" and \
        str(owner.attributes["value"]).split(":")[0].strip() == "0"
