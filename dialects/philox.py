"""What ``kf.rand`` computes: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
easy as 1, 2, 3", SC'11; Random123), the counter-based generator torch's CUDA kernels and
Triton's ``tl.rand`` use, and the bits-to-sample rules. Every lowering of ``kf.rand``
(kf-lower-to-linalg, the GPU strategies, the interpreter) follows this module; its
pure-Python ``philox4x32`` is the reference they are tested against.

Element ``i`` of a ``kf.rand`` result (row-major linear index) is one Philox block:

    key     = (seed mod 2^32, seed div 2^32)                     state = [seed, offset]
    counter = (c mod 2^32, c div 2^32, 0, 0),  c = offset + op_offset + i   (mod 2^64)
    r0..r3  = philox4x32(counter, key)

so an element's value depends on the state, the op's ``offset`` attribute and its index
alone: a kernel recomputes it anywhere (no sequence, no per-thread state), and the
backward recomputes the forward's mask from the same state. A program's random ops take
disjoint counter ranges: each one's ``offset`` is the sum of the sizes of those before it.

Samples, in float32:
- uniform in [0, 1): ``(r0 >> 8) * 2^-24``, the 24 bits a float32 holds exactly;
- normal (Box-Muller): ``sqrt(-2 ln u1) * cos(2 pi u2)`` with ``u1 = ((r0 >> 8) + 1) *
  2^-24`` in (0, 1] (no log of 0) and ``u2 = (r1 >> 8) * 2^-24``.
"""

from __future__ import annotations

#: the round multipliers and the key increments (Weyl sequence) of Philox4x32
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
#: the bits of r0 (and r1) a sample keeps, and the scale that maps them into [0, 1)
SAMPLE_SHIFT = 8
SAMPLE_SCALE = 2.0 ** -24

DISTRIBUTIONS = ("uniform", "normal")


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


def block(seed: int, offset: int, index: int) -> tuple[int, int, int, int]:
    """The Philox block of element ``index`` for state [seed, offset] (offset includes the
    op's own offset); seed and offset as torch stores them, signed 64-bit."""
    seed &= (1 << 64) - 1
    c = (offset + index) & ((1 << 64) - 1)
    return philox4x32((c & MASK32, c >> 32, 0, 0), (seed & MASK32, seed >> 32))


def sample(words: tuple[int, int, int, int], distribution: str = "uniform") -> float:
    """The sample a block gives (in float64; the lowerings compute it in float32)."""
    import math

    if distribution == "uniform":
        return (words[0] >> SAMPLE_SHIFT) * SAMPLE_SCALE
    u1 = ((words[0] >> SAMPLE_SHIFT) + 1) * SAMPLE_SCALE
    u2 = (words[1] >> SAMPLE_SHIFT) * SAMPLE_SCALE
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
