"""Committing what a protocol chunk recorded: the record files of its runs (the run's own and each post-hoc scale's),
the run root's ledger of test-split reads and its chunk log, as a committed result folder holds them
(docs/results/micro/records); never checkpoints, exports or logs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable, Optional, Sequence

from experiments.validation import ConfigError, not_allowed
from suite_schema import layout

CODE = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)


def toplevel(repo: Path = CODE) -> Path:
    """The top folder of the git checkout holding `repo` (the suite's code by default); ConfigError without one."""
    out = _git(repo, "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise ConfigError(f"--commit is not allowed: {repo} is not in a git checkout ({out.stderr.strip()})")
    return Path(out.stdout.strip())


def check_committable(run_root: Path, repo: Path = CODE) -> Path:
    """The checkout's top folder when records under `run_root` can be committed there: `run_root` lies inside the
    checkout of `repo` and git does not ignore a record in it. Raises ConfigError (`run_root=... is not allowed`)
    otherwise."""
    top = Path(os.path.realpath(toplevel(repo)))
    root = Path(os.path.realpath(os.path.abspath(run_root)))
    if root != top and top not in root.parents:
        raise not_allowed("run_root", str(run_root), f"a folder inside the repository {top} (--commit commits its "
                                                     "records there)")
    probe = root.relative_to(top) / ("0" * 16) / layout.RECORD_NAME
    ignored = _git(top, "check-ignore", "--no-index", "--verbose", str(probe))
    if ignored.returncode == 0:
        rule = ignored.stdout.strip().split("\t")[0]
        raise not_allowed("run_root", str(run_root), f"a folder git does not ignore (--commit commits its records; "
                                                     f"{rule} ignores {probe})")
    return top


def record_files(run_dirs: Iterable[Path], run_root: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """The files a chunk commits, those that exist: each run folder's record files (its own, each post-hoc scale's),
    the run root's ledger of test-split reads and the `extra` files."""
    found = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        found += [p for p in [run_dir / layout.RECORD_NAME] if p.is_file()]
        found += sorted(run_dir.glob(f"{layout.SCALES_DIR}/*/{layout.RECORD_NAME}"))
    ledger = Path(run_root) / layout.TEST_READS_NAME
    return found + [p for p in (ledger, *map(Path, extra)) if p.is_file()]


def commit(top: Path, paths: Sequence[Path], message: str) -> Optional[str]:
    """`git add` the files `paths` and commit them alone (whatever else is staged stays staged) with `message`;
    the new commit's sha, or None when they hold no change. Raises RuntimeError when git fails."""
    rel = [os.path.relpath(os.path.realpath(p), top) for p in paths]
    if not rel:
        return None
    out = _git(top, "add", "--", *rel)
    if out.returncode != 0:
        raise RuntimeError(f"git add failed: {out.stderr.strip()}")
    if _git(top, "diff", "--cached", "--quiet", "--", *rel).returncode == 0:
        return None
    out = _git(top, "commit", "--quiet", "-m", message, "--", *rel)
    if out.returncode != 0:
        raise RuntimeError(f"git commit failed: {out.stderr.strip()}")
    return _git(top, "rev-parse", "HEAD").stdout.strip()
