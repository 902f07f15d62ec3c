"""Training speed and memory: forward+backward of kf functions against torch, in one process.

    python3 bench/training.py                      # the H200 rows, bench/results/training-<date>-<commit>.json
    python3 bench/training.py --only layer_norm    # rows whose name contains a text
    python3 bench/training.py --dry-run            # the correctness checks alone, small shapes, CPU target

Each row times one training computation (forward, then backward from a fixed output
gradient) four ways: kf (the function as a kf program; its backward is kf's derived
one), torch's own kernel where it has one (``F.scaled_dot_product_attention``,
``F.layer_norm``, ``F.rms_norm``, ``torch.softmax``), the same Python function run
eagerly, and that function under ``torch.compile``. Rows: attention (head dims 64 and
128, seq 2048 and 4096, a causal mask tensor against SDPA's ``is_causal``), layer norm,
RMSNorm, softmax and bias+GELU, a GPT-2-small training step (12 layers, width 768, 12
heads, seq 1024, batch 8, bf16, AdamW) and a Llama-shaped block's training step. The step
rows time kf twice: its norm, attention and activation functions beside torch's loss over
the materialized logits (``kf``), and the same with the last linear and the cross-entropy
fused in chunks by ``kf.nn.fused_linear_cross_entropy`` (``kf, fused loss``), as a user
of kf would write the loss.

Before a row is timed, every way's gradients (and the step rows' loss) are measured
against a float64 run of the same function on the same inputs: a way whose relative
error exceeds the dtype's tolerance and twice eager's is reported WRONG and not timed.
Beside each time the row records its peak memory (``torch.cuda.max_memory_allocated``
over the timed calls, less what was allocated before them: the activations and
gradients the computation itself holds), since people on limited hardware choose by
memory as much as by speed.

``--dry-run`` runs the correctness part on the CPU target at small shapes (no timing, no
torch.compile, no CUDA needed): what can be checked of this script without a GPU.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

import kf  # noqa: E402
import run_name  # noqa: E402  (bench/, the script's folder)

#: relative error of gradients a dtype allows against float64 (max |a - b| / max |b|)
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4, torch.float64: 1e-10}


# ----------------------------------------------------------------------------- the functions


def attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)


def rms_norm(x, weight):
    return F.rms_norm(x, x.shape[-1:], weight, 1e-6)


def softmax(x):
    return torch.softmax(x, dim=-1)


def bias_gelu(x, bias):
    return F.gelu(x + bias)


def swiglu(gate, up):
    return F.silu(gate) * up


def sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_causal(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def torch_layer_norm(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)


KF = {f.__name__: kf.jit(f) for f in (attention, layer_norm, rms_norm, softmax, bias_gelu, swiglu)}


# ----------------------------------------------------------------------------- rows


@dataclass
class Row:
    name: str
    make: Callable[[], list[torch.Tensor]]  # the inputs (requires_grad where differentiated)
    ways: dict[str, Callable]  # way -> function of the inputs (kf, torch, eager, torch.compile)
    reference: Callable  # the function in float64 (the eager function)
    step: bool = False  # a training step: ways are models, make gives (model inputs)
    results: dict = field(default_factory=dict)


def _op_rows(device: str, small: bool) -> list[Row]:
    dt = torch.bfloat16 if device == "cuda" else torch.float32

    def tensors(*shapes, grad=True):
        def make():
            return [torch.randn(*s, device=device, dtype=dt).requires_grad_(grad) for s in shapes]
        return make

    def ways(name: str, fn: Callable, torch_fn: Callable | None) -> dict:
        out = {"kf": KF[name]}
        if torch_fn is not None:
            out["torch"] = torch_fn
        out["eager"] = fn
        if device == "cuda":
            out["torch.compile"] = torch.compile(fn)
        return out

    rows = []
    att = [(4, 32, 2048, 128), (2, 32, 4096, 128), (4, 32, 2048, 64), (2, 32, 4096, 64)]
    if small:
        att = [(1, 2, 67, 32), (1, 3, 33, 16)]
    for b, h, s, d in att:
        rows.append(Row(f"attention {b}x{h}x{s}x{d}", tensors(*[(b, h, s, d)] * 3),
                        ways("attention", attention, sdpa), attention))
    b, h, s, d = att[0]

    def causal():
        q, k, v = tensors(*[(b, h, s, d)] * 3)()
        return [q, k, v, torch.tril(torch.ones(s, s, device=device, dtype=torch.int64))]
    rows.append(Row(f"attention {b}x{h}x{s}x{d} causal mask tensor", causal,
                    ways("attention", attention, sdpa_causal), attention))
    norms = [(32768, 8192), (8192, 4096)] if not small else [(257, 96), (1, 33)]
    for m, n in norms:
        rows.append(Row(f"layer norm {m}x{n}", tensors((m, n), (n,), (n,)),
                        ways("layer_norm", layer_norm, torch_layer_norm), layer_norm))
    for m, n in norms[:1]:
        rows.append(Row(f"RMSNorm {m}x{n}", tensors((m, n), (n,)),
                        ways("rms_norm", rms_norm, lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6)), rms_norm))
        rows.append(Row(f"softmax {m}x{n}", tensors((m, n)),
                        ways("softmax", softmax, lambda x: torch.softmax(x, -1)), softmax))
        rows.append(Row(f"bias+GELU {m}x{n}", tensors((m, n), (n,)), ways("bias_gelu", bias_gelu, None), bias_gelu))
        rows.append(Row(f"SwiGLU {m}x{n}", tensors((m, n), (m, n)), ways("swiglu", swiglu, None), swiglu))
    return rows


# ----------------------------------------------------------------------------- models


class Block(torch.nn.Module):
    """A pre-norm transformer block: GPT-2's (layer norm, GELU MLP) or Llama's (RMSNorm,
    SwiGLU MLP), its norm, attention and activation from ``fns``."""

    def __init__(self, width: int, heads: int, llama: bool):
        super().__init__()
        self.heads, self.llama = heads, llama
        hidden = (8 * width // 3 + 127) // 128 * 128 if llama else 4 * width
        self.n1 = torch.nn.Parameter(torch.ones(width))
        self.n2 = torch.nn.Parameter(torch.ones(width))
        if not llama:
            self.b1 = torch.nn.Parameter(torch.zeros(width))
            self.b2 = torch.nn.Parameter(torch.zeros(width))
        self.qkv = torch.nn.Linear(width, 3 * width, bias=not llama)
        self.proj = torch.nn.Linear(width, width, bias=not llama)
        self.up = torch.nn.Linear(width, (2 if llama else 1) * hidden, bias=not llama)
        self.down = torch.nn.Linear(hidden, width, bias=not llama)

    def forward(self, x, mask, fns):
        b, t, c = x.shape
        h = fns["rms_norm"](x, self.n1) if self.llama else fns["layer_norm"](x, self.n1, self.b1)
        q, k, v = self.qkv(h).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2).contiguous() for z in (q, k, v))
        a = fns["attention"](q, k, v, mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        h = fns["rms_norm"](x, self.n2) if self.llama else fns["layer_norm"](x, self.n2, self.b2)
        if self.llama:
            gate, up = self.up(h).chunk(2, dim=-1)
            return x + self.down(fns["swiglu"](gate.contiguous(), up.contiguous()))
        return x + self.down(fns["gelu"](self.up(h)))


class Model(torch.nn.Module):
    def __init__(self, layers: int, width: int, heads: int, seq: int, vocab: int, llama: bool, way: str):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(0.02 * torch.randn(seq, width))
        self.blocks = torch.nn.ModuleList(Block(width, heads, llama) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.int64)), persistent=False)
        self.way = way

    def fns(self) -> dict:
        if self.way.startswith("kf"):
            return {**KF, "gelu": _KF_GELU}
        return {"attention": attention, "layer_norm": layer_norm, "rms_norm": rms_norm, "swiglu": swiglu,
                "gelu": _gelu}

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        fns = self.fns()
        for blk in self.blocks:
            x = blk(x, self.mask, fns)
        if self.way == "kf, fused loss":
            # the last linear and the cross-entropy in chunks: no tokens x vocab logits
            return kf.nn.fused_linear_cross_entropy(x, self.head.weight, targets, loss_dtype=torch.float32)
        logits = self.head(x)
        if logits.dtype != torch.float64:
            logits = logits.float()  # the loss in f32 at least (f64 for the reference)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _gelu(x):
    return F.gelu(x)


_KF_GELU = kf.jit(_gelu)


def _step_rows(device: str, small: bool) -> list[Row]:
    gpt = dict(layers=12, width=768, heads=12, seq=1024, vocab=50304, llama=False, batch=8)
    llama = dict(layers=1, width=2048, heads=16, seq=2048, vocab=32000, llama=True, batch=4)
    if small:
        gpt = dict(layers=2, width=64, heads=4, seq=32, vocab=97, llama=False, batch=2)
        llama = dict(layers=1, width=64, heads=2, seq=33, vocab=97, llama=True, batch=1)
    rows = []
    for name, cfg in (("GPT-2-small training step", gpt), ("Llama-shaped block training step", llama)):
        rows.append(_step_row(name, cfg, device))
    return rows


def _step_row(name: str, cfg: dict, device: str) -> Row:
    cfg = dict(cfg)
    batch = cfg.pop("batch")
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    base = Model(**cfg, way="eager")

    def model(way: str, dtype=dt) -> Model:
        m = copy.deepcopy(base).to(device=device, dtype=dtype)
        m.way = way
        return m

    def make():
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, cfg["vocab"], (batch, cfg["seq"] + 1), generator=g).to(device)
        return [idx[:, :-1], idx[:, 1:]]

    ways = {"kf": model("kf"), "kf, fused loss": model("kf, fused loss"), "eager": model("eager")}
    if device == "cuda":
        ways["torch.compile"] = torch.compile(model("eager"))
    return Row(f"{name} ({'x'.join(str(cfg[k]) for k in ('layers', 'width', 'heads', 'seq'))}, batch {batch})",
               make, ways, model("eager", torch.float64), step=True)


# ----------------------------------------------------------------------------- checking and timing


def _grads_of(fn: Callable, args: list[torch.Tensor], grad: torch.Tensor | None) -> tuple[torch.Tensor, list]:
    wrt = [a for a in args if a.requires_grad]
    out = fn(*args)
    gs = torch.autograd.grad(out, wrt, grad if grad is not None else None)
    return out.detach(), list(gs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return (a.double() - b).abs().max().item() / (scale if scale > 0 else 1.0)


def check(row: Row) -> dict[str, float]:
    """Each way's largest relative error (outputs and gradients) against float64."""
    errors = {}
    if row.step:
        inputs = row.make()
        ref = row.reference
        ref_loss = ref(*inputs)
        ref_grads = torch.autograd.grad(ref_loss, list(ref.parameters()))
        for way, m in row.ways.items():
            try:
                loss = m(*inputs)
                grads = torch.autograd.grad(loss, list(m.parameters()))
            except Exception as e:  # a way that fails is reported and not timed; the other rows still run
                print(f"{row.name}: {way} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                      file=sys.stderr, flush=True)
                errors[way] = float("inf")
                continue
            errs = [abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())]
            errs += [_rel(g, r) for g, r in zip(grads, ref_grads)]
            errors[way] = max(errs)
        return errors
    torch.manual_seed(0)
    inputs = row.make()
    ref_in = [a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in inputs]
    ref_out = row.reference(*ref_in)
    grad = torch.randn_like(ref_out)
    _, ref_grads = _grads_of(row.reference, ref_in, grad)
    for way, fn in row.ways.items():
        args = [a.detach().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in inputs]
        out, grads = _grads_of(fn, args, grad.to(inputs[0].dtype))
        errors[way] = max([_rel(out, ref_out.detach())] + [_rel(g, r) for g, r in zip(grads, ref_grads)])
    return errors


