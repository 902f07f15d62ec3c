"""kf.rand's definition (kf/dialects/philox.py): Philox4x32-10 against Random123's known
answers, and the torch implementation the interpreter runs against the reference."""

import math

import pytest
import torch

from kf.dialects import philox
from kf.random_state import samples

# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key, result)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,want", KNOWN_ANSWERS)
def test_known_answers(counter, key, want):
    assert philox.philox4x32(counter, key) == want


def test_block_layout():
    # the counter is in the low two words, the key is the seed's two halves
    seed, counter = -5, (1 << 32) + 1
    s = seed & ((1 << 64) - 1)
    assert philox.block(seed, counter) == philox.philox4x32((1, 1, 0, 0), (s & 0xFFFFFFFF, s >> 32))


def test_elements_of_a_block():
    # four uniform samples a block (its words in order), two normal ones (a pair each)
    words = philox.block(9, 100 + 2)
    assert [philox.sample(9, 100, 8 + k) for k in range(4)] == [philox.unit(w) for w in words]
    u1, u2 = philox.unit(words[2], plus_one=True), philox.unit(words[3])
    assert philox.sample(9, 100, 5, "normal") == math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    assert philox.blocks(9, "uniform") == 3 and philox.blocks(9, "normal") == 5 and philox.blocks(0, "uniform") == 0


@pytest.mark.parametrize("seed,offset", [(0, 0), (12345, 7), (-1, (1 << 32) - 3), (2 ** 63 - 1, 2 ** 63 - 2),
                                         (-(2 ** 63), -2)])
@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_torch_samples_follow_the_reference(seed, offset, distribution):
    # counters cross 2^32 (a carry into the second word) and wrap past 2^64
    state = torch.tensor([seed, offset], dtype=torch.int64)
    got = samples(state, 2, (3, 5), distribution)
    assert got.dtype == torch.float32 and got.shape == (3, 5)
    want = [philox.sample(seed, offset + 2, i, distribution) for i in range(15)]
    want = torch.tensor(want, dtype=torch.float64).reshape(3, 5)
    if distribution == "uniform":
        assert torch.equal(got, want.float())  # 24-bit values times 2^-24: exact
        assert (got >= 0).all() and (got < 1).all()
    else:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_uniform_grid():
    # the smallest and largest words map to 0 and 1 - 2^-24
    assert philox.unit(0) == 0.0 and philox.unit(0xFFFFFFFF) == 1 - 2 ** -24
    assert philox.unit(0xFFFFFFFF, plus_one=True) == 1.0  # Box-Muller's log argument: never 0
