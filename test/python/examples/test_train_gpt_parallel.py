"""examples/train_gpt_parallel.py: the kf GPT trained by 2 gloo processes under DDP and
under FSDP2's fully_shard gives, step by step, the losses and in the end the weights of one
process trained on the same global batch."""

import pytest
import torch

import train_gpt_parallel as tp

STEPS, BATCH, WORLD = 3, 1, 2


@pytest.fixture(scope="module")
def one_process():
    return tp.single(STEPS, BATCH, WORLD)


def _k_bias(name: str, p: torch.Tensor) -> slice | None:
    """The key part of a qkv bias: softmax ignores a constant added to every score of a
    row, so its gradient is zero but for rounding, and AdamW scales that rounding noise up
    to a step of ``lr``. It is compared separately, against that bound."""
    if name.endswith("qkv.bias"):
        width = p.numel() // 3
        return slice(width, 2 * width)
    return None


def _check(ranks: list[dict], ref: dict, mode: str) -> None:
    assert len(ranks) == WORLD
    # the ranks saw different batches, and their mean is the one process's loss
    assert ranks[0]["losses"] != ranks[1]["losses"]
    mean = [sum(r["losses"][i] for r in ranks) / WORLD for i in range(STEPS)]
    for i, (a, b) in enumerate(zip(mean, ref["losses"])):
        assert abs(a - b) <= 1e-5 * abs(b), f"{mode} step {i}: mean loss {a} vs one process {b}"
    assert ranks[0]["params"].keys() == ref["params"].keys()
    for r, res in enumerate(ranks):
        for name, want in ref["params"].items():
            got = res["params"][name]
            k = _k_bias(name, want)
            if k is not None:
                assert (got[k] - want[k]).abs().max().item() <= 1e-3 * STEPS, f"{mode} rank {r}: {name} keys"
                got, want = got.clone(), want.clone()
                got[k] = want[k] = 0
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, name=name, r=r: f"{mode} rank {r}: {name}: {m}")


def test_fsdp2_gloo_two_processes_match_one_process(one_process):
    ranks = tp.run("fsdp", STEPS, BATCH, WORLD)
    _check(ranks, one_process, "fsdp")
    # fully_shard's gathered weights are the same on every rank
    for name, p in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], p), name


def test_ddp_gloo_two_processes_match_one_process(one_process):
    _check(tp.run("ddp", STEPS, BATCH, WORLD), one_process, "ddp")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode 'zero'"):
        tp.run("zero")