def verdicts(errors: dict[str, float], dtype: torch.dtype) -> dict[str, bool]:
    """A way is right when within the dtype's tolerance of float64 or no worse than twice
    eager's error (what the dtype itself costs the same function)."""
    eager = errors.get("eager", 0.0)
    return {way: e <= max(TOLERANCE[dtype], 2 * eager) for way, e in errors.items()}


def time_row(row: Row, reps: int, skip: frozenset = frozenset()) -> dict[str, dict]:
    """Median ms of forward+backward (a step: forward, backward, AdamW) and the peak
    memory over the timed calls, less what was allocated before them, per way; the ways
    in ``skip`` (wrong against float64, or failed) are not timed."""
    out = {}
    for way, fn in row.ways.items():
        if way in skip:
            continue
        inputs = row.make()
        if row.step:
            opt = torch.optim.AdamW(fn.parameters(), lr=1e-4)

            def call():
                loss = fn(*inputs)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        else:
            grad = torch.randn_like(fn(*inputs)).detach()

            def call():
                for a in inputs:
                    a.grad = None
                fn(*inputs).backward(grad)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        peak = torch.cuda.max_memory_allocated() - base
        out[way] = {"ms": statistics.median(times), "peak_mb": peak / 2**20}
        del inputs
        torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the correctness checks alone, small shapes, CPU target")
    p.add_argument("--only", default="", help="comma-separated texts: the rows whose name contains one")
    p.add_argument("--reps", type=int, default=20)
    run_name.add_arguments(p)
    args = p.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print("bench/training.py times CUDA kernels and needs a CUDA device; without one, "
              "--dry-run runs its correctness checks on the CPU target", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    out = None if args.dry_run else run_name.output_path(args, "training")
    rows = _op_rows(device, args.dry_run) + _step_rows(device, args.dry_run)
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
        rows = [r for r in rows if any(w in r.name.lower() for w in wanted)]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    failed = 0
    report = []
    for row in rows:
        errors = check(row)
        ok = verdicts(errors, dtype)
        failed += sum(1 for w, good in ok.items() if not good and w == "kf")
        row.results = {way: {"rel_err_vs_f64": errors[way], "right": ok[way]} for way in row.ways}
        if not args.dry_run:
            timed = time_row(row, args.reps, frozenset(w for w, good in ok.items() if not good))
            for way, r in timed.items():  # right ways only: the others were skipped
                row.results[way].update(r)
        line = f"{row.name:<58}"
        for way, r in row.results.items():
            if "ms" in r:
                line += f" {way} {r['ms']:.2f} ms {r['peak_mb']:.0f} MB;"
            else:
                line += f" {way} err {r['rel_err_vs_f64']:.1e}{'' if r['right'] else ' WRONG'};"
        print(line, flush=True)
        report.append({"row": row.name, "results": row.results})
        if out is not None:
            run_name.write_json(out, {"device": torch.cuda.get_device_name(), "dtype": str(dtype), "rows": report})
    if failed:
        print(f"{failed} row(s) where kf's gradients are WRONG against float64", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
