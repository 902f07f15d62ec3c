"""Names of the files a benchmark writes: ``<what>-<date>-<commit>[-<tag>].<ext>``.

A results file is only worth keeping if it says what it measured and on which code, so
every script in bench/ names its output through here instead of taking a file name:

- ``what``: the script's measurement (``bench``, ``fp8-attention``, ``bench-attention``
  for ``bench.py --only attention``), lower case, words joined by ``-``;
- ``date``: the day of the run, UTC, ``YYYY-MM-DD``;
- ``commit``: the code measured, ``git rev-parse --short HEAD``, with ``-dirty`` when
  tracked files differ from that commit (the measured code is then not in git as it ran);
  ``KF_COMMIT`` names it instead where the tree is a copy whose ``.git`` is missing or
  not its own (a GPU machine that received the working tree: a stale ``.git`` there makes
  every run ``<old commit>-dirty``);
- ``tag``: what else sets the run apart from another of the same day and commit (a
  switch turned off, a second configuration), from ``--tag``.

``--out-dir`` picks the folder (bench/results by default; any other, such as the folder a
remote GPU machine copies back).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def slug(text: str) -> str:
    """``text`` as a file-name part: lower case, runs of other characters as one ``-``."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")


def commit(root: Path = ROOT) -> str:
    """The short hash of the checked-out commit, ``-dirty`` appended where tracked files
    differ from it; ``KF_COMMIT`` if set. Untracked files (results written earlier, caches)
    do not count: they are not the code measured."""
    if os.environ.get("KF_COMMIT"):
        return slug(os.environ["KF_COMMIT"])

    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(root), *argv], check=True, capture_output=True,
                              text=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError) as e:
        why = (getattr(e, "stderr", "") or str(e)).strip()
        raise SystemExit(f"bench: cannot name the results file by its commit ({why}); set KF_COMMIT "
                         f"to the commit {root} was copied from") from None
    return head + ("-dirty" if changed else "")


def file_name(what: str, tag: str = "", ext: str = "json", *, date: str | None = None,
              rev: str | None = None) -> str:
    """``<what>-<date>-<commit>[-<tag>].<ext>`` for a run today on the checked-out code."""
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    parts = [slug(what), date, rev or commit()] + ([slug(tag)] if tag else [])
    return "-".join(parts) + "." + ext


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out-dir`` and ``--tag``, the two choices a script leaves to its caller."""
    parser.add_argument("--out-dir", default=str(RESULTS),
                        help="folder of the results file, named <what>-<date>-<commit>[-<tag>].json "
                             "(default: bench/results)")
    parser.add_argument("--tag", default="", help="what sets this run apart from another of the same "
                                                  "day and commit (a switch, a configuration)")


def output_path(args: argparse.Namespace, what: str, ext: str = "json") -> Path:
    """The results file for this run, its folder created. Called before the measurement,
    so that a checkout git cannot name fails before the measurement runs."""
    folder = Path(args.out_dir)
    if folder.suffix == ".json":
        raise SystemExit(f"bench: --out-dir takes a folder, got {folder}; the file is named "
                         f"{file_name(what, args.tag, ext)}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(what, args.tag, ext)
    print(f"results: {path}", flush=True)
    return path


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON in ``path`` (rewritten whole, so a run cut short keeps
    what it wrote last)."""
    path.write_text(json.dumps(data, indent=1))
