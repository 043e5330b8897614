"""Every `python run.py ...` and `python -m analysis ...` command the docs give a user (README.md, docs/**/*.md,
the comments of conf/**/*.yaml) still means what it says: each run.py command's sweep expands, and its jobs
compose and validate, as `run.py` would do them; each analysis command parses with the analysis CLI.

Commands with placeholders (`<name>`, `DIR...`, `[--flag]`, `...`) are patterns, not commands, and are not run
here; nor is a bare `python -m analysis tune` naming the subcommand in prose (a bare `python run.py` is checked:
it is the default run), nor a command with `-cd` (a cluster profile the user copies first, docs/slurm.md;
tests/slurm/test_sweeps_local.py composes the shipped profiles)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import RunMode

from analysis.cli import _parser as analysis_parser
from experiments import command_line
from experiments.config import validate_config
from experiments.run_id import register_run_id_resolver
from tests.conftest import REPO, sweep_jobs

CONF = REPO / "conf"
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(CONF.rglob("*.yaml"))]
COMMAND = re.compile(r"^python (run\.py|-m analysis)(?:\s+(.*))?$")
PLACEHOLDER = re.compile(r"<|\.\.\.|\[--|\b[A-Z]{3,}\b(?![=/])")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")


def _continued(lines: list[str]) -> list[str]:
    """The lines with shell continuations (a trailing backslash) joined to the next line."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line.rstrip())
    return out


def commands_in(path: Path) -> list[str]:
    """The commands written in one file: the code lines (fenced or indented) and inline code spans (a span may wrap
    over lines) of a markdown file or of a YAML file's comments; each with its shell comment removed."""
    text = path.read_text()
    if path.suffix == ".yaml":  # only the comments
        text = "\n".join(line.strip()[1:] for line in text.splitlines() if line.strip().startswith("#"))
    lines = _continued([line.strip() for line in text.splitlines()])
    candidates = [line for line in lines if line.startswith("python ")]  # code blocks, fenced or indented
    candidates += [" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text))]
    found = []
    for line in candidates:
        at = line.find("python ")
        if at < 0:
            continue
        line = line[at:]
        if " #" in line:  # a shell comment; no command here quotes a '#'
            line = line[: line.index(" #")]
        if COMMAND.match(line.strip()):
            found.append(line.strip())
    return found


def documented_commands() -> list[tuple[str, str]]:
    """(files, command) for every checkable command in the docs, once each (with the files that give it), in the
    order the files first give them."""
    where: dict[str, list[str]] = {}
    for path in SOURCES:
        for command in commands_in(path):
            args = COMMAND.match(command).group(2) or ""
            if PLACEHOLDER.search(args) or (command.startswith("python -m analysis") and " " not in args):
                continue  # a pattern with placeholders, or an analysis subcommand named in prose
            if " -cd " in f" {args} ":
                continue  # a cluster profile the user copies first; tests/slurm composes the shipped ones
            files = where.setdefault(command, [])
            if str(path.relative_to(REPO)) not in files:
                files.append(str(path.relative_to(REPO)))
    return [(", ".join(files), command) for command, files in where.items()]


COMMANDS = documented_commands()
RUN_COMMANDS = [(f, c) for f, c in COMMANDS if c.startswith("python run.py")]
ANALYSIS_COMMANDS = [(f, c) for f, c in COMMANDS if c.startswith("python -m analysis")]


def compose_job(overrides: list[str]):
    """The validated config of one job, composed with Hydra's own config (so launcher overrides are checked too)."""
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF)))
    return validate_config(loader.load_configuration("config", overrides, RunMode.RUN))


def test_the_docs_give_commands_to_check():
    """The extraction finds the commands the README's tables and the reproduction docs give (a regex that
    matched nothing would pass every other test here)."""
    commands = {c for _, c in COMMANDS}
    assert len(RUN_COMMANDS) >= 30 and len(ANALYSIS_COMMANDS) >= 20, (len(RUN_COMMANDS), len(ANALYSIS_COMMANDS))
    for expected in ("python run.py -m experiment=micro_main",
                     "python run.py -m experiment=paper_main hydra/launcher=slurm",
                     "python -m analysis tune runs_dev --reference lora:train.steps=600 --points 1 --out conf/point "
                     "--prefix micro_1pt"):
        assert expected in commands


@pytest.mark.slow
@pytest.mark.parametrize(("source", "command"), RUN_COMMANDS, ids=[c[14:80] for _, c in RUN_COMMANDS])
def test_run_command_expands_and_composes(source, command, tmp_path, monkeypatch):
    """A documented run.py command: its sweep expands (multirun) or it is one job; the first and the last job
    compose and validate (every job of a sweep shares the same groups, so these two cover its axes' ends). It runs
    in a folder holding the run roots the command reuses (`reuse_training_from` must name existing folders)."""
    register_run_id_resolver()
    args = shlex.split(command)[2:]
    monkeypatch.chdir(tmp_path)
    command_line.check(args)  # what run.py checks before Hydra acts
    for arg in args:
        if arg.startswith("reuse_training_from="):
            for root in arg.split("=", 1)[1].strip("[]").split(","):
                (tmp_path / root.strip()).mkdir(parents=True, exist_ok=True)
    multirun = "-m" in args or "--multirun" in args
    args = [a for a in args if a not in ("-m", "--multirun")]
    if "--cfg" in args:  # `--cfg job` prints the config; what it prints is composed here
        at = args.index("--cfg")
        args = args[:at] + args[at + 2:]
    if args == ["--help"]:  # run.py's own help, read from conf/
        assert "Config groups" in command_line.help_text()
        return
    args = [a for a in args if a != "--plan"]  # the plan composes and validates every job, as checked here
    assert all(not a.startswith("-") for a in args), f"{source}: an option this check does not know: {command}"
    jobs = sweep_jobs(args) if multirun else [args]
    assert jobs, f"{source}: {command} expands into no job"
    for job in {tuple(jobs[0]), tuple(jobs[-1])}:
        assert compose_job(list(job)).method.name, (source, command, job)


def strict_analysis_parser() -> argparse.ArgumentParser:
    """The analysis CLI's parser without option abbreviations (argparse would take `--point` for `--points`; the
    docs should give the full names)."""
    parser = analysis_parser()
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.allow_abbrev = False
    return parser


@pytest.mark.parametrize(("source", "command"), ANALYSIS_COMMANDS,
                         ids=[c[19:90] for _, c in ANALYSIS_COMMANDS])
def test_analysis_command_parses(source, command):
    """A documented `python -m analysis` command names a subcommand and options the CLI has."""
    try:
        args = strict_analysis_parser().parse_args(shlex.split(command)[3:])
    except SystemExit as exc:  # argparse reports on stderr and exits 2
        pytest.fail(f"{source}: `{command}` does not parse (exit {exc.code})")
    assert args.command in ("collect", "report", "tune"), (source, command)
