"""kf-opt: kf's mlir-opt. Parses a .mlir file, loads the kf dialect, runs a pipeline in
which kf passes and upstream MLIR passes mix, and prints the result.

It never imports torch, so a lit suite of hundreds of RUN lines stays fast.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from mlir import ir

from kf.dialects import load as load_kf, verify as verify_kf
from kf.passes import pipeline, registry

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.M)
EXPECTED = re.compile(
    r"//\s*expected-(error|warning|note|remark)\s*(?:@(above|below|[+-]\d+))?\s*\{\{(.*?)\}\}\s*$", re.M)

#: Upstream passes that kf's pipelines use; any other registered upstream pass works too.
UPSTREAM_PASSES = [
    "canonicalize", "cse", "symbol-dce", "inline", "loop-invariant-code-motion",
    "linalg-fuse-elementwise-ops", "convert-linalg-to-loops", "one-shot-bufferize",
    "convert-elementwise-to-linalg", "transform-interpreter", "gpu-kernel-outlining",
    "nvvm-attach-target", "expand-strided-metadata", "lower-affine", "convert-scf-to-cf",
    "convert-gpu-to-nvvm", "gpu-to-llvm", "reconcile-unrealized-casts", "gpu-module-to-binary",
    "convert-gpu-to-spirv", "spirv-lower-abi-attrs", "spirv-update-vce", "convert-vector-to-llvm",
    "convert-func-to-llvm", "finalize-memref-to-llvm", "convert-arith-to-llvm", "convert-math-to-llvm",
]


@dataclass
class Diag:
    severity: str
    line: int | None
    col: int | None
    file: str
    message: str

    def render(self, filename: str) -> str:
        where = f"{filename}:{self.line}:{self.col}: " if self.line else ""
        return f"{where}{self.severity}: {self.message}"


_SEVERITY = {ir.DiagnosticSeverity.ERROR: "error", ir.DiagnosticSeverity.WARNING: "warning",
             ir.DiagnosticSeverity.NOTE: "note", ir.DiagnosticSeverity.REMARK: "remark"}


def _loc_parts(loc: ir.Location) -> tuple[int | None, int | None, str]:
    text = str(loc)
    m = re.search(r'loc\("([^"]*)":(\d+):(\d+)', text)
    if m:
        return int(m.group(2)), int(m.group(3)), m.group(1)
    return None, None, ""


def _collect(diag, out: list[Diag]) -> None:
    line, col, file = _loc_parts(diag.location)
    out.append(Diag(_SEVERITY.get(diag.severity, "error"), line, col, file, str(diag.message)))
    for note in diag.notes:
        _collect(note, out)


def _expectations(text: str) -> list[tuple[str, int, str]]:
    expected = []
    for m in EXPECTED.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        where = m.group(2)
        if where == "above":
            line -= 1
        elif where == "below":
            line += 1
        elif where:
            line += int(where)
        expected.append((m.group(1), line, m.group(3).strip()))
    return expected


def _check_expectations(text: str, diags: list[Diag], filename: str) -> list[str]:
    failures = []
    remaining = list(diags)
    for severity, line, message in _expectations(text):
        hit = next((d for d in remaining if d.severity == severity and d.line == line and message in d.message), None)
        if hit is None:
            failures.append(f"{filename}:{line}: error: expected {severity} \"{message}\" was not produced")
        else:
            remaining.remove(hit)
    for d in remaining:
        if d.severity == "note":
            continue  # like mlir-opt, unexpected notes attached to matched errors are fine
        failures.append(f"{d.render(filename)}  (unexpected {d.severity})")
    return failures


def process_chunk(text: str, args, filename: str) -> tuple[bool, str, list[Diag]]:
    """Parse, verify and transform one buffer. Returns (ok, printed IR, diagnostics)."""
    diags: list[Diag] = []
    ctx = ir.Context()
    ctx.load_all_available_dialects()
    ctx.emit_error_diagnostics = True
    load_kf(ctx)

    def handler(d):
        _collect(d, diags)
        return True

    ctx.attach_diagnostic_handler(handler)
    with ctx:
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            for d in e.error_diagnostics:
                _collect(d, diags)
            return False, "", diags
        errors = verify_kf(module.operation)
        for loc, message in errors:
            loc.emit_error(message)
        if errors:
            return False, "", diags
        if args.pass_pipeline:
            try:
                pm, _ = pipeline.build(args.pass_pipeline, ctx, print_before=args.print_before,
                                       print_after=args.print_after, dump=_dump)
            except pipeline.PipelineError as e:
                diags.append(Diag("error", None, None, "", str(e)))
                return False, "", diags
            if args.mlir_print_ir_after_all or args.mlir_print_ir_after_failure:
                ctx.enable_multithreading(False)  # MLIR's IR printing requires it
            if args.mlir_print_ir_after_all:
                pm.enable_ir_printing(print_after_all=True, print_module_scope=True)
            elif args.mlir_print_ir_after_failure:
                pm.enable_ir_printing(print_after_all=False, print_after_failure=True, print_module_scope=True)
            if args.mlir_timing:
                pm.enable_timing()
            try:
                pm.run(module.operation)
            except ir.MLIRError as e:
                for d in e.error_diagnostics:
                    _collect(d, diags)
                if not any(d.severity == "error" for d in diags):
                    diags.append(Diag("error", None, None, "", str(e).splitlines()[0]))
                return False, "", diags
            errors = verify_kf(module.operation)
            for loc, message in errors:
                loc.emit_error(message)
            if errors:
                return False, "", diags
        printed = module.operation.get_asm(enable_debug_info=args.mlir_print_debuginfo)
        return True, printed, diags


def _dump(op, title: str) -> None:
    """One IR dump on stderr, framed as mlir-opt frames its own."""
    sys.stderr.write(f"// -----// IR Dump {title} //----- //\n{op.get_asm()}\n")


def version() -> str:
    """kf's version and the MLIR it is built on."""
    from importlib import metadata

    import kf

    try:
        mlir_version = metadata.version("xtc-mlir-python-bindings")
    except metadata.PackageNotFoundError:
        mlir_version = "unknown"
    return f"kf-opt (kf {kf.__version__})\n  MLIR Python bindings {mlir_version} (upstream LLVM {mlir_version.rsplit('.', 1)[0]})"


