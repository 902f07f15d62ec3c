"""precision="fp8" attention at a head dim the fp8 attention kernel does not take (64):
the driver's policy (``fp8-attention=kernel``: such attention stays 16-bit) against
quantizing it anyway (``fp8-attention=any``: fp8 operands on the SIMT kernel), beside
the bf16 call, in one process: what the policy saves where the fp8 kernel does not apply.

    python3 bench/fp8_policy.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from bench import median_ms, rel_err, rotated  # noqa: E402

import kf  # noqa: E402
from kf import targets  # noqa: E402
from seed_examples import fused_attention  # noqa: E402


def main() -> None:
    b, h, s, d = 4, 32, 2048, 64
    ins = rotated(lambda: tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)))
    q, k, v = (t.double() for t in ins[0])
    ref = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, -1) @ v
    print(f"{b}x{h}x{s}x{d}: bf16 %.3f ms" % median_ms(fused_attention, ins))
    fp8 = fused_attention.with_options(precision="fp8")
    print("fp8, the driver's policy (attention 16-bit here) %.3f ms, error %.1e"
          % (median_ms(fp8, ins), rel_err(fp8(*ins[0]), ref)))
    policy = targets.CUDA.precision_passes
    targets.CUDA.precision_passes = lambda o: [p.replace("fp8-attention=kernel", "fp8-attention=any") for p in policy(o)]
    os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()  # the pass options are not part of the cache key
    anyway = kf.jit(fused_attention.fn, precision="fp8")
    print("fp8, quantized anyway (fp8 operands, SIMT kernel) %.3f ms, error %.1e"
          % (median_ms(anyway, ins, reps=5), rel_err(anyway(*ins[0]), ref)))


if __name__ == "__main__":
    main()
