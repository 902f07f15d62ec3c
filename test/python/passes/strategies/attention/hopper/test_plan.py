"""The Hopper attention plan (passes/strategies/attention/hopper/plan.py): where the
kernel applies, how many stages, persistent or not."""

from __future__ import annotations

from strategy_kernels import HOPPER, attention, attention_fp8


def test_fp8_plan_needs_kmajor_v_and_whole_key_blocks():
    """fp8 attention keeps the SIMT kernel where the fp8 kernel does not apply: keys not
    whole blocks of 128 (key order is permuted within blocks), head dim 64 (rows of 64
    bytes are not 128-byte swizzled rows)."""
    for args in ((1, 2, 128, 200, 128), (1, 2, 128, 256, 64)):
        plan, _ = attention_fp8(*args).emit(HOPPER)
        assert not plan.get("wgmma") and not plan["mma"], (args, plan)


def test_persistent_plan():
    """PERSISTENT: the unmasked producer/consumer kernel starts one workgroup a
    multiprocessor of the target (not where it does not know them, 0), and takes the
    (query block, batch) tiles in turn; not where the keys and values of the tiles in
    flight pass PERSISTENT_WINDOW_BYTES (2048 queries, 4096 keys: 16.5 MiB). With a mask
    the block table's walk is persistent instead (PERSISTENT_WALK: tiles claimed from a
    counter), where queries and keys fill whole blocks."""
    from dataclasses import replace

    from kf.passes.strategies.attention.hopper.plan import PERSISTENT_WINDOW_BYTES

    def plan_of(built, target=HOPPER):
        return built.emit(target)[0]

    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16"))
    assert p["persistent"] == [16, 128] and p["grid"] == [132, 1, 1], p
    assert plan_of(attention(4, 32, 2048, 2048, 128, "bf16"), replace(HOPPER, multiprocessors=114))["grid"] == [114, 1, 1]
    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16"), replace(HOPPER, multiprocessors=0))
    assert not p["persistent"] and p["grid"] == [16, 128, 1], p
    assert 132 / 16 * 4096 * 256 * 2 > PERSISTENT_WINDOW_BYTES
    p = plan_of(attention(4, 32, 2048, 4096, 128, "bf16"))
    assert p["warp_specialized"] and not p["persistent"] and p["grid"] == [16, 128, 1], p
    # the block table's walk: PERSISTENT_WALK, tiles claimed in groups of heads whose keys
    # and values fit the window (8 of 512 KiB here, 12 of 1 MiB, 6 of 2 MiB) and that
    # divide the heads (WALK_EVEN_GROUPS: 8 and 4 of those)
    p = plan_of(attention(2, 4, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))
    assert p["warp_specialized"] and not p["persistent"] and p["persistent_walk"] == [8, 8, 8], p
    assert p["grid"] == [64, 1, 1] and not p["reverse_q_blocks"], p
    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16", mask_shape=(2048, 2048)))
    assert p["persistent_walk"] == [16, 128, 8] and p["grid"] == [132, 1, 1], p
    assert plan_of(attention(2, 32, 4096, 4096, 128, "bf16", mask_shape=(4096, 4096)))["persistent_walk"] == [32, 64, 4]
    assert plan_of(attention(3, 11, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))["persistent_walk"] == [8, 33, 11]
    assert plan_of(attention(1, 37, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))["persistent_walk"] == [8, 37, 1]
    for built, target in ((attention(2, 4, 1000, 1000, 128, "bf16", mask_shape=(1000, 1000)), HOPPER),  # tails
                          (attention(2, 4, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)),
                           replace(HOPPER, multiprocessors=0)),
                          (attention(1, 4, 1024, 16384, 128, "bf16", mask_shape=(1024, 16384)), HOPPER)):  # window
        p = plan_of(built, target)
        assert not p["persistent_walk"] and p["grid"][1] > 1, p
    p = plan_of(attention(2, 4, 1024, 1000, 128, "bf16"))  # keys ending inside a block
    assert p["warp_specialized"] and not p["persistent"], p
    assert plan_of(attention_fp8(4, 8, 2048, 2048, 128))["persistent"] == [16, 32]
