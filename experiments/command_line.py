"""`python run.py`'s overrides checked before Hydra acts on them: a bad one is one line and exit code 2.

Hydra reports a config-group option that does not exist, a key the config does not have and an
override it cannot parse with a multi-line block (the search path, hint lines) and exit code 1, and
a sweep over such a value starts the launcher first. The suite's contract for a config the user got
wrong is one line naming the key, the value and what is allowed, and exit code 2
(`exit_codes.BAD_CONFIG`), before anything runs. The check composes with Hydra's own config loader
on the same search path as `run.py` (`conf/`, plus `--config-dir`), so what passes here composes
the same way in Hydra; only the error is reworded. A sweep (`-m`, or a preset's
`hydra.sweeper.params`) is expanded as Hydra's basic sweeper expands it: its first job is composed,
and the values of each swept config group are checked against the group's files.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments import exit_codes
from experiments.validation import ConfigError

REPO = Path(__file__).resolve().parents[1]
#: Options listed in full up to this many; beyond, a count and the closest names.
MAX_LISTED = 30


class CommandLineError(ConfigError):
    """An override of the command line that Hydra would refuse, in one line."""


#: Config groups in conf/config.yaml's defaults list that were once appended with `+` (`+experiment=NAME`): the old
#: spelling still selects them (Hydra refuses `+` for a group already in the defaults list).
SELECTED_WITHOUT_PLUS = ("experiment",)


def normalized(argv: Sequence[str]) -> list[str]:
    """`argv` with `+experiment=NAME` (the old spelling) as `experiment=NAME`; everything else as it is."""
    out = []
    for arg in argv:
        if any(arg.startswith(f"+{group}=") for group in SELECTED_WITHOUT_PLUS):
            arg = arg[1:]
        out.append(arg)
    return out


def config_loader(config_dir: str | None = None) -> ConfigLoaderImpl:
    """Hydra's config loader on `run.py`'s search path: `conf/`, with `--config-dir` (`config_dir`) first."""
    search_path = create_automatic_config_search_path(str(REPO / "run.py"), None, "conf")
    if config_dir is not None:
        path = os.path.abspath(config_dir)
        if not os.path.isdir(path):
            raise CommandLineError(f"--config-dir={config_dir} is not allowed: no such directory ({path})")
        search_path.prepend(provider="command-line", path=f"file://{path}", anchor=SearchPathQuery(provider="schema"))
    return ConfigLoaderImpl(config_search_path=search_path)


def _override_for(key: str, overrides: Sequence[str]) -> str:
    """The command-line override that sets `key` (with its prefix, +, ++ or ~), else `key`."""
    for text in overrides:
        name = text.lstrip("+~").split("=", 1)[0].split("@", 1)[0]
        if name == key:
            return text
    return key


def _options_line(value: str, options: Sequence[str], what: str) -> str:
    close = difflib.get_close_matches(value, list(options), n=3, cutoff=0.6)
    if len(options) <= MAX_LISTED:
        return f"one of {', '.join(options)}" + (f" (did you mean {close[0]}?)" if close else "")
    if close:
        return f"did you mean {' or '.join(close)}? ({len(options)} {what})"
    return f"one of the {len(options)} {what}"


def _reworded(exc: Exception, overrides: Sequence[str], loader, config_name: str) -> str:
    """One line for a composition error of Hydra's."""

    text = "\n".join(str(e).strip() for e in (exc, exc.__cause__) if e is not None)
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, OverrideParseException):

        parser = OverridesParser.create()
        for override in overrides:
            try:
                parser.parse_overrides([override])
            except OverrideParseException as one:
                return f"{override} is not allowed: not an override Hydra can parse ({str(one).splitlines()[0]})"
        return f"the command line is not allowed: {first}"
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options is not None:
        group, _, value = exc.missing_cfg_file.rpartition("/")
        override = _override_for(group, overrides)
        return f"{override} is not allowed: {_options_line(value, sorted(exc.options), f'options in conf/{group}/')}"
    if first.startswith("Could not append to config. An item is already at '"):
        key = first.split("'")[1]
        override = _override_for(key, overrides)
        value = override.split("=", 1)[1] if "=" in override else ""
        return f"{override} is not allowed: {key} exists already; set it with {key}={value}"
    if first.startswith("Could not override '"):
        key = first.split("'")[1]
        override = _override_for(key, overrides)
        value = override.split("=", 1)[1] if "=" in override else ""
        if "No match in the defaults list" in text:
            return f"{override} is not allowed: {key} is not in the defaults list; add it with +{key}={value}"
        if "is not in struct" in text:
            parent, _, leaf = key.rpartition(".")
            keys = _keys_at(loader, config_name, parent)
            if keys is not None:
                where = parent or "the config"
                return f"{override} is not allowed: {where} has no key {leaf}: {_options_line(leaf, keys, f'keys of {where}')}"
        return f"{override} is not allowed: {first}"
    if first.startswith("Could not delete"):
        key = first.split("'")[1] if "'" in first else first
        return f"{_override_for(key, overrides)} is not allowed: {first}"
    return f"the command line is not allowed: {first}"


