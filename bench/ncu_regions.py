"""Where a kernel's warps spend their time, from ncu's per-instruction samples.

    ncu --clock-control none --kernel-name regex:attention --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o prof python3 SCRIPT
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_regions.py sass.csv [--top 12]

Splits the SASS at ``USETMAXREG`` (a warp-specialized kernel's producer and consumer
code) and at the loops (backward branches executed more than once a warp), and prints
for each region its stall samples, executed instructions and leading stall reasons, then
the instructions with the most samples: which part of a warp-specialized kernel waits,
and on what (bench/RESULTS.md has the attention kernels' regions).
"""

from __future__ import annotations

import argparse
import collections
import csv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names, data = rows[header], rows[header + 1:]
    col = {h: i for i, h in enumerate(names)}
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    executed = [int(r[col["Instructions Executed"]] or 0) for r in data]
    source = [r[col["Source"]].strip() for r in data]
    address = [int(r[0], 16) for r in data]
    reasons = [h for h in names if h.startswith("stall_") and "Not Issued" not in h]
    cuts = {0, len(data)}
    for n, s in enumerate(source):
        if "SETMAXREG" in s:
            cuts.add(n)
        if "BRA" in s and executed[n] > 1:
            target = int(s.split()[-1], 16)
            if target < address[n] and target in address:
                cuts.update((address.index(target), n + 1))
    cuts = sorted(cuts)
    total = sum(samples) or 1
    print(f"{'region':>13}  {'samples':>8}  {'share':>6}  {'executed':>12}  leading stall reasons")
    for a, b in zip(cuts, cuts[1:]):
        got = sum(samples[a:b])
        if not got:
            continue
        why = collections.Counter()
        for r in data[a:b]:
            for h in reasons:
                why[h[6:]] += int(r[col[h]] or 0)
        lead = ", ".join(f"{k} {v}" for k, v in why.most_common(4))
        print(f"[{a:5d},{b:5d})  {got:8d}  {100 * got / total:5.1f}%  {sum(executed[a:b]):12d}  {lead}")
    print()
    for n in sorted(range(len(data)), key=lambda n: -samples[n])[:args.top]:
        print(f"{n:5d}  {samples[n]:6d}  {executed[n]:10d}  {source[n][:70]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
