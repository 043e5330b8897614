"""A preset's runs as a plan in chunks: the jobs `python run.py -m experiment=PRESET OVERRIDES` would launch, each
marked complete or pending by the records under its run root, with estimated wall times, and the next chunk of
pending runs that fits a time budget (experiments/protocol.py runs it).

A job is expanded as Hydra's basic sweeper expands the sweep (`command_line.multirun_jobs`) and composed as
`python run.py <its overrides>` composes it; its run id and directory are the ones that command uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.utils import filter_overrides
from hydra.types import RunMode
from omegaconf import OmegaConf

from experiments import command_line, records, rerun, reuse
from experiments.run_estimates import COMMITTED, Estimate, Pool, duration, estimate, kind_of, run_records
from experiments.validation import ConfigError, not_allowed
from suite_schema import layout, registry, run_identity

COMPLETE, NEW = "complete", "new"
SCALES_MISSING, STALE = "scales missing", "stale (rerun_before)"


@dataclass(frozen=True)
class ProtocolRun:
    """One job of a preset's sweep: the overrides `python run.py` gets, the run id and directory they give, and what
    decides its time (its kind, `run_estimates.kind_of`; whether it trains; its evaluations, the run's own and one
    per post-hoc scale; whether it will evaluate a finished run's training from `reuse_training_from`)."""

    index: int
    overrides: tuple[str, ...]
    label: str
    run_id: str
    run_dir: Path
    kind: tuple
    trains: bool
    scales: tuple[float, ...]
    rerun_before: Optional[str]
    reuses: bool
    refinement: Optional[dict] = None  # the scale refinement a complete run must have run (`required_refinement`)

    @property
    def method(self) -> str:
        """The method's name."""
        return self.kind[0]

    @property
    def evaluations(self) -> int:
        """Evaluations the run makes: its own and one per post-hoc scale with a record of its own."""
        return 1 + len(self.scales)

    def state(self) -> str:
        """COMPLETE when its directory holds its complete record and every post-hoc scale's, and `rerun_before`
        does not ask to make it again (else SCALES_MISSING, STALE); the status of its record there otherwise
        (failed, interrupted, running), NEW without one."""
        record = records.read_record(self.run_dir)
        status = record.get("status") if record and record.get("run_id") == self.run_id else None
        if status == layout.STATUS_COMPLETE:
            if not records.is_complete(self.run_dir, self.run_id, self.scales, self.refinement):
                return SCALES_MISSING
            return STALE if rerun.requested(self.rerun_before, self.run_dir) else COMPLETE
        return status if status in layout.STATUSES else NEW


@dataclass
class Protocol:
    """A preset with the user's overrides, expanded into its runs (duplicates, jobs giving one run id, once)."""

    preset: str
    overrides: tuple[str, ...]
    run_root: Path
    runs: list[ProtocolRun]


def presets() -> list[str]:
    """The presets (conf/experiment/*.yaml), by name."""
    return sorted(p.stem for p in (registry.CONF / "experiment").glob("*.yaml"))


def check_overrides(preset: str, overrides: Sequence[str]) -> None:
    """Raise ConfigError for a preset that is not one of `presets()` or an override the protocol cannot pass on to
    one `python run.py` per run: Hydra's own settings (`hydra.*`, `hydra/...`) choose how a sweep launches."""
    if preset not in presets():
        raise not_allowed("experiment", preset, f"one of the presets in conf/experiment: {', '.join(presets())}")
    for text in overrides:
        key = text.lstrip("+~").split("=", 1)[0]
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise not_allowed(key, text.split("=", 1)[1] if "=" in text else "",
                              "the protocol runs each run with `python run.py <its overrides>`; Hydra's settings are "
                              "not passed on")


def labels(jobs: Sequence[Sequence[str]]) -> list[str]:
    """Per job, the overrides that differ between the jobs (all of them when there is one job)."""
    lists = [list(filter_overrides(job)) for job in jobs]
    common = set.intersection(*(set(o) for o in lists)) if len(lists) > 1 else set()
    return [" ".join(o for o in job if o not in common) or "(no overrides)" for job in lists]


def run_root_of(preset: str, overrides: Sequence[str] = ()) -> Path:
    """The run root of the preset's first job (`run_root` as `python run.py` composes it), without composing the
    others: where the protocol's records go, known before it is expanded."""
    check_overrides(preset, overrides)
    jobs = command_line.multirun_jobs([f"experiment={preset}", *overrides])
    cfg = command_line.config_loader().load_configuration("config", jobs[0], RunMode.RUN)
    return Path(str(OmegaConf.select(cfg, "run_root")))


def error_lines(errors: Sequence[tuple[int, str, str]]) -> list[str]:
    """One line per distinct error of (job index, label, error) triples, naming the first job and how many more."""
    first: dict[str, list] = {}
    for index, label, message in errors:
        first.setdefault(message, []).append((index, label))
    return [f"  #{jobs[0][0]} {jobs[0][1]}" + (f" and {len(jobs) - 1} more job(s)" if len(jobs) > 1 else "")
            + f": {message}" for message, jobs in first.items()]


def expand(preset: str, overrides: Sequence[str] = ()) -> Protocol:
    """The runs of `python run.py -m experiment=PRESET OVERRIDES`, in launch order, one per run id. Raises
    ConfigError (one line) for a bad preset, override or job config: nothing runs then."""
    # here, not at the top: the runtime (torch) loads only once the command line is checked
    from experiments.config import validate_config
    from experiments.job import USER_ERRORS
    from experiments.methods import method_class
    from experiments.run_dir import check_folder

    check_overrides(preset, overrides)
    argv = [f"experiment={preset}", *overrides]
    jobs = command_line.multirun_jobs(argv)
    loader = command_line.config_loader()
    runs, errors, seen, roots_seen = [], [], set(), set()
    for index, (job, label) in enumerate(zip(jobs, labels(jobs))):
        cfg = loader.load_configuration("config", list(job), RunMode.RUN)
        try:
            typed = validate_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
            resolved = OmegaConf.to_container(typed, resolve=True)
            method_class(typed.method._target_)
        except USER_ERRORS as exc:
            errors.append((index, label, str(exc)))
            continue
        run_id = run_identity.run_id_of(resolved)
        roots_seen.add(str(typed.run_root))
        if run_id in seen:  # overrides that do not change the science give one run
            continue
        seen.add(run_id)
        runs.append(protocol_run(index, job, label, typed))
    if errors:
        raise ConfigError(f"{len(errors)} of {len(jobs)} jobs of {preset} have an invalid config; nothing runs:\n"
                          + "\n".join(error_lines(errors)))
    if len(roots_seen) != 1:
        raise not_allowed("run_root", ",".join(sorted(roots_seen)), "one run root, where the protocol's records are")
    root = Path(roots_seen.pop())
    check_folder("run_root", root)
    return Protocol(preset, tuple(overrides), root, runs)


def protocol_run(index: int, job: Sequence[str], label: str, typed: Any) -> ProtocolRun:
    """The `ProtocolRun` of job `index` (overrides `job`) whose validated config is `typed`."""
    # here, not at the top: the runtime (torch) loads only once the command line is checked
    from experiments.config import resolved_train
    from experiments.methods import method_class, required_refinement, required_scales

    resolved = OmegaConf.to_container(typed, resolve=True)
    run_id = run_identity.run_id_of(resolved)
    trains = method_class(typed.method._target_).trains
    run_dir = Path(str(typed.run_root)) / run_id
    steps = resolved_train(typed).steps if trains else 0
    roots = [Path(str(r)) for r in typed.reuse_training_from]
    reuses = bool(roots and steps > 0 and reuse.find_donor(roots, run_identity.training_id_of(resolved), steps,
                                                            run_dir, typed.rerun_before))
    return ProtocolRun(index, tuple(job), label, run_id, run_dir, kind_of(run_identity.scientific_config(resolved)),
                       trains, tuple(required_scales(typed)), typed.rerun_before, reuses, required_refinement(typed))


def pools(run_root: Path) -> list[Pool]:
    """Where estimates come from, first first: the records under `run_root`, then the committed ones."""
    return [Pool(f"measured in {run_root}", run_records(run_root) if Path(run_root).is_dir() else ()),
            Pool(f"committed in {os.path.relpath(COMMITTED)}", run_records(COMMITTED, nested=True))]


def estimates(runs: Sequence[ProtocolRun], sources: Sequence[Pool]) -> dict[str, Estimate]:
    """Each run's estimated wall time (`run_estimates.estimate`), by run id."""
    return {r.run_id: estimate(r.kind, r.trains, r.evaluations, r.reuses, sources,
                               r.refinement["max_evals"] if r.refinement else 0) for r in runs}


def select_chunk(pending: Sequence[ProtocolRun], times: dict[str, Estimate], budget_s: float) -> list[ProtocolRun]:
    """The next chunk: the pending runs, in launch order, up to the first whose estimate would take the chunk past
    `budget_s` seconds; always at least the first (a run longer than the budget still runs, alone)."""
    chunk, total = [], 0.0
    for run in pending:
        total += times[run.run_id].seconds
        if chunk and total > budget_s:
            break
        chunk.append(run)
    return chunk


def plan_text(protocol: Protocol, states: dict[str, str], times: dict[str, Estimate], chunk: Sequence[ProtocolRun],
              budget_s: float, number: int = 1) -> str:
    """The plan: how many runs, complete and pending (by state), the estimated time left, and the next chunk's runs
    (chunk `number`) with their estimates and the source of each."""
    pending = [r for r in protocol.runs if states[r.run_id] != COMPLETE]
    left = sum(times[r.run_id].seconds for r in pending)
    by_state = {s: sum(states[r.run_id] == s for r in pending) for s in sorted({states[r.run_id] for r in pending})}
    detail = ", ".join(f"{n} {s}" for s, n in by_state.items())
    lines = [f"protocol {protocol.preset} (run_root={protocol.run_root}): {len(protocol.runs)} run(s), "
             f"{len(protocol.runs) - len(pending)} complete, {len(pending)} pending"
             + (f" ({detail})" if detail else "") + f"; about {duration(left)} left"]
    if not chunk:
        lines.append("nothing left to run: every run has a complete record")
        return "\n".join(lines)
    took = sum(times[r.run_id].seconds for r in chunk)
    lines.append(f"next chunk, #{number} (budget {duration(budget_s)}): {len(chunk)} run(s), about {duration(took)}")
    width = len(str(len(chunk)))
    for k, run in enumerate(chunk, 1):
        t = times[run.run_id]
        lines.append(f"  {k:>{width}}. {run.run_id}  {run.label}  [{states[run.run_id]}]  ~{duration(t.seconds)} "
                     f"({t.source})")
    rest = len(pending) - len(chunk)
    lines.append(f"after it: {rest} run(s), about {duration(left - took)}" if rest else "after it: nothing left")
    return "\n".join(lines)
