"""A small GPT trained through kf kernels: layer norm, causal attention and GELU run as kf
programs in the forward and, through kf's derived backwards, in the backward too.

    python examples/train_gpt.py                 # 50 steps, kf beside eager, on the CPU target
    python examples/train_gpt.py --steps 20 --batch 4
    python examples/train_gpt.py --ddp           # 2 gloo processes, DistributedDataParallel

The same model without kf (``use_kf=False``) runs the very same Python functions eagerly,
so the two loss curves differ only by what kf's kernels compute differently (summation
order, float32 rounding). bench/train_gpt.py times it on CUDA.
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch

import kf


@kf.jit
def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    return weight * centered / torch.sqrt(var + eps) + bias


@kf.jit
def causal_attention(q, k, v, mask):
    dim = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / (dim ** 0.5)
    scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@kf.jit
def gelu(x):
    return torch.nn.functional.gelu(x)


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, use_kf: bool):
        super().__init__()
        self.heads = heads
        self.ln1_w = torch.nn.Parameter(torch.ones(width))
        self.ln1_b = torch.nn.Parameter(torch.zeros(width))
        self.ln2_w = torch.nn.Parameter(torch.ones(width))
        self.ln2_b = torch.nn.Parameter(torch.zeros(width))
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)
        self.use_kf = use_kf

    def _f(self, kfn):
        return kfn if self.use_kf else kfn.fn

    def forward(self, x, mask):
        b, t, c = x.shape
        h = self._f(layer_norm)(x, self.ln1_w, self.ln1_b)
        q, k, v = self.qkv(h).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2).contiguous() for z in (q, k, v))
        a = self._f(causal_attention)(q, k, v, mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        h = self._f(layer_norm)(x, self.ln2_w, self.ln2_b)
        return x + self.out(self._f(gelu)(self.fc(h)))


class GPT(torch.nn.Module):
    """Token and position embeddings, pre-norm blocks, a final norm, a tied-free head."""

    def __init__(self, vocab: int = 128, width: int = 256, layers: int = 2, heads: int = 4, seq: int = 128,
                 use_kf: bool = True):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(0.02 * torch.randn(seq, width))
        self.blocks = torch.nn.ModuleList(Block(width, heads, use_kf) for _ in range(layers))
        self.lnf_w = torch.nn.Parameter(torch.ones(width))
        self.lnf_b = torch.nn.Parameter(torch.zeros(width))
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.int64)), persistent=False)
        self.use_kf = use_kf

    def set_kf(self, use_kf: bool) -> "GPT":
        self.use_kf = use_kf
        for blk in self.blocks:
            blk.use_kf = use_kf
        return self

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:t]
        mask = self.mask[:t, :t]
        for blk in self.blocks:
            x = blk(x, mask)
        ln = layer_norm if self.use_kf else layer_norm.fn
        return self.head(ln(x, self.lnf_w, self.lnf_b))


def batches(steps: int, batch: int, seq: int, vocab: int, seed: int = 0, device="cpu"):
    """Sequences of an affine recurrence mod vocab from random starts and strides: easy to
    learn, so the loss falls visibly within 50 steps."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        seqs = (start + stride * torch.arange(seq + 1)) % vocab
        yield seqs[:, :-1].to(device), seqs[:, 1:].to(device)


def train(model: torch.nn.Module, steps: int = 50, batch: int = 2, lr: float = 1e-3, seed: int = 0,
          device="cpu", step_times: list | None = None) -> list[float]:
    """Train with AdamW on the synthetic data; the losses, one per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    vocab, seq = model.head.out_features, model.mask.shape[0]
    losses = []
    for x, y in batches(steps, batch, seq, vocab, seed, device):
        t0 = time.perf_counter()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        if step_times is not None:
            step_times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses


def twin_models(seed: int = 0, **kwargs) -> tuple[GPT, GPT]:
    """The kf model and an eager copy with the same initial weights."""
    torch.manual_seed(seed)
    kf_model = GPT(use_kf=True, **kwargs)
    eager = copy.deepcopy(kf_model).set_kf(False)
    return kf_model, eager


def _digests(tensors: dict) -> dict[str, str]:
    """Each tensor's bytes as a SHA-256: what two ranks compare step by step, to name the
    first step and tensor at which they part."""
    import hashlib

    return {n: hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest() for n, t in tensors.items()}


def ddp_worker(rank: int, world: int, port: int, steps: int, batch: int, result: str) -> None:
    """One rank of data-parallel training with gloo on the loopback interface: the kf model
    and its eager twin, each wrapped in DistributedDataParallel, train on this rank's own
    batches; the per-step losses, the last step's (all-reduced) gradients, the final
    weights and, per step, digests of the gradients and of the weights after the update go
    to ``result % rank`` (torch.save). kf adds nothing for DDP: its ops are
    ordinary autograd nodes, and DDP's gradient hooks fire on the parameters as usual."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        kf_model, eager = twin_models(seed=0)  # the same initial weights on every rank
        out = {}
        for name, model in (("kf", kf_model), ("eager", eager)):
            ddp = DistributedDataParallel(model)
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.0)
            vocab, seq = model.head.out_features, model.mask.shape[0]
            losses, digests = [], []
            for x, y in batches(steps, batch, seq, vocab, seed=1000 + rank):
                loss = torch.nn.functional.cross_entropy(ddp(x).reshape(-1, vocab), y.reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                opt.step()
                losses.append(loss.item())
                digests.append({"grads": _digests(grads), "params": _digests(dict(model.named_parameters()))})
            out[name] = {"losses": losses, "grads": grads, "digests": digests,
                         "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
        torch.save(out, result % rank)
    finally:
        dist.destroy_process_group()


def run_ddp(steps: int = 3, batch: int = 1, world: int = 2) -> list[dict]:
    """Spawn ``world`` gloo processes (ddp_worker) and return each rank's results."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="kf-ddp-") as tmp:
        result = f"{tmp}/rank%d.pt"
        mp.spawn(ddp_worker, args=(world, port, steps, batch, result), nprocs=world, join=True)
        return [torch.load(result % r) for r in range(world)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--ddp", action="store_true", help="2 gloo processes with DistributedDataParallel: "
                                                     "compare kf's gradients with eager's")
    args = p.parse_args()
    if args.ddp:
        ranks = run_ddp(steps=min(args.steps, 5), batch=args.batch)
        for r, res in enumerate(ranks):
            worst = max((res["kf"]["grads"][n] - g).abs().max().item() for n, g in res["eager"]["grads"].items())
            print(f"rank {r}: losses kf {res['kf']['losses']} eager {res['eager']['losses']}; "
                  f"largest gradient difference kf vs eager {worst:.2e}")
        return
    kf_model, eager = twin_models()
    kf_times, eager_times = [], []
    kf_losses = train(kf_model, args.steps, args.batch, step_times=kf_times)
    eager_losses = train(eager, args.steps, args.batch, step_times=eager_times)
    for i in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {i:3d}  kf {kf_losses[i]:.5f}  eager {eager_losses[i]:.5f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(kf_losses, eager_losses))
    steady = slice(min(5, args.steps - 1), None)  # the first steps compile
    print(f"final loss kf {kf_losses[-1]:.5f} eager {eager_losses[-1]:.5f} (ln {math.log(128):.3f} at start); "
          f"largest relative difference {worst:.2e}")
    print(f"median step: kf {1e3 * sorted(kf_times[steady])[len(kf_times[steady]) // 2]:.1f} ms, "
          f"eager {1e3 * sorted(eager_times[steady])[len(eager_times[steady]) // 2]:.1f} ms (CPU target)")


if __name__ == "__main__":
    main()