def _is_pass(name: str) -> bool:
    """Whether name is a kf pass or a pass registered with upstream MLIR."""
    if registry.is_kf_pass(name):
        return True
    from mlir.passmanager import PassManager

    with ir.Context():
        try:
            PassManager.parse(f"builtin.module({name})")
        except ValueError:
            return False
    return True


def _pass_flags(extra: list[str]) -> tuple[list[str], list[str]]:
    """mlir-opt's pass flags (``-kf-fuse``, ``--kf-tile="target=cuda"``) among the
    arguments argparse did not know: (pipeline elements in order, the unknown rest)."""
    elements, unknown = [], []
    for arg in extra:
        name, _, options = arg.lstrip("-").partition("=")
        if arg.startswith("-") and name and _is_pass(name):
            elements.append(f"{name}{{{options}}}" if options else name)
        else:
            unknown.append(arg)
    return elements, unknown


def list_passes() -> str:
    lines = ["kf passes:"]
    for name in sorted(registry.REGISTRY):
        lines.append(f"  {name:<28} {registry.REGISTRY[name].description}")
    lines.append("upstream MLIR passes used by kf's pipelines (any registered upstream pass may be named):")
    lines.extend(f"  {name}" for name in UPSTREAM_PASSES)
    return "\n".join(lines)


