"""The OpInfo conformance suite's summary (opinfo.py): counts by class and by op, the
coverage of the in-scope cases, every case's result (JSON), and the Markdown report that
groups alike failures."""

from __future__ import annotations

import collections
import json
import re
import subprocess
from pathlib import Path
from typing import Iterable

from opinfo_cases import CLASSES, COMPILE_ONLY, REPO, Result
from opinfo_scope import coverage




def summarize(results: list[Result], meta: dict) -> dict:
    """Counts by class and by op, and every case's result."""
    by_class = collections.Counter(r.cls for r in results)
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_op[r.case.op_name][r.cls] += 1
    kf_errors = [r for r in results if r.cls == "KF_ERROR"]
    return {
        "meta": meta,
        "counts": {c: by_class.get(c, 0) for c in CLASSES},
        "kf_errors_naming_user_line": sum(1 for r in kf_errors if r.user_line),
        "coverage": coverage([r.to_json() for r in results]),
        "ops": {op: {c: n for c, n in sorted(cnt.items())} for op, cnt in sorted(by_op.items())},
        "results": [dict(r.to_json(), reproducer=r.case.reproducer()) for r in results],
    }


def _group_key(detail: str) -> str:
    """A failure's detail without its numbers and names of temporaries, to group alike ones."""
    text = re.sub(r"/tmp/\S+", "<tmp>", detail)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    return re.sub(r"\[[^\]]*\]", "[..]", text)[:160]


def torch_mlir_importable() -> bool:
    """Whether torch-mlir imports here (kf's path for ops it has no handler for)."""
    try:
        import torch_mlir  # noqa: F401
    except ImportError:
        return False
    return True


def markdown(summary: dict) -> str:
    meta, counts = summary["meta"], summary["counts"]
    total = sum(counts.values())
    without = meta.get("torch_mlir") is False
    out = [f"# kf OpInfo conformance: target {meta['target']}, {meta['dtype']}"
           + (", without torch-mlir" if without else ""), ""]
    if without:
        out += ["torch-mlir is not importable here: every op goes through a kf handler or torch's decomposition "
                "into kf ops, as on a GPU machine without torch-mlir.", ""]
    out += [f"{total} cases of {len(summary['ops'])} ops; torch {meta.get('torch', '?')}, kf commit "
            f"{meta.get('commit', '?')}, {meta.get('date', '')}; {meta.get('seconds', 0):.0f} s.", "",
            f"Command: `{meta.get('command', '')}`", ""]
    if meta["target"] in COMPILE_ONLY:
        out += [f"Compile only: each case's kf function is built for the {COMPILE_ONLY[meta['target']]} target "
                f"(every stage to the machine code's assembler) from samples on the CPU, and nothing runs. PASS "
                f"here means it compiled; whether it computes the right values is measured on a device.", ""]
    out += ["| class | cases |", "| --- | --- |"]
    out += [f"| {c} | {counts[c]} |" for c in CLASSES]
    n_err = counts["KF_ERROR"]
    cov = summary.get("coverage") or coverage(summary["results"])
    out += ["", f"Coverage (PASS of the in-scope cases that are not SKIP; `opinfo_scope.py` defines the scope): "
                f"{cov['passed']} of {cov['in_scope']} = {100 * cov['coverage']:.1f}%. Out of scope: "
                + ", ".join(f"{reason} {n}" for reason, n in cov["out_of_scope"].items()) + "."]
    out += ["", f"KF_ERROR messages that show the kf function's line: {summary['kf_errors_naming_user_line']} "
                f"of {n_err}.", ""]
    results = summary["results"]
    for cls in ("CRASH", "INTERNAL", "MISMATCH"):
        rows = [r for r in results if r["cls"] == cls]
        out += [f"## {cls} ({len(rows)})", ""]
        if not rows:
            out += ["None.", ""]
            continue
        groups: dict[str, list] = collections.defaultdict(list)
        for r in rows:
            groups[_group_key(r["detail"])].append(r)
        out += ["Grouped by message (numbers elided):", ""]
        for key, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            ops = sorted({r["op"] for r in rs})
            out.append(f"- {len(rs)} cases, {len(ops)} ops: `{key}` — {', '.join(ops[:12])}"
                       f"{' ...' if len(ops) > 12 else ''}")
        out += ["", "| case | detail | reproducer |", "| --- | --- | --- |"]
        for r in rows:
            detail = r["detail"].replace("|", "\\|")
            out.append(f"| {r['case']} | {detail} | `{r['reproducer']}` |")
        out.append("")
    out += ["## By op", "", "| op | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    for op, cnt in summary["ops"].items():
        out.append(f"| {op} | " + " | ".join(str(cnt.get(c, "")) for c in CLASSES) + " |")
    errors = collections.Counter(_group_key(r["detail"]) for r in results if r["cls"] == "KF_ERROR")
    out += ["", "## KF_ERROR messages (most common first)", "", "| cases | message (numbers elided) |",
            "| --- | --- |"]
    out += [f"| {n} | {k.replace('|', '/')} |" for k, n in errors.most_common()]
    return "\n".join(out) + "\n"


def write_summary(summary: dict, paths: Iterable[str]) -> None:
    for p in paths:
        path = Path(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = markdown(summary) if path.suffix == ".md" else json.dumps(summary, indent=1) + "\n"
        path.write_text(text)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
