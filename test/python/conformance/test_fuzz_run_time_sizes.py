"""Seeded fuzz tests of run-time sizes: a function from the families a model's code is made
of (reductions over the length and over everything, matmuls, transposes, concatenations,
slices, gathers, masks, scans, norms, losses, a router's top-k, integer arithmetic), called
under automatic dynamic (the default) over a sequence of lengths that takes 1, 2, primes,
multiples of 16 and 257 in a generated order, on ``cpu`` and ``vulkan``. Every call's
result must be torch's, whichever program serves it: the first length's, the one with the
length dynamic, a size 1's, or a static one where a function cannot take run-time sizes.

Examples are derandomized; ``KF_FUZZ_EXAMPLES`` and ``KF_FUZZ_RANDOM=1`` as in
test_fuzz.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import kf
from fuzzing import FUZZ, TARGETS

_W = torch.randn(24, 24, generator=torch.Generator().manual_seed(0))
_E = torch.randn(50, 24, generator=torch.Generator().manual_seed(1))

#: name -> (function, inputs at length n)
FAMILIES = {
    "softmax over the length": (lambda x: torch.softmax(x, 1), lambda n: (torch.randn(2, n, 24),)),
    "sum over the length": (lambda x: x.sum(1), lambda n: (torch.randn(2, n, 24),)),
    "mean of everything": (lambda x: (x - 1).pow(2).mean(), lambda n: (torch.randn(2, n, 24),)),
    "max over the length": (lambda x: x.max(1).values, lambda n: (torch.randn(2, n, 24),)),
    "variance of rows": (lambda x: x.var(-1), lambda n: (torch.randn(2, n, 24),)),
    "matmul": (lambda x: x @ _W, lambda n: (torch.randn(2, n, 24),)),
    "matmul over the length": (lambda x, y: x.transpose(1, 2) @ y, lambda n: (torch.randn(2, n, 24),
                                                                             torch.randn(2, n, 8))),
    "scores": (lambda q, k: q @ k.transpose(-1, -2), lambda n: (torch.randn(2, n, 16), torch.randn(2, n, 16))),
    "transpose": (lambda x: x.transpose(0, 1).contiguous() * 2, lambda n: (torch.randn(3, n, 24),)),
    "concatenation": (lambda x, y: torch.cat([x, y], 1) + 1, lambda n: (torch.randn(2, n, 24),
                                                                       torch.randn(2, 3, 24))),
    "slices": (lambda x: x[:, 2:-1] * 3 - x[:, 1:-2], lambda n: (torch.randn(2, n + 3, 24),)),
    "embedding": (lambda ids: _E[ids].sum(1), lambda n: (torch.randint(0, 50, (3, n)),)),
    "mask": (lambda x, m: torch.where(m, x, 0.0).sum(1), lambda n: (torch.randn(2, n, 24),
                                                                   torch.rand(2, n, 1) > 0.5)),
    "cumulative sum": (lambda x: x.cumsum(1), lambda n: (torch.randn(2, n, 8),)),
    "layer norm": (lambda x: F.layer_norm(x, (24,)), lambda n: (torch.randn(2, n, 24),)),
    "rms norm": (lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), lambda n: (torch.randn(n, 24),)),
    "cross entropy": (lambda x, y: F.cross_entropy(x, y), lambda n: (torch.randn(n, 24), torch.randint(0, 24, (n,)))),
    "next-token loss": (lambda x, y: F.cross_entropy(x[:, :-1].reshape(-1, 24), y[:, 1:].reshape(-1)),
                        lambda n: (torch.randn(2, n + 1, 24), torch.randint(0, 24, (2, n + 1)))),
    "positions": (lambda x: x + torch.arange(x.shape[1]).float()[None, :, None], lambda n: (torch.randn(2, n, 4),)),
    "causal mask": (lambda s: s.masked_fill(torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).triu(1),
                                            float("-inf")).softmax(-1), lambda n: (torch.randn(2, n, n),)),
    "strided input": (lambda x: x * 2 + 1, lambda n: (torch.randn(24, n).t(),)),
    "merged dims": (lambda x: x.reshape(-1, 24).sum(0), lambda n: (torch.randn(2, n, 24),)),
    "integer arithmetic": (lambda t: (t * 7 + 3) // 4 % 5, lambda n: (torch.randint(-50, 50, (3, n)),)),
    "argmax": (lambda x: x.argmax(1), lambda n: (torch.randn(2, n, 5),)),
    "router top-k": (lambda x: x.softmax(-1).topk(2, -1).values, lambda n: (torch.randn(n, 16),)),
    "norm": (lambda x: torch.linalg.vector_norm(x, dim=1), lambda n: (torch.randn(2, n, 4),)),
    "broadcast": (lambda x, b: x + b, lambda n: (torch.randn(n, 1, 8), torch.randn(1, 5, 8))),
}
LENGTHS = st.lists(st.sampled_from([1, 2, 5, 16, 17, 31, 64, 257, 300]), min_size=3, max_size=5)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(family=st.sampled_from(sorted(FAMILIES)), lengths=LENGTHS, seed=st.integers(0, 2**16))
def test_every_length_is_torchs(target, family, lengths, seed):
    fn, make = FAMILIES[family]
    f = kf.jit(fn, target=target)
    torch.manual_seed(seed)
    for n in lengths:
        args = make(n)
        want = fn(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the recompile limit's warning: results still count
            got = f(*args)
        assert got.shape == want.shape and got.dtype == want.dtype, (family, n, got.shape, want.shape)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, equal_nan=True,
                                   msg=lambda m: f"{family} at length {n} of {lengths}: {m}")
