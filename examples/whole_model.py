"""What examples/llama.py and examples/gpt2.py run: a model compiled whole with
``torch.compile(backend="kf")`` beside the same model run eagerly.

Both start from the same weights and train with AdamW on the same batches (the affine
sequences of train_gpt.py, easy to learn); each step's losses are printed side by side,
then the largest gradient difference of the first step and ``kf.explain``'s report of
what ran in kf and what fell back.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import kf


def step(model, opt, x, y) -> tuple[float, dict]:
    """One training step: the loss and the parameters' gradients (before the update). The
    model computes its loss (``model(x, y)``), so the compiled graph holds it and kf fuses
    the last linear with the cross-entropy."""
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    module = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the model's own names
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    opt.step()
    return loss.item(), grads


def compare(factory, target: str = "auto", fallback: str = "eager", steps: int = 5, batch: int = 2,
            seq: int = 32, seed: int = 0, dynamic=None) -> dict:
    """Train the kf-compiled model and its eager twin side by side: per-step losses, the
    first step's largest gradient difference, seconds per step."""
    from train_gpt import batches

    torch.manual_seed(seed)
    eager = factory()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="kf", options={"target": target, "fallback": fallback}, dynamic=dynamic)
    out = {"kf": [], "eager": [], "seconds": [], "grad_diff": None}
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)}
    for i, (x, y) in enumerate(batches(steps, batch, seq, eager.cfg.vocab, seed)):
        start = time.perf_counter()
        lk, gk = step(compiled, opts[model], x, y)
        out["seconds"].append(time.perf_counter() - start)
        le, ge = step(eager, opts[eager], x, y)
        out["kf"].append(lk)
        out["eager"].append(le)
        if i == 0:
            out["grad_diff"] = max((gk[n] - ge[n]).abs().max().item() / (ge[n].abs().max().item() + 1e-12)
                                   for n in ge)
    out["compiled"] = compiled
    return out


def main(factory, title: str, argv=None) -> int:
    p = argparse.ArgumentParser(description=title)
    p.add_argument("--target", default="auto", choices=["auto", "cpu", "vulkan", "cuda", "metal"])
    p.add_argument("--fallback", default="inductor", choices=["inductor", "eager"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    args = p.parse_args(argv)
    r = compare(factory, args.target, args.fallback, args.steps, args.batch, args.seq)
    print(f"{title}: torch.compile(backend='kf', options={{'target': {args.target!r}, "
          f"'fallback': {args.fallback!r}}}), batch {args.batch}, seq {args.seq}")
    for i, (a, b) in enumerate(zip(r["kf"], r["eager"])):
        print(f"step {i}: loss kf {a:.6f} eager {b:.6f}  ({r['seconds'][i]:.2f} s)")
    print(f"first step's largest relative gradient difference: {r['grad_diff']:.2e}")
    from train_gpt import batches

    x, _ = next(batches(1, args.batch, args.seq, r["compiled"].cfg.vocab if hasattr(r["compiled"], "cfg") else 128))
    print(kf.explain(r["compiled"], x, backward=True))
    return 0
