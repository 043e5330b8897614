"""A preset's sweep in chunks that fit a time budget: each call runs the next chunk and stops; the same command
goes on from where the records leave off, until every run of the preset is complete.

    python -m experiments.protocol micro_main reuse_training_from=[runs_dev]     # the next chunk of at most 2 h
    python -m experiments.protocol plan micro_main                               # the plan only (or --dry-run)
    python -m experiments.protocol micro_main run_root=results/main --hours 1.5 --commit

The plan (experiments/protocol_plan.py) lists the preset's runs as `python run.py -m experiment=PRESET OVERRIDES`
would, marks each complete or pending by its record, estimates each pending run's wall time from finished records
(experiments/run_estimates.py) and takes the pending runs, in launch order, that fit in `--hours` (at least one).
Each runs as `python run.py <its overrides>`, one after another, its console output in
`<run_root>/.protocol/<chunk>/<run_id>.log`; no run starts once the time spent and its estimate would pass the
budget. A line per chunk goes to `<run_root>/protocol.jsonl`. `--commit` then commits the chunk's record files, the
ledger and that log (experiments/protocol_git.py).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

from experiments import exit_codes, protocol_git
from experiments.protocol_plan import (COMPLETE, NEW, Protocol, ProtocolRun, check_overrides, estimates, expand,
                                       plan_text, pools, run_root_of, select_chunk)
from experiments.run_estimates import Estimate, duration
from experiments.validation import ConfigError, not_allowed
from suite_schema import layout

RUN_PY = Path(__file__).resolve().parents[1] / "run.py"
LOG_DIR = ".protocol"
CHUNKS_NAME = layout.PROTOCOL_CHUNKS_NAME
BUSY, REFUSED, INTERRUPTED = "busy", "refused", "interrupted"


def budget_hours(text: str) -> float:
    """`--hours` as a number of hours; ConfigError unless it is a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise not_allowed("--hours", text, "a number of hours > 0, e.g. 2 or 1.5")
    return value