def _decode(data: bytes, filename: str) -> str | None:
    """The input as text; None, after a located diagnostic, when it is not UTF-8 (MLIR's
    source files are UTF-8)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        print(f"{filename}:{line}:{col}: error: the input is not UTF-8 text: byte 0x{data[e.start]:02x} "
              f"({e.reason})", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kf-opt", allow_abbrev=False,
                                 description="kf's mlir-opt: run kf and MLIR passes on a .mlir file. Passes are given "
                                             "as --pass-pipeline='builtin.module(a, b{opt=1})' or, as in mlir-opt, "
                                             "as flags in order: -kf-fuse --kf-tile='target=cuda'")
    ap.add_argument("--version", action="store_true", help="print kf's and MLIR's versions")
    ap.add_argument("input", nargs="?", default="-", help="input .mlir file, or - for stdin")
    ap.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    ap.add_argument("--pass-pipeline", default="", help="e.g. 'builtin.module(kf-verify, canonicalize)'")
    ap.add_argument("--list-passes", action="store_true", help="list kf passes and upstream passes")
    ap.add_argument("--split-input-file", action="store_true", help="process each '// -----' chunk on its own")
    ap.add_argument("--verify-diagnostics", action="store_true", help="check expected-error/... comments")
    ap.add_argument("--mlir-print-ir-after-all", action="store_true")
    ap.add_argument("--mlir-print-ir-after-failure", action="store_true")
    ap.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    ap.add_argument("--mlir-print-ir-before", action="append", default=[], metavar="PASS",
                    help="print the IR before each run of PASS (repeatable, or a comma list)")
    ap.add_argument("--mlir-print-ir-after", action="append", default=[], metavar="PASS",
                    help="print the IR after each run of PASS (repeatable, or a comma list)")
    ap.add_argument("--mlir-timing", action="store_true", help="print the time each pass took")
    args, extra = ap.parse_known_args(argv)

    if args.version:
        print(version())
        return 0
    if args.list_passes:
        print(list_passes())
        return 0
    flags, unknown = _pass_flags(extra)
    if unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)} (not a kf-opt option nor a registered pass)")
    if flags and args.pass_pipeline:
        ap.error(f"pass flags ({', '.join(flags)}) and --pass-pipeline cannot be mixed: write one pipeline")
    if flags:
        args.pass_pipeline = f"builtin.module({', '.join(flags)})"
    for when in ("before", "after"):
        given = getattr(args, f"mlir_print_ir_{when}")
        names = frozenset(n.strip() for v in given for n in v.split(",") if n.strip())
        bad = sorted(n for n in names if not _is_pass(n))
        if bad:
            ap.error(f"--mlir-print-ir-{when}: no pass named {', '.join(bad)} (kf-opt --list-passes)")
        setattr(args, f"print_{when}", names)
    filename = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            # bytes where stdin has them (a replaced sys.stdin may be text already)
            stdin = getattr(sys.stdin, "buffer", None)
            data = stdin.read() if stdin is not None else sys.stdin.read().encode()
        else:
            with open(args.input, "rb") as f:
                data = f.read()
    except OSError as e:
        print(f"kf-opt: cannot read {filename}: {e.strerror}", file=sys.stderr)
        return 1
    text = _decode(data, filename)
    if text is None:
        return 1

    # Each chunk is padded with the newlines before it so that locations and
    # expected-diagnostic lines keep the numbering of the whole file.
    chunks = []
    if args.split_input_file:
        start = 0
        for m in SPLIT_MARKER.finditer(text):
            chunks.append(text[start:m.start()])
            start = m.end()
        chunks.append(text[start:])
        offsets, pos = [], 0
        for c in chunks:
            offsets.append(text.count("\n", 0, text.index(c, pos)) if c else 0)
            pos = text.index(c, pos) + len(c)
        chunks = ["\n" * off + c for off, c in zip(offsets, chunks)]
    else:
        chunks = [text]

    outputs, failed, verify_failures = [], False, []
    for chunk in chunks:
        ok, printed, diags = process_chunk(chunk, args, filename)
        if args.verify_diagnostics:
            verify_failures += _check_expectations(chunk, diags, filename)
        else:
            for d in diags:
                print(d.render(filename), file=sys.stderr)
            failed |= not ok
        if ok:
            outputs.append(printed)
    out_text = "\n// -----\n".join(o.rstrip("\n") for o in outputs) + ("\n" if outputs else "")
    if args.verify_diagnostics:
        for f in verify_failures:
            print(f, file=sys.stderr)
        failed = bool(verify_failures)
    if args.output == "-":
        sys.stdout.write(out_text)
    else:
        with open(args.output, "w") as f:
            f.write(out_text)
    return 1 if failed else 0


def _entry() -> int:
    try:
        return main()
    except BrokenPipeError:  # `kf-opt --list-passes | head`
        return 0


if __name__ == "__main__":
    sys.exit(_entry())
