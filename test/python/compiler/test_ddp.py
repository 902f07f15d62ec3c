"""Data-parallel training with DistributedDataParallel and kf kernels: 2 gloo processes on
the loopback interface give the same gradients with kf as without (examples/train_gpt.py)."""

import torch

import train_gpt as tg


def test_ddp_gloo_two_processes_same_gradients_with_kf():
    ranks = tg.run_ddp(steps=3, batch=1, world=2)
    assert len(ranks) == 2
    for r, res in enumerate(ranks):
        kf_run, eager_run = res["kf"], res["eager"]
        for a, b in zip(kf_run["losses"], eager_run["losses"]):
            assert abs(a - b) <= 1e-4 * abs(b), f"rank {r}: loss kf {a} vs eager {b}"
        assert kf_run["grads"].keys() == eager_run["grads"].keys()
        for name, g in eager_run["grads"].items():
            torch.testing.assert_close(kf_run["grads"][name], g, rtol=1e-4, atol=1e-6, msg=f"rank {r}: {name}")
    # the ranks saw different data...
    assert ranks[0]["kf"]["losses"] != ranks[1]["kf"]["losses"]
    # ...and DDP averaged their gradients: every rank holds the same ones, and the same weights
    for name, g in ranks[0]["kf"]["grads"].items():
        torch.testing.assert_close(ranks[1]["kf"]["grads"][name], g, rtol=0, atol=0, msg=name)


def test_ddp_ranks_end_with_the_same_weights():
    """Every step's all-reduced gradients and updated weights are bit for bit the same on
    both ranks, for kf and for eager; a failure names the first step and tensors that differ
    (gradients first: the all-reduce; weights with equal gradients: the update)."""
    ranks = tg.run_ddp(steps=3, batch=1, world=2)
    for impl in ("kf", "eager"):
        for step, (a, b) in enumerate(zip(ranks[0][impl]["digests"], ranks[1][impl]["digests"])):
            for what in ("grads", "params"):
                differ = [n for n, h in a[what].items() if b[what][n] != h]
                assert not differ, f"{impl}: after step {step} the ranks' {what} differ: {differ}"
        for name, p in ranks[0][impl]["params"].items():
            torch.testing.assert_close(ranks[1][impl]["params"][name], p, rtol=0, atol=0,
                                       msg=lambda m, name=name: f"{impl}: {name}: {m}")