def launch(run: ProtocolRun, log: Path) -> int:
    """Run `python run.py <the run's overrides>` here, its output to `log`; its exit code (`exit_codes`; negative:
    killed by that signal). A SIGTERM to this process reaches the run, which records itself interrupted; Ctrl-C
    reaches it from the terminal: either way this waits for it to end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([sys.executable, str(RUN_PY), *run.overrides], stdout=out, stderr=subprocess.STDOUT)
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
        try:
            while True:
                try:
                    return proc.wait()
                except KeyboardInterrupt:
                    continue  # the run got the same Ctrl-C: wait for it to record itself interrupted
        finally:
            signal.signal(signal.SIGTERM, previous)


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's ended (waited-for) children and theirs: a run's CPU time is the
    difference across it (one run at a time)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Outcome:
    """How one run of a chunk ended: its state (its record's status, or why it has none), wall seconds and CPU
    seconds (its process and all it started, every thread of each)."""

    run: ProtocolRun
    state: str
    seconds: float
    exit_code: int
    cpu_seconds: float = 0.0


def state_after(run: ProtocolRun, code: int) -> str:
    """A run's state after `python run.py` exited with `code`: COMPLETE, or what its record and the code say."""
    state = run.state()
    if state == COMPLETE:
        return state
    if code == exit_codes.RUN_BUSY:
        return BUSY
    if code == exit_codes.BAD_CONFIG:
        return REFUSED
    if code == exit_codes.INTERRUPTED or code < 0:
        return INTERRUPTED
    return layout.STATUS_FAILED if state == NEW else state


def run_chunk(chunk: Sequence[ProtocolRun], times: dict[str, Estimate], budget_s: float, log_dir: Path,
              start: Callable[[ProtocolRun, Path], int] = launch, clock: Callable[[], float] = time.monotonic,
              say: Callable[[str], None] = print, cpu: Callable[[], float] = children_cpu_seconds) -> list[Outcome]:
    """Run the chunk's runs one after another (`start`), a progress line after each (k/n, run id, state, its wall
    time and estimate, its CPU time (`cpu`, read before and after it), the chunk's time so far and the estimate of
    the rest). No run starts when the time spent and its estimate would pass `budget_s` (the first always starts);
    an interrupted run ends the chunk."""
    began, outcomes, n = clock(), [], len(chunk)
    for k, run in enumerate(chunk, 1):
        spent, est = clock() - began, times[run.run_id].seconds
        if outcomes and spent + est > budget_s:
            say(f"[{k}/{n}] not started: {duration(spent)} spent, {run.run_id} would take about {duration(est)} more "
                f"than the budget of {duration(budget_s)} leaves")
            break
        say(f"[{k}/{n}] {run.run_id}  {run.label}: started, about {duration(est)}")
        t0, c0 = clock(), cpu()
        code = start(run, log_dir / f"{run.run_id}.log")
        outcome = Outcome(run, state_after(run, code), clock() - t0, code, cpu() - c0)
        outcomes.append(outcome)
        rest = sum(times[r.run_id].seconds for r in chunk[k:])
        say(f"[{k}/{n}] {run.run_id} {outcome.state} in {duration(outcome.seconds)} (estimate {duration(est)}, "
            f"CPU {duration(outcome.cpu_seconds)}); "
            f"chunk {duration(clock() - began)}, about {duration(rest)} to go"
            + ("" if outcome.state == COMPLETE else f"; log: {log_dir / (run.run_id + '.log')}"))
        if outcome.state == INTERRUPTED:
            say(f"[{k}/{n}] stopped: the run was interrupted; the same command resumes it")
            break
    return outcomes


def chunk_number(run_root: Path, preset: str) -> int:
    """1 + the chunks of `preset` that `<run_root>/protocol.jsonl` logs."""
    path = Path(run_root) / CHUNKS_NAME
    if not path.is_file():
        return 1
    count = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a blank or torn line is no chunk
            continue
        count += isinstance(entry, dict) and entry.get("preset") == preset
    return 1 + count


def next_command(preset: str, overrides: Sequence[str], hours: str, commit: bool) -> str:
    """The command that runs the chunk after this one."""
    return shlex.join(["python", "-m", "experiments.protocol", preset, *overrides, "--hours", hours]
                      + (["--commit"] if commit else []))


def left(protocol: Protocol) -> tuple[list[ProtocolRun], dict[str, Estimate]]:
    """The runs not complete now and every run's estimate from the records as they are now."""
    pending = [r for r in protocol.runs if r.state() != COMPLETE]
    return pending, estimates(protocol.runs, pools(protocol.run_root))


def finish(protocol: Protocol, number: int, outcomes: Sequence[Outcome], times: dict[str, Estimate], began: str,
           hours: float, command: str) -> tuple[str, dict]:
    """The end-of-chunk text (what ran, what is left, the next command) and the chunk's line of protocol.jsonl."""
    pending, now = left(protocol)
    rest = sum(now[r.run_id].seconds for r in pending)
    states = {s: sum(o.state == s for o in outcomes) for s in sorted({o.state for o in outcomes})}
    ran, cpu = sum(o.seconds for o in outcomes), sum(o.cpu_seconds for o in outcomes)
    lines = [f"chunk {number} of {protocol.preset}: {len(outcomes)} run(s) in {duration(ran)} (CPU {duration(cpu)}): "
             + ", ".join(f"{n} {s}" for s, n in states.items())]
    if pending:
        lines.append(f"left: {len(pending)} of {len(protocol.runs)} run(s), about {duration(rest)}")
        lines.append(f"next chunk: {command}")
    else:
        lines.append(f"the protocol is complete: all {len(protocol.runs)} runs have a complete record")
    entry = {"preset": protocol.preset, "overrides": list(protocol.overrides), "chunk": number, "started": began,
             "ended": datetime.now(timezone.utc).isoformat(), "hours": hours,
             "runs": [{"run_id": o.run.run_id, "label": o.run.label, "state": o.state, "seconds": round(o.seconds, 1),
                       "cpu_s": round(o.cpu_seconds, 1), "estimate_s": round(times[o.run.run_id].seconds, 1),
                       "source": times[o.run.run_id].source} for o in outcomes],
             "seconds": round(ran, 1), "cpu_s": round(cpu, 1),
             "left_runs": len(pending), "left_s": round(rest, 1)}
    return "\n".join(lines), entry


def commit_message(protocol: Protocol, entry: dict) -> str:
    """The commit message of a chunk: the preset, the chunk's number and outcome, and what remains."""
    states: dict[str, int] = {}
    for run in entry["runs"]:
        states[run["state"]] = states.get(run["state"], 0) + 1
    done = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    remains = (f"{entry['left_runs']} of {len(protocol.runs)} runs left, about {duration(entry['left_s'])}"
               if entry["left_runs"] else f"complete, all {len(protocol.runs)} runs")
    return f"protocol {protocol.preset}, chunk {entry['chunk']}: {len(entry['runs'])} runs ({done}); {remains}"


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line: [plan] PRESET [OVERRIDES...] [--hours H] [--dry-run] [--commit]."""
    parser = argparse.ArgumentParser(prog="python -m experiments.protocol", description=__doc__.split("\n")[0])
    parser.add_argument("preset", help="a preset of conf/experiment (micro_main, ...); `plan PRESET` prints the plan")
    parser.add_argument("overrides", nargs="*", help="overrides of the preset's runs, as for run.py (run_root=...)")
    parser.add_argument("--hours", default="2", help="the chunk's time budget in hours (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--commit", action="store_true", help="commit the chunk's records to git afterwards")
    argv = list(argv)
    dry = bool(argv) and argv[0] == "plan"
    args = parser.parse_intermixed_args(argv[1:] if dry else argv)
    args.dry_run = args.dry_run or dry
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Plan the preset's next chunk, print it and (unless a dry run) run it; the exit code (`exit_codes`): DONE when
    every run of the chunk completed, FAILED when one did not, INTERRUPTED when a run was interrupted, BAD_CONFIG
    for a command line or config that cannot run (before anything runs)."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        hours = budget_hours(args.hours)
        check_overrides(args.preset, args.overrides)
        commit = args.commit and not args.dry_run
        top = protocol_git.check_committable(run_root_of(args.preset, args.overrides)) if commit else None
        protocol = expand(args.preset, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_CONFIG
    budget = hours * 3600
    times = estimates(protocol.runs, pools(protocol.run_root))
    states = {r.run_id: r.state() for r in protocol.runs}
    pending = [r for r in protocol.runs if states[r.run_id] != COMPLETE]
    chunk = select_chunk(pending, times, budget)
    number = chunk_number(protocol.run_root, protocol.preset)
    print(plan_text(protocol, states, times, chunk, budget, number), flush=True)
    if args.dry_run or not chunk:
        return exit_codes.DONE
    began = datetime.now(timezone.utc)
    log_dir = protocol.run_root / LOG_DIR / f"{number:03d}-{began.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True)
    print(f"logs: {log_dir}", flush=True)
    outcomes = run_chunk(chunk, times, budget, log_dir, say=lambda line: print(line, flush=True))
    command = next_command(args.preset, args.overrides, args.hours, args.commit)
    text, entry = finish(protocol, number, outcomes, times, began.isoformat(), hours, command)
    chunks = protocol.run_root / CHUNKS_NAME
    with open(chunks, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
    print(text, flush=True)
    if top is not None:
        files = protocol_git.record_files([o.run.run_dir for o in outcomes], protocol.run_root, [chunks])
        sha = protocol_git.commit(top, files, commit_message(protocol, entry))
        print(f"committed {len(files)} file(s): {sha}" if sha else "nothing to commit: no record changed", flush=True)
    if any(o.state == INTERRUPTED for o in outcomes):
        return exit_codes.INTERRUPTED
    return exit_codes.DONE if all(o.state == COMPLETE for o in outcomes) else exit_codes.FAILED


if __name__ == "__main__":
    from experiments.log import quiet_console

    quiet_console()  # `... | head`: the chunk's runs go on to the end and protocol.jsonl gets its line
    sys.exit(main())
