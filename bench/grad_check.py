"""The GPT example's kf functions, forward and backward, against torch on one target:
per input, the relative error of the gradient (and of the output) at the model's shapes.

    python3 bench/grad_check.py --target vulkan
    python3 bench/grad_check.py --target cuda     # on the GPU machine

A wrong gradient shows in bench/train_gpt.py only as kf's losses drifting from eager's
over the steps while the first step's loss agrees; this names the function, and the
input, whose gradient differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_gpt as tg  # noqa: E402


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="vulkan")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    dev = "cuda" if args.target == "cuda" else "cpu"
    torch.manual_seed(0)
    b, t, c, h = args.batch, 128, 256, 4
    mask = torch.tril(torch.ones(t, t, dtype=torch.int64, device=dev))
    cases = [
        ("layer_norm", tg.layer_norm, lambda: (torch.randn(b, t, c), 1 + 0.1 * torch.randn(c), 0.1 * torch.randn(c))),
        ("causal_attention", tg.causal_attention,
         lambda: tuple(torch.randn(b, h, t, c // h) for _ in range(3)) + (mask,)),
        ("gelu", tg.gelu, lambda: (torch.randn(b, t, 4 * c),)),
    ]
    worst = 0.0
    for name, f, make in cases:
        kf_f = f.with_options(target=args.target)
        xs = [x.to(dev) for x in make()]
        ins = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
        ref_ins = [x.clone().double().requires_grad_(True) if x.is_floating_point() else x for x in xs]
        out = kf_f(*ins)
        ref = f.fn(*ref_ins)
        g = torch.randn_like(ref)
        out.backward(g.to(out.dtype))
        ref.backward(g)
        errs = {"out": rel(out.detach(), ref.detach())}
        for i, (a, r) in enumerate(zip(ins, ref_ins)):
            if a.is_floating_point():
                errs[f"grad{i}"] = rel(a.grad, r.grad)
        worst = max(worst, *errs.values())
        print(f"{name:<18}" + "  ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)
    # How many kernels the attention's derived backward launches (kf.inspect of it).
    import kf
    from kf import autograd

    q, k, v, m = cases[1][2]()
    q, k, v, m = (t.to(dev) for t in (q, k, v, m))
    bwd = autograd.backward_of(tg.causal_attention.with_options(target=args.target), q, k, v, m)
    fused = kf.inspect(bwd.fn, q, k, v, m, torch.randn_like(q)).fused
    print("attention backward kernels:", fused.count("kf.kernel = "))

    # The whole model, one step: every parameter's gradient, kf against the eager twin.
    kf_model, eager = tg.twin_models(seed=0)
    kf_model.to(dev)
    eager.to(dev)
    x, y = next(tg.batches(1, args.batch, 128, 128, 0, dev))
    for m in (kf_model, eager):
        logits = m(x) if m is eager else _with_target(m, args.target)(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, 128), y.reshape(-1)).backward()
    bad = []
    for (n, a), (_, r) in zip(kf_model.named_parameters(), eager.named_parameters()):
        e = rel(a.grad, r.grad)
        worst = max(worst, e)
        if e > 1e-4:
            bad.append(f"{n} {e:.2e}")
    print("model gradients off by more than 1e-4:", ", ".join(bad) or "none")
    print(f"worst {worst:.2e}")
    return 0 if worst < 1e-4 else 1


def _with_target(model, target: str):
    """The model with its kf functions compiled for target (the example's use the device's)."""
    if target not in ("vulkan",):
        return model
    saved = (tg.layer_norm, tg.causal_attention, tg.gelu)
    tg.layer_norm, tg.causal_attention, tg.gelu = (f.with_options(target=target) for f in saved)

    def run(x):
        try:
            return model(x)
        finally:
            tg.layer_norm, tg.causal_attention, tg.gelu = saved

    return run


if __name__ == "__main__":
    sys.exit(main())
