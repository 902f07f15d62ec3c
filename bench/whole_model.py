"""Whole models three ways: eager, ``torch.compile`` (Inductor) and
``torch.compile(backend="kf")``, on the Llama-style and GPT-2-style decoders of examples/
and, where ``transformers`` imports, ``LlamaForCausalLM`` built from a config (random
weights, no download).

    python3 bench/whole_model.py                                   # H200 sizes: 8 layers, width 2048, bf16
    python3 bench/whole_model.py --device cpu --layers 1 --width 64 --seqs 32,48 --steps 2   # a smoke run

For each model and way: the forward's and the training step's median time at the first
sequence length, the first call's seconds (compile time), the largest difference of the
outputs and gradients from eager, and the Dynamo compiles and kf region compiles while the
sequence length runs over ``--seqs`` (320..2048 by default): for each new length, its
training step's seconds and the kf programs it made (regions' and kf functions').

The loss path: a forward and backward of the model's own cross-entropy loss
(``model(x, targets)``; ``labels=`` for transformers' model, which also returns its logits,
so nothing fuses there), its median time, its loss beside eager's, and on CUDA the peak
memory it allocates above what the model holds (``torch.cuda.max_memory_allocated``). For
kf this is measured twice: with the last linear and the cross-entropy fused
(``loss="chunked"``, the default: no tokens x vocab logits) and with them apart
(``loss="logits"``). Results go to
bench/results/whole-model-<date>-<commit>.json (run_name.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import gpt2  # noqa: E402
import llama  # noqa: E402
import run_name  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: str, repeat: int) -> float:
    fn()  # a first call compiles what it runs (the inference graph of a no_grad forward)
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


def _loss(model, x, y):
    """The model's own cross-entropy loss of predicting y from x."""
    out = model(input_ids=x, labels=y) if hasattr(getattr(model, "_orig_mod", model), "generation_config") \
        else model(x, y)
    return out.loss if hasattr(out, "loss") else out


def loss_path(model, x, y, device: str, repeat: int) -> dict:
    """The loss's forward and backward: median ms, the loss, and on CUDA the peak memory
    it allocates above what is allocated before it (MiB)."""
    def run():
        loss = _loss(model, x, y)
        loss.backward()
        return loss

    loss = run()  # compiles
    model.zero_grad(set_to_none=True)
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = run()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        model.zero_grad(set_to_none=True)
    ms = _timed(lambda: (run(), model.zero_grad(set_to_none=True)), device, repeat)
    return {"loss": loss.item(), "loss_ms": ms, "loss_peak_mib": peak}