def _keys_at(loader, config_name: str, dotted: str) -> list[str] | None:
    """The keys of the default config's node at `dotted` ('' = the root), or None where it is not a mapping."""

    try:
        cfg = loader.load_configuration(config_name, [], RunMode.RUN)
    except Exception:  # noqa: BLE001 - only the hint is lost
        return None
    node = OmegaConf.select(cfg, dotted) if dotted else cfg
    if not isinstance(node, DictConfig):
        return None
    return sorted(str(k) for k in node if k != "hydra")


def _compose(loader, config_name: str, overrides: list[str], mode) -> None:

    try:
        loader.load_configuration(config_name, overrides, mode)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise CommandLineError(_reworded(exc, overrides, loader, config_name)) from None


def check(argv: Sequence[str]) -> None:
    """Raise CommandLineError (one line) when Hydra would refuse the overrides of `run.py ARGV`."""

    args, _ = get_args_parser().parse_known_args(normalized(argv))
    if args.help or args.hydra_help or args.shell_completion:
        return
    commands = [name for name, on in (("--run", args.run), ("--multirun", args.multirun), ("--cfg", args.cfg is not None),
                                      ("--info", args.info is not None)) if on]
    if len(commands) > 1:
        raise CommandLineError(f"{' with '.join(commands)} is not allowed: one of --run, --multirun (-m), --cfg, --info")
    config_name = args.config_name or "config"
    overrides = list(args.overrides)
    loader = config_loader(args.config_dir)
    if not args.multirun:

        try:
            parsed = OverridesParser.create().parse_overrides(overrides)
        except OverrideParseException as exc:
            raise CommandLineError(_reworded(exc, overrides, loader, config_name)) from None
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            raise CommandLineError(f"{sweeps[0]} is not allowed: a list of values sweeps; add -m (--multirun)")
        _compose(loader, config_name, overrides, RunMode.RUN)
        return

    _multirun_jobs(loader, config_name, overrides)


def multirun_jobs(overrides: Sequence[str], config_dir: str | None = None, config_name: str = "config") -> list[list[str]]:
    """The per-job override lists of `python run.py -m OVERRIDES`, in the order Hydra's basic sweeper launches them:
    the `hydra.sweeper.params` the composed config sets (a preset's) before the command line's, their product split
    into jobs. Raises CommandLineError (one line) where Hydra would refuse the overrides."""
    return _multirun_jobs(config_loader(config_dir), config_name, normalized(overrides))


def _multirun_jobs(loader, config_name: str, overrides: list[str]) -> list[list[str]]:
    """`multirun_jobs` with a given loader: the jobs, after checking that the first composes and that every swept
    config group's values are options of the group."""
    _compose(loader, config_name, overrides, RunMode.MULTIRUN)
    cfg = loader.load_configuration(config_name, overrides, RunMode.MULTIRUN)
    params = [f"{k}={v}" for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()]
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *overrides])
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except (HydraException, OverrideParseException, ValueError) as exc:
        raise CommandLineError(_reworded(exc, [*params, *overrides], loader, config_name)) from None
    jobs = [list(job) for job in jobs]
    if not jobs:
        return jobs
    first = jobs[0]
    _compose(loader, config_name, first, RunMode.RUN)
    # The other jobs differ from the first in their values: a swept config group's options must exist (a plain
    # value's key exists, as the first job composed; its value is validated with the rest of the run's config).
    for i, override in enumerate(first):
        key = override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]
        options = _group_options(loader, key)
        if not options:
            continue
        for value in sorted({job[i] for job in jobs if len(job) == len(first)} - {override}):
            name = value.split("=", 1)[1] if "=" in value else value
            if name not in options:
                raise CommandLineError(f"{value} is not allowed: {_options_line(name, options, f'options in conf/{key}/')}")
    return jobs


def _group_options(loader, key: str) -> list[str]:
    """The options of config group `key` (empty when `key` is not a group)."""
    try:
        return sorted(loader.get_group_options(key))
    except Exception:  # noqa: BLE001 - not a group
        return []


