"""Print a sha256 of the PTX, SPIR-V or MSL of a fixed set of kernel configurations.

A move of code between modules must not change a single instruction. This script
compiles a broad, fixed set of functions -- attention (bf16, f16, fp8; head dims 64, 128,
256; unmasked, causal, ragged, a mask per batch; persistent and not), GEMMs (mma.sync
and wgmma shapes, fp8), row-wise, elementwise, transpose and MoE kernels -- for CUDA
sm_90a and sm_80, Vulkan (SPIR-V) and Metal (MSL), with kernel variants (GEMM, attention,
row-wise) set through plan overrides, and prints one line per configuration: its name, the sha256 of the
target's text (PTX and MSL as text, SPIR-V as the binary) and the kernels with their
strategies. No GPU is needed: the back ends stop before ptxas.

    .venv/bin/python scripts/kernel_hashes.py > /tmp/after.txt     # on your change
    git stash; .venv/bin/python scripts/kernel_hashes.py > /tmp/before.txt; git stash pop
    diff /tmp/before.txt /tmp/after.txt

``-k WORD`` keeps the configurations whose name contains WORD (repeatable), ``--list``
prints the names only. It lives in scripts/ rather than test/ because it asserts nothing
by itself: its output is compared between two trees.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


# ---- the functions -----------------------------------------------------------------------


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


def masked_attention(q, k, v, mask):
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(mask == 0, -1e9)
    return torch.softmax(s, dim=-1) @ v


def bias_gelu_gemm(a, b, bias):
    return F.gelu(a @ b + bias)


def nt_gemm(a, b):
    return a @ b.t()


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def softmax(x):
    return torch.softmax(x, dim=-1)


def bias_gelu(x, b):
    return F.gelu(x + b)


def transpose(x):
    return x.transpose(-1, -2).contiguous() * 2


def column_sum(x):
    return x.sum(0) + 1


def moe_layer(x, gate, w_in, w_out):
    from moe import moe_layer_fused

    return moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=2)


# ---- the configurations ------------------------------------------------------------------


@dataclass
class Config:
    name: str
    fn: Callable
    shapes: list  # argument shapes; a shape of "mask" ints is the causal mask of that size
    dtype: torch.dtype = torch.bfloat16
    target: str = "cuda"
    arch: str = "sm_90a"
    precision: str = "auto"
    #: kernel variants, as kf-tile takes them: {"matmul.stages": 3, "rowwise.row_registers": 0}
    plan: dict = field(default_factory=dict)


BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def att(b, h, sq, sk, d, dv=None):
    return [(b, h, sq, d), (b, h, sk, d), (b, h, sk, dv or d)]


def causal(sq, sk, lead=()):
    return ("mask", (*lead, sq, sk))


CONFIGS: list[Config] = []


def add(*configs: Config) -> None:
    CONFIGS.extend(configs)


# attention on Hopper (wgmma): every kernel the planner picks, and the variants
add(
    Config("att-h.bf16.d128.unmasked", attention, att(4, 32, 2048, 2048, 128)),
    Config("att-h.bf16.d64.unmasked", attention, att(4, 32, 2048, 2048, 64)),
    Config("att-h.f16.d128.ragged-keys", attention, att(2, 3, 1000, 1000, 128), F16),
    Config("att-h.bf16.d128.window-not-persistent", attention, att(2, 32, 4096, 4096, 128)),
    Config("att-h.bf16.d128.few-keys", attention, att(2, 4, 256, 256, 128)),
    Config("att-h.bf16.d256.unmasked", attention, att(1, 4, 512, 512, 256)),
    Config("att-h.bf16.d128-64.unmasked", attention, att(2, 4, 1024, 1024, 128, 64)),
    Config("att-h.bf16.d128.causal", masked_attention, att(4, 32, 2048, 2048, 128) + [causal(2048, 2048)]),
    Config("att-h.bf16.d64.causal", masked_attention, att(4, 32, 2048, 2048, 64) + [causal(2048, 2048)]),
    Config("att-h.bf16.d128.causal-tails", masked_attention, att(1, 2, 300, 300, 128) + [causal(300, 300)]),
    Config("att-h.bf16.d256.causal", masked_attention, att(1, 2, 512, 512, 256) + [causal(512, 512)]),
    Config("att-h.bf16.d64.causal-8300", masked_attention, att(1, 1, 8300, 8300, 64) + [causal(8300, 8300)]),
    Config("att-h.bf16.d128.mask-per-batch", masked_attention,
           att(2, 2, 513, 513, 128) + [causal(513, 513, (2, 1))]),
    Config("att-h.fp8.d128", attention, att(4, 32, 2048, 2048, 128), precision="fp8"),
    Config("att-h.fp8.d256", attention, att(1, 3, 384, 384, 256), precision="fp8"),
    Config("att-h.fp8.d128.short", attention, att(2, 4, 256, 256, 128), precision="fp8"),
)
add(Config("att-h.bf16.d128.causal-tails.q-blocks-in-order", masked_attention,
           att(1, 2, 300, 300, 128) + [causal(300, 300)], plan={"attention.reverse_q_blocks": False}))

# attention elsewhere: mma.sync (sm_80), SIMT (f32, Vulkan, Metal)
add(
    Config("att-a.bf16.d128.unmasked", attention, att(2, 8, 1000, 1000, 128), arch="sm_80"),
    Config("att-a.f16.d64.causal", masked_attention, att(2, 8, 1000, 1000, 64) + [causal(1000, 1000)], F16,
           arch="sm_80"),
    Config("att-a.f16.d80.unmasked", attention, att(1, 2, 100, 100, 80), F16, arch="sm_80"),
    Config("att-a.f32.d64.causal", masked_attention, att(2, 2, 257, 257, 64) + [causal(257, 257)], F32,
           arch="sm_80"),
    Config("att-h.fp8.d64.simt", attention, att(1, 2, 256, 256, 64), precision="fp8"),
    Config("att-v.f32.d64.causal", masked_attention, att(2, 2, 257, 257, 64) + [causal(257, 257)], F32,
           target="vulkan", arch=""),
    Config("att-v.f16.d64.unmasked", attention, att(1, 2, 130, 130, 64), F16, target="vulkan", arch=""),
    Config("att-m.f32.d64.causal", masked_attention, att(2, 2, 257, 257, 64) + [causal(257, 257)], F32,
           target="metal", arch=""),
)

# GEMMs
add(
    Config("mm-h.bf16.nn", bias_gelu_gemm, [(4096, 4096), (4096, 1024), (1024,)]),
    Config("mm-h.bf16.nt", nt_gemm, [(8192, 4096), (8192, 4096)]),
    Config("mm-h.bf16.small", bias_gelu_gemm, [(512, 512), (512, 512), (512,)]),
    Config("mm-h.bf16.ragged", bias_gelu_gemm, [(1000, 336), (336, 776), (776,)]),
    Config("mm-h.fp8.nt", nt_gemm, [(4096, 4096), (4096, 4096)], precision="fp8"),
    Config("mm-h.f16.k65-mma-sync", bias_gelu_gemm, [(512, 65), (65, 512), (512,)], F16),
    Config("mm-a.bf16.nn", bias_gelu_gemm, [(4096, 4096), (4096, 1024), (1024,)], arch="sm_80"),
    Config("mm-a.bf16.nt", nt_gemm, [(2048, 512), (1024, 512)], arch="sm_80"),
    Config("mm-a.f16.small", bias_gelu_gemm, [(257, 65), (65, 129), (129,)], F16, arch="sm_80"),
    Config("mm-a.f32", bias_gelu_gemm, [(2048, 512), (512, 1024), (1024,)], F32, arch="sm_80"),
    Config("mm-v.f32", bias_gelu_gemm, [(257, 65), (65, 129), (129,)], F32, target="vulkan", arch=""),
    Config("mm-v.f16", bias_gelu_gemm, [(257, 64), (64, 128), (128,)], F16, target="vulkan", arch=""),
    Config("mm-m.f32", bias_gelu_gemm, [(257, 65), (65, 129), (129,)], F32, target="metal", arch=""),
)
GEMM_HOPPER_VARIANTS = {
    "3-stages": {"matmul.stages": 3},
    "none-in-flight": {"matmul.inflight": 0},
    "n128": {"matmul.max_block_n": 128},
    "ungrouped": {"matmul.group_m": 0},
}
for v, plan in GEMM_HOPPER_VARIANTS.items():
    add(Config(f"mm-h.bf16.nn.{v}", bias_gelu_gemm, [(4096, 4096), (4096, 1024), (1024,)], plan=plan))
GEMM_MMA_VARIANTS = {
    "1-stage": {"matmul.stages": 1},
    "3-stages-64x32": {"matmul.stages": 3, "matmul.warp_tiles": (4, 4)},
    "k-128-bytes": {"matmul.k_bytes": 128},
}
for v, plan in GEMM_MMA_VARIANTS.items():
    add(Config(f"mm-a.bf16.nn.{v}", bias_gelu_gemm, [(4096, 4096), (4096, 1024), (1024,)], arch="sm_80", plan=plan))
add(Config("moe-a.f16.1-stage", moe_layer, [(1, 300, 256), (8, 256), (8, 256, 512), (8, 512, 256)], F16,
           arch="sm_80", plan={"moe_gemm.stages": 1, "matmul.stages": 1}))

# row-wise, elementwise, transpose, generic, MoE
for target, arch in (("cuda", "sm_90a"), ("vulkan", ""), ("metal", "")):
    t = {"cuda": "h", "vulkan": "v", "metal": "m"}[target]
    add(
        Config(f"row-{t}.bf16.layer-norm", layer_norm, [(8192, 4096), (4096,), (4096,)], target=target, arch=arch),
        Config(f"row-{t}.f32.softmax", softmax, [(1000, 1000)], F32, target=target, arch=arch),
        Config(f"row-{t}.bf16.rmsnorm", rmsnorm, [(77, 8193), (8193,)], target=target, arch=arch),
        Config(f"ew-{t}.bf16.bias-gelu", bias_gelu, [(8192, 4096), (4096,)], target=target, arch=arch),
        Config(f"tr-{t}.f32.transpose", transpose, [(3, 257, 129)], F32, target=target, arch=arch),
        Config(f"gen-{t}.f32.column-sum", column_sum, [(1000, 77)], F32, target=target, arch=arch),
        Config(f"moe-{t}.f32", moe_layer, [(2, 19, 64), (4, 64), (4, 64, 96), (4, 96, 64)], F32, target=target,
               arch=arch),
    )
ROWWISE_VARIANTS = {
    "loop": {"rowwise.row_registers": 0},
    "registers-everywhere": {"rowwise.row_registers_widest": 8, "rowwise.row_reciprocal": "always"},
    "64-values-all-loads-first": {"rowwise.row_registers": 64, "rowwise.row_registers_widest": 8,
                                  "rowwise.row_preload": "all", "rowwise.row_max_registers": 0},
}
for target, arch in (("cuda", "sm_90a"), ("vulkan", "")):
    t = {"cuda": "h", "vulkan": "v"}[target]
    for v, plan in ROWWISE_VARIANTS.items():
        add(Config(f"row-{t}.bf16.layer-norm.{v}", layer_norm, [(8192, 4096), (4096,), (4096,)], target=target,
                   arch=arch, plan=plan),
            Config(f"row-{t}.f32.softmax.{v}", softmax, [(1000, 1000)], F32, target=target, arch=arch, plan=plan))
add(
    Config("row-a.f32.layer-norm", layer_norm, [(32768, 8192), (8192,), (8192,)], F32, arch="sm_80"),
    Config("moe-h.bf16", moe_layer, [(1, 300, 256), (8, 256), (8, 256, 512), (8, 512, 256)]),
    Config("moe-a.f16", moe_layer, [(1, 300, 256), (8, 256), (8, 256, 512), (8, 512, 256)], F16, arch="sm_80"),
)


# ---- compiling ---------------------------------------------------------------------------


def inputs(c: Config) -> list:
    gen = torch.Generator().manual_seed(0)
    out = []
    for s in c.shapes:
        if isinstance(s, tuple) and s and s[0] == "mask":
            shape = s[1]
            out.append(torch.tril(torch.ones(shape[-2:])).expand(shape).contiguous().to(c.dtype))
        else:
            out.append(torch.randn(s, generator=gen).to(c.dtype))
    return out


def plan_option(plan: dict) -> str:
    """The overrides as kf-tile options: ``attention.persistent=false``."""
    def text(v):
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (tuple, list)):
            return ",".join(str(x) for x in v)
        return str(v)

    return " ".join(f"{k}={text(v)}" for k, v in sorted(plan.items()))


def compile_config(c: Config) -> tuple[bytes, list[str]]:
    import kf
    from kf import dialects as kd
    from kf import targets
    from kf.passes import pipeline
    from mlir import ir

    fn = kf.jit(c.fn, target=c.target, arch=c.arch, precision=c.precision)
    kf_ir = kf.inspect(fn, *inputs(c)).kf_ir
    passes = ["kf-canonicalize"] + targets.get(c.target).passes(c.arch)
    if c.plan:
        passes = [p[:-1] + " " + plan_option(c.plan) + "}" if p.startswith("kf-tile{") else p for p in passes]
    ctx = kd.make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(kf_ir)
        pm, _ = pipeline.build("builtin.module(" + ", ".join(passes) + ")", ctx)
        pm.run(module.operation)
        kernels = []
        for op in module.body.operations:
            if op.operation.name == "gpu.module":
                for f in op.regions[0].blocks[0].operations:
                    a = f.operation.attributes
                    kernels.append(f"{ir.StringAttr(a['sym_name']).value}:{ir.StringAttr(a['kf.strategy']).value}")
        if c.target == "cuda":
            from kf.passes.to_cuda import compile_to_ptx

            return compile_to_ptx(module, chip=c.arch)["kf_kernels"].encode(), kernels
        from kf.passes.to_spirv import compile_spirv

        [binary] = [b for b in compile_spirv(module) if b.name == "kf_kernels"]
        if c.target == "vulkan":
            return binary.binary, kernels
        from kf.passes.to_metal import ToMetalPass

        p = ToMetalPass()
        return "\n".join(p.kernel(binary.binary, binary.kernels[k]).source
                         for k in sorted(binary.kernels)).encode(), kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", action="append", default=[], help="keep configurations whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the configuration names only")
    args = ap.parse_args()
    chosen = [c for c in CONFIGS if not args.k or any(k in c.name for k in args.k)]
    names = [c.name for c in CONFIGS]
    assert len(set(names)) == len(names), "configuration names must be unique"
    if args.list:
        print("\n".join(c.name for c in chosen))
        return 0
    failed = 0
    for c in chosen:
        start = time.perf_counter()
        try:
            data, kernels = compile_config(c)
            line = f"{c.name}  {hashlib.sha256(data).hexdigest()}  {' '.join(kernels)}"
        except Exception as e:  # a configuration that no longer compiles is a line of its own
            failed += 1
            lines = str(e).splitlines() or [""]
            why = next((x.strip() for x in lines if "error" in x.lower()), lines[0])
            line = f"{c.name}  ERROR {type(e).__name__}: {why[:300]}"
        print(line, flush=True)
        print(f"  {c.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
