"""examples/train_gpt.py's GPT trained over several processes with torch.distributed's own
engines, DistributedDataParallel (``ddp``) and FSDP2's ``fully_shard`` (``fsdp``), beside the
single-process run with the same global batch.

    python examples/train_gpt_parallel.py --mode fsdp        # 2 gloo processes on the CPU
    python examples/train_gpt_parallel.py --mode ddp --steps 10

kf adds nothing for either engine: its programs are ordinary autograd nodes, so DDP's
gradient hooks and FSDP2's unshard/reshard hooks run around them as around any torch op.
Rank ``r`` trains on the batches of seed ``1000 + r``; the single-process reference trains
on all ranks' batches at once, so its loss is the mean of the ranks' losses and its
gradient the ranks' averaged one (each rank's batch has the same size).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import torch

import train_gpt as tg

# NVLink multicast stays off in every process (harmless on the CPU; on GPUs the lent
# machines do not support it).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MODES = ("ddp", "fsdp")
#: how the model runs: kf's programs, the same Python eagerly, or that under torch.compile
IMPLS = ("kf", "eager", "torch.compile")


def global_batches(steps: int, batch: int, world: int, seq: int, vocab: int, device="cpu"):
    """Per step, every rank's batch: rank ``r`` draws from seed ``1000 + r``."""
    streams = [tg.batches(steps, batch, seq, vocab, seed=1000 + r, device=device) for r in range(world)]
    return zip(*streams)


def _model(impl: str, device: str, config: dict) -> tg.GPT:
    """The same initial weights in every process (seed 0)."""
    if impl not in IMPLS:
        raise ValueError(f"impl {impl!r}: one of {IMPLS}")
    torch.manual_seed(0)
    return tg.GPT(use_kf=impl == "kf", **config).to(device)


def _step(model, opt, x, y, vocab: int) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def single(steps: int, batch: int, world: int, impl: str = "kf", device: str = "cpu",
           config: dict | None = None) -> dict:
    """One process trained on the concatenation of the ``world`` ranks' batches: the
    per-step losses and the final weights."""
    config = config or {}
    model = _model(impl, device, config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    run = torch.compile(model) if impl == "torch.compile" else model
    vocab, seq = model.head.out_features, model.mask.shape[0]
    losses, times = [], []
    for parts in global_batches(steps, batch, world, seq, vocab, device):
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        t0 = time.perf_counter()
        loss = _step(run, opt, x, y, vocab)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"losses": losses, "step_s": times,
            "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()}}


def _wrap(model: tg.GPT, mode: str, device: str):
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if device != "cpu" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # the mesh of the model's device: fully_shard's default is the accelerator's (CUDA where
    # a GPU is present), which would move a CPU model's parameters to the GPU
    mesh = init_device_mesh(torch.device(device).type, (torch.distributed.get_world_size(),))
    for blk in model.blocks:  # one unshard/reshard unit per block, the root holds the rest
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value: FSDP2 keeps a shard per rank (a DTensor)."""
    full = getattr(p, "full_tensor", None)
    return (full() if full is not None else p).detach().cpu().clone()


def worker(rank: int, world: int, port: int, mode: str, steps: int, batch: int, impl: str,
           backend: str, config: dict, result: str) -> None:
    """One rank: ``mode``-wrapped training on this rank's batches; its per-step losses
    and step times, and the final (whole) weights go to ``result % rank`` (torch.save)."""
    import torch.distributed as dist

    os.environ.update(MULTICAST_OFF)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = "cuda"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        model = _model(impl, device, config)
        wrapped = _wrap(model, mode, device)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3, weight_decay=0.0)
        if impl == "torch.compile":
            wrapped = torch.compile(wrapped)
        vocab, seq = model.head.out_features, model.mask.shape[0]
        losses, times = [], []
        for parts in global_batches(steps, batch, world, seq, vocab, device):
            x, y = parts[rank]
            t0 = time.perf_counter()
            loss = _step(wrapped, opt, x, y, vocab)
            _sync(device)
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        params = {n: _full(p) for n, p in model.named_parameters()}
        torch.save({"losses": losses, "step_s": times, "params": params}, result % rank)
    finally:
        dist.destroy_process_group()


def run(mode: str, steps: int = 3, batch: int = 1, world: int = 2, impl: str = "kf",
        backend: str = "gloo", config: dict | None = None) -> list[dict]:
    """Spawn ``world`` processes (``worker``) on the loopback interface; each rank's results."""
    import torch.multiprocessing as mp

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    if impl not in IMPLS:
        raise ValueError(f"impl {impl!r}: one of {IMPLS}")
    os.environ.update(MULTICAST_OFF)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix=f"kf-{mode}-") as tmp:
        result = f"{tmp}/rank%d.pt"
        mp.spawn(worker, args=(world, port, mode, steps, batch, impl, backend, config or {}, result),
                 nprocs=world, join=True)
        return [torch.load(result % r) for r in range(world)]


def compare(ranks: list[dict], ref: dict) -> dict:
    """The largest differences of the ranks' mean losses and final weights from ``ref``'s."""
    world = len(ranks)
    mean_losses = [sum(r["losses"][i] for r in ranks) / world for i in range(len(ref["losses"]))]
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(mean_losses, ref["losses"]))
    weight_abs = max((r["params"][n] - p).abs().max().item() for r in ranks for n, p in ref["params"].items())
    return {"mean_losses": mean_losses, "max_rel_loss_diff": loss_rel, "max_abs_weight_diff": weight_abs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="fsdp")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=1, help="per rank")
    args = p.parse_args()
    ranks = run(args.mode, args.steps, args.batch)
    ref = single(args.steps, args.batch, len(ranks))
    c = compare(ranks, ref)
    print(f"{args.mode} over gloo, 2 processes, vs one process with the same global batch:")
    for i, (a, b) in enumerate(zip(c["mean_losses"], ref["losses"])):
        print(f"step {i:3d}  {args.mode} {a:.6f}  single {b:.6f}")
    print(f"largest relative loss difference {c['max_rel_loss_diff']:.2e}, "
          f"largest weight difference {c['max_abs_weight_diff']:.2e}")


if __name__ == "__main__":
    main()