def show_config(argv: Sequence[str]) -> None:
    """`python run.py --cfg job|hydra|all [--resolve] [--package P] OVERRIDES`: print the composed config as Hydra's
    `--cfg` does, after validating the run's config as a launch would (a value a run refuses is the same one-line
    ConfigError here). Unlike Hydra's, `--cfg hydra --resolve` resolves the hydra node against the whole config
    (its run directory names `run_root` and the run id)."""
    # here, not at the top: `--help` stays fast; validating loads the runtime (torch)
    from hydra.core.hydra_config import HydraConfig
    from experiments.config import validate_config

    check(argv)
    args, _ = get_args_parser().parse_known_args(normalized(argv))
    loader = config_loader(args.config_dir)
    cfg = loader.load_configuration(args.config_name or "config", list(args.overrides), RunMode.RUN)
    validate_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    HydraConfig.instance().set_config(cfg)
    shown = OmegaConf.to_container(cfg, resolve=bool(args.resolve))
    if args.cfg == "job":
        shown.pop("hydra", None)
    elif args.cfg == "hydra":
        shown = {"hydra": shown["hydra"]}
    if args.package:
        shown = OmegaConf.select(OmegaConf.create(shown), args.package)
        shown = OmegaConf.to_container(shown) if isinstance(shown, (DictConfig, ListConfig)) else shown
    print(OmegaConf.to_yaml(shown) if isinstance(shown, dict | list) else shown, end="")


#: The keys people change most, with what each is; `help_text` shows their defaults from conf/config.yaml.
COMMON_KEYS = (
    ("seed", "the run's seed (data order, initialisation, sampling)"),
    ("train.steps", "optimizer steps"),
    ("train.lr", "peak learning rate"),
    ("benchmark.split", "dev (every choice) or test (final numbers, each read logged)"),
    ("eval.max_target_problems", "evaluate the first N coding problems only (null: all)"),
    ("eval.scales", "scales of the trained update the run is evaluated at (1: as trained)"),
    ("run_root", "where run directories go (<run_root>/<run_id>)"),
    ("reuse_training_from", "run roots whose trained models a run evaluates instead of training again"),
    ("rerun_before", "a commit: runs recorded by older code run again"),
    ("hydra.launcher.jobs", "runs at a time on this machine (local launcher)"),
)
#: Groups with more options than this are shown as a count and their name prefixes.
HELP_LISTED = 24


def help_text(config_dir: str | None = None) -> str:
    """`python run.py --help`: usage, the config groups with their options (read from conf/), the keys people
    change most with their defaults, and where the rest is documented."""
    loader = config_loader(config_dir)
    cfg = loader.load_configuration("config", [], RunMode.RUN)
    lines = ["python run.py [--plan] [-m] [KEY=VALUE ...]",
             "",
             "  Trains and evaluates one run (or, with -m, a sweep over comma-separated values) into <run_root>/<run_id>;",
             "  a complete run is skipped, an interrupted one resumes. --plan lists what a launch would do and runs",
             "  nothing; --cfg job prints the composed config (validated); --hydra-help shows Hydra's own flags.",
             "",
             "Config groups (GROUP=OPTION; -m GROUP=A,B sweeps):"]
    groups = [g for g in loader.list_groups("") if g != "hydra"] + ["hydra/launcher"]
    width = max(map(len, groups))
    for group in groups:
        options = sorted(loader.get_group_options(group))
        if len(options) <= HELP_LISTED:
            shown = ", ".join(options)
        else:
            prefixes = sorted({o.split("_")[0] for o in options})
            shown = f"{len(options)} options ({', '.join(p + '_*' for p in prefixes)}; listed in conf/{group}/)"
        lines.extend(_wrapped(f"  {group:<{width}}  ", shown))
    lines += ["", "Keys people change most (KEY=VALUE):"]
    width = max(len(k) for k, _ in COMMON_KEYS)
    for key, what in COMMON_KEYS:
        default = OmegaConf.select(cfg, key, default="?")
        if key.startswith("hydra.launcher."):
            default = OmegaConf.select(cfg, key, default=1)
        if isinstance(default, (DictConfig, ListConfig)):
            default = OmegaConf.to_container(default)
        shown = json.dumps(default) if isinstance(default, (list, dict)) or default is None else default
        lines.append(f"  {key:<{width}}  {what}; default {shown}")
    lines += ["", "Every key with its default: python run.py --cfg job. Examples:",
              "  python run.py benchmark.split=dev                 # the default ATLAS run on the micro benchmark",
              "  python run.py --plan -m method=atlas,lora seed=0,1,2",
              "  python run.py -m experiment=micro_main hydra.launcher.jobs=2"]
    return "\n".join(lines)


def _wrapped(head: str, text: str, width: int = 118) -> list[str]:
    """`head` + `text` wrapped at `width` columns, continuation lines indented under the text."""
    return textwrap.wrap(text, width=width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False) or [head.rstrip()]


def exit_on_error(argv: Sequence[str]) -> None:
    """:func:`check`, printing `error: ...` and exiting with code 2 on a bad override."""
    try:
        check(argv)
    except CommandLineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exit_codes.BAD_CONFIG)
