"""How evenly a persistent attention kernel's tile orders load the SMs under a causal mask:
a list-scheduling model, no GPU. A tile (query block, head) costs its live key blocks (the
query block's index + 1) plus a fixed cost a tile, in units of one key block.

    python3 bench/tile_orders.py [--heads 128] [--query-blocks 16] [--sms 132] [--tile-cost 1.5]

Prints, for each order, the most loaded SM's time over the mean (1.00 is perfect):
``static`` gives workgroup w tiles w, w + grid, ... (what PERSISTENT does unmasked),
``snake`` the same with every other round reversed, ``claimed`` lets each workgroup take
the next tile as it finishes one (PERSISTENT_WALK's counter). Orders: a head's tiles
last query block first, head after head (``head by head``), or a group of G heads' tiles by
query block (``groups of G``, PERSISTENT_WALK's with G from plan()).
"""

from __future__ import annotations

import argparse
import heapq


def order(heads: int, nq: int, group: int) -> list[int]:
    """Query-block indices of the tiles in claim order: groups of ``group`` heads, a
    group's tiles by query block last to first, then by head."""
    out = []
    for first in range(0, heads, group):
        size = min(group, heads - first)
        out += [nq - 1 - i for i in range(nq) for _ in range(size)]
    return out


def claimed(blocks: list[int], sms: int, cost: float) -> float:
    loads = [0.0] * min(sms, len(blocks))
    heapq.heapify(loads)
    for b in blocks:
        heapq.heappush(loads, heapq.heappop(loads) + cost + b + 1)
    return max(loads)


def static(blocks: list[int], sms: int, cost: float, snake: bool) -> float:
    grid = min(sms, len(blocks))
    loads = [0.0] * grid
    for t, b in enumerate(blocks):
        r, w = divmod(t, grid)
        loads[grid - 1 - w if snake and r % 2 else w] += cost + b + 1
    return max(loads)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=128, help="batch x heads")
    ap.add_argument("--query-blocks", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--tile-cost", type=float, default=1.5, help="a tile's fixed cost, in key blocks")
    ap.add_argument("--groups", default="1,4,8,12,16")
    a = ap.parse_args()
    mean = sum(a.tile_cost + b + 1 for b in order(a.heads, a.query_blocks, 1)) / a.sms
    print(f"{a.heads} heads x {a.query_blocks} query blocks over {a.sms} SMs, a tile's cost {a.tile_cost}: "
          f"mean {mean:.1f} blocks an SM")
    for g in (int(x) for x in a.groups.split(",")):
        blocks = order(a.heads, a.query_blocks, g)
        name = "head by head" if g == 1 else f"groups of {g}"
        print(f"{name:>14}: static {static(blocks, a.sms, a.tile_cost, False) / mean:.3f}  "
              f"snake {static(blocks, a.sms, a.tile_cost, True) / mean:.3f}  "
              f"claimed {claimed(blocks, a.sms, a.tile_cost) / mean:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
