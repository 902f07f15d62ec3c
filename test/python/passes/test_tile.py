"""kf-tile's options (passes/tile.py): kernel variants as ``<kind>.<field>=<value>``."""

from __future__ import annotations

import dataclasses

import pytest
from kf.passes import registry
from kf.passes.strategies.base import variant_from_text, variants_by_kind
from kf.passes.strategies.matmul import MatmulVariant
from kf.passes.tile import TilePass


def test_variants_are_options_and_round_trip():
    p = registry.create("kf-tile", {"target": "cuda", "matmul.stages": "3", "attention.reverse_q_blocks": "false"})
    assert isinstance(p, TilePass) and p.target == "cuda"
    assert p.variants == (("attention.reverse_q_blocks", "false"), ("matmul.stages", "3"))
    assert p.textual() == "kf-tile{attention.reverse_q_blocks=false matmul.stages=3}"
    assert TilePass().textual() == "kf-tile" and TilePass(chip="sm_80").textual() == "kf-tile{chip=sm_80}"
    assert dataclasses.replace(p, chip="sm_80").textual() == \
        "kf-tile{chip=sm_80 attention.reverse_q_blocks=false matmul.stages=3}"
    by_kind = variants_by_kind(dict(p.variants))
    assert by_kind["matmul"] == MatmulVariant(stages=3) and by_kind["attention"].reverse_q_blocks is False


def test_variant_values_from_text():
    v = variant_from_text(MatmulVariant, {"warp_tiles": "4,4", "group_m": "0"})
    assert v == MatmulVariant(warp_tiles=(4, 4), group_m=0)
    for fields, message in (({"stage": "2"}, "no variant 'stage'"), ({"stages": "2.5"}, "takes an int"),
                            ({"warp_tiles": "4x4"}, "takes ints like 4,8")):
        with pytest.raises(ValueError, match=message):
            variant_from_text(MatmulVariant, fields)
    with pytest.raises(ValueError, match="'elementwise' have no variants"):
        variants_by_kind({"elementwise.items": "2"})