def models(args) -> dict:
    out = {
        "llama": lambda: llama.Llama(llama.LlamaConfig(vocab=args.vocab, width=args.width, layers=args.layers,
                                                       heads=args.heads, kv_heads=max(1, args.heads // 4),
                                                       hidden=args.width * 8 // 3 // 16 * 16 or 16,
                                                       max_seq=max(args.seqs))),
        "gpt2": lambda: gpt2.GPT2(gpt2.GPT2Config(vocab=args.vocab, width=args.width, layers=args.layers,
                                                  heads=args.heads, max_seq=max(args.seqs))),
    }
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.width * 8 // 3 // 16 * 16,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=max(1, args.heads // 4), max_position_embeddings=max(args.seqs))
        cfg._attn_implementation = "sdpa"
        out["hf-llama"] = lambda: LlamaForCausalLM(cfg)
    except ImportError:
        pass
    return out


@contextlib.contextmanager
def _kf_programs(seen: dict):
    """Counts the kf programs made inside it (compiled, or loaded from kf's disk cache):
    those of the backend's regions and those of kf functions (the attention ops).
    ``seen``: each region's programs so far (by its record), kept from call to call; a
    region first met here has made none before (its graph is new)."""
    import logging

    from kf.backend import report

    made = [0]

    class Made(logging.Handler):
        def emit(self, record):
            made[0] += record.getMessage().startswith(("compiled ", "loaded "))

    logger, handler = logging.getLogger("kf.compile"), Made()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    counted = [0]
    with report.collect() as ran:
        yield lambda: counted[0]
    regions = {id(r): r for g in ran for r in g.regions}
    counted[0] = made[0] + sum(r.compiles - seen.get(key, 0) for key, r in regions.items())
    seen.update({key: r.compiles for key, r in regions.items()})
    logger.removeHandler(handler)
    logger.setLevel(level)


def run_one(make, way: str, args, dtype) -> dict:
    torch.manual_seed(0)
    ref = make().to(args.device, dtype)
    model = copy.deepcopy(ref)
    if way == "inductor":
        model = torch.compile(model)
    elif way == "kf":
        model = torch.compile(model, backend="kf", options={"target": args.target, "fallback": args.fallback})
    torch._dynamo.utils.counters.clear()
    seq = args.seqs[0]
    x = torch.randint(0, args.vocab, (args.batch, seq), device=args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def fwd():
        with torch.no_grad():
            return _logits(model(x))

    def step():
        loss = _logits(model(x)).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    out = _logits(model(x))
    out.float().square().mean().backward()
    _sync(args.device)
    first = time.perf_counter() - t0
    want = _logits(ref(x))
    want.float().square().mean().backward()
    module = getattr(model, "_orig_mod", model)
    grad_diff = max(((p.grad - q.grad).abs().max() / (q.grad.abs().max() + 1e-12)).item()
                    for p, q in zip(module.parameters(), ref.parameters()) if q.grad is not None)
    result = {"first_call_s": first, "out_diff": ((out - want).abs().max() / want.abs().max()).item(),
              "grad_rel_diff": grad_diff}
    # the loss path first: the timed training steps below change the weights
    y = torch.randint(0, args.vocab, (args.batch, seq), device=args.device)
    result.update(loss_path(model, x, y, args.device, args.repeat))
    result["loss_diff"] = abs(result["loss"] - _loss(ref, x, y).item())
    if way == "kf":
        apart = torch.compile(copy.deepcopy(ref), backend="kf",
                              options={"target": args.target, "fallback": args.fallback, "loss": "logits"})
        result.update({f"{k}_logits": v for k, v in loss_path(apart, x, y, args.device, args.repeat).items()})
        del apart
    result.update(forward_ms=_timed(fwd, args.device, args.repeat), step_ms=_timed(step, args.device, args.repeat))
    before = dict(torch._dynamo.utils.counters["stats"])
    t0 = time.perf_counter()
    result["seq_sweep"] = []
    seen: dict = {}
    for s in args.seqs[1:]:
        xs = torch.randint(0, args.vocab, (args.batch, s), device=args.device)
        t1 = time.perf_counter()
        with _kf_programs(seen) as programs:
            _logits(model(xs)).float().square().mean().backward()
            _sync(args.device)
        result["seq_sweep"].append({"seq": s, "seconds": time.perf_counter() - t1, "kf_programs": programs()})
    stats = dict(torch._dynamo.utils.counters["stats"])
    result["seq_sweep_s"] = time.perf_counter() - t0
    result["dynamo_unique_graphs"] = stats.get("unique_graphs", 0)
    result["dynamo_graphs_before_sweep"] = before.get("unique_graphs", 0)
    if way == "kf":
        import kf

        report = kf.explain(model, x, backward=True)
        result["kf_regions"] = len(report.regions)
        result["kf_kernels"] = len(report.kernels)
        result["kf_fallbacks"] = [str(f) for f in report.fallbacks]
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--target", default="auto")
    p.add_argument("--fallback", default="inductor", choices=["inductor", "eager"])
    p.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 elsewhere")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqs", default="2048,320,512,1024,1536")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--steps", type=int, default=None, help="alias of --repeat")
    p.add_argument("--only", default="", help="comma-separated model names")
    p.add_argument("--ways", default="eager,inductor,kf")
    run_name.add_arguments(p)
    args = p.parse_args(argv)
    out = run_name.output_path(args, "whole-model")
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.repeat = args.steps or args.repeat
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    results = {"args": {k: v for k, v in vars(args).items()}, "models": {}}
    for name, make in models(args).items():
        if args.only and name not in args.only.split(","):
            continue
        results["models"][name] = {}
        for way in args.ways.split(","):
            torch._dynamo.reset()
            r = run_one(make, way, args, dtype)
            results["models"][name][way] = r
            run_name.write_json(out, results)
            print(f"{name:9s} {way:9s} forward {r['forward_ms']:8.2f} ms  step {r['step_ms']:8.2f} ms  "
                  f"first call {r['first_call_s']:6.1f} s  out diff {r['out_diff']:.1e}  grad diff "
                  f"{r['grad_rel_diff']:.1e}  graphs {r['dynamo_unique_graphs']}", flush=True)
            mib = (lambda v: "-" if v is None else f"{v:.0f} MiB")
            line = f"{'':9s} {'':9s} loss path {r['loss_ms']:8.2f} ms  peak {mib(r['loss_peak_mib'])}"
            if "loss_ms_logits" in r:
                line += (f"  (logits apart: {r['loss_ms_logits']:.2f} ms, peak {mib(r['loss_peak_mib_logits'])})")
            print(line + f"  loss diff {r['loss_diff']:.1e}", flush=True)
            print(f"{'':9s} {'':9s} new lengths  " + "  ".join(
                f"{p['seq']}: {p['seconds']:.2f} s, {p['kf_programs']} kf programs" for p in r["seq_sweep"]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
