"""What ``kf.rand`` computes: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
easy as 1, 2, 3", SC'11; Random123), the counter-based generator torch's CUDA kernels and
Triton's ``tl.rand`` use, and the bits-to-sample rules. Every lowering of ``kf.rand``
(kf-lower-to-linalg, the GPU strategies, the interpreter) follows this module; its
pure-Python functions are the reference they are tested against.

A block is one Philox evaluation: four 32-bit words from a 64-bit counter and a 64-bit
key. Element ``i`` (row-major linear index) of a ``kf.rand`` result with state
``[seed, offset]`` and op offset ``o`` takes block ``b = i // n`` (n = ``PER_BLOCK``: 4
uniform samples a block, 2 normal ones) and its words ``i % n``:

    key     = (seed mod 2^32, seed div 2^32)
    counter = (c mod 2^32, c div 2^32, 0, 0),  c = offset + o + b   (mod 2^64)
    r0..r3  = philox4x32(counter, key)

so an element's value depends on the state, the op's offset and its index alone: a
kernel recomputes it anywhere (no sequence, no per-thread state), four consecutive
elements share a block (a thread that computes four elements computes one block, as
torch's CUDA dropout does), and the backward recomputes the forward's mask from the same
state. A program's random ops take disjoint counter ranges: each one's offset is the
number of blocks (``blocks``) of those before it.

Samples, in float32:
- uniform in [0, 1): word ``r_k`` gives ``(r_k >> 8) * 2^-24``, the 24 bits a float32
  holds exactly;
- normal (Box-Muller): words ``r_2k, r_2k+1`` give ``sqrt(-2 ln u1) * cos(2 pi u2)``
  with ``u1 = ((r_2k >> 8) + 1) * 2^-24`` in (0, 1] (no log of 0) and
  ``u2 = (r_2k+1 >> 8) * 2^-24``.
"""

from __future__ import annotations

import math

#: the round multipliers and the key increments (Weyl sequence) of Philox4x32
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
#: the bits of a word a sample keeps, and the scale that maps them into [0, 1)
SAMPLE_SHIFT = 8
SAMPLE_SCALE = 2.0 ** -24

DISTRIBUTIONS = ("uniform", "normal")
#: samples of one block
PER_BLOCK = {"uniform": 4, "normal": 2}


def blocks(numel: int, distribution: str) -> int:
    """The counters (blocks) a kf.rand of numel samples takes."""
    n = PER_BLOCK[distribution]
    return -(-numel // n)


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32-10 of a 128-bit counter under a 64-bit key, as four 32-bit words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
    return c0, c1, c2, c3


def block(seed: int, counter: int) -> tuple[int, int, int, int]:
    """The block at counter under seed (both as torch stores them, signed 64-bit)."""
    seed &= (1 << 64) - 1
    c = counter & ((1 << 64) - 1)
    return philox4x32((c & MASK32, c >> 32, 0, 0), (seed & MASK32, seed >> 32))


def unit(word: int, plus_one: bool = False) -> float:
    """A word's top 24 bits (plus one) times 2^-24."""
    return ((word >> SAMPLE_SHIFT) + plus_one) * SAMPLE_SCALE


def sample(seed: int, offset: int, index: int, distribution: str = "uniform") -> float:
    """Element ``index`` of a kf.rand whose state offset plus op offset is ``offset``
    (float64 here; the lowerings compute it in float32, which holds a uniform exactly)."""
    n = PER_BLOCK[distribution]
    words = block(seed, offset + index // n)
    k = index % n
    if distribution == "uniform":
        return unit(words[k])
    u1, u2 = unit(words[2 * k], plus_one=True), unit(words[2 * k + 1])
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
