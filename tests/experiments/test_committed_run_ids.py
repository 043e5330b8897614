"""Every committed record's run id, computed again from today's config tree: the record's method composed from
`conf/` with only what the record says was chosen (its method knobs away from the registry's values, train steps and
lr, seed, split, protected domains) must give the record's own run id, so refactoring the YAML (inheritance, options
moved between files) keeps every finished run findable. The only records that differ are those made on an earlier
benchmark (`EARLIER_BENCHMARK`); they may differ in `benchmark.*` and in keys the config gained after them, and
each is listed with the keys. Records whose method is defined otherwise today (`earlier_definition`) are not made again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.schema import defined_method
from experiments.config import validate_config
from suite_schema import registry, run_identity
from suite_schema.layout import RECORD_NAME, SCALES_DIR
from tests.conftest import REPO

RESULTS = REPO / "docs" / "results"
ABSENT = "<absent>"
#: Committed studies made on an earlier benchmark, and why their runs cannot be made again from today's tree.
EARLIER_BENCHMARK = {
    "docs/results/micro_extended": "made on the first micro world (commit 04d9fe3): no dev split, the test split named "
                                   "'evaluation' (docs/results/micro_extended/README.md)",
}


def committed_records() -> dict[str, tuple[Path, dict]]:
    """run id -> (first file, record) of every committed run's own record (post-hoc scale records excluded)."""
    out: dict[str, tuple[Path, dict]] = {}
    for path in sorted(RESULTS.rglob(RECORD_NAME)):
        if SCALES_DIR in path.relative_to(RESULTS).parts:
            continue
        record = json.loads(path.read_text())
        out.setdefault(record["run_id"], (path, record))
    return out


def earlier_definition(record: dict) -> bool:
    """Whether a record's method ran under an earlier definition than today's (`analysis.schema.defined_method`): such
    a run cannot be made again."""
    return defined_method(record["method"], record["knobs"]) != record["method"]


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def overrides_of(config: dict) -> list[str]:
    """The command-line overrides that make a record's run from today's tree: its method, the method knobs whose
    value is not the registry's (a key of `LATER_KEYS` the record lacks at its earlier value), train steps and lr,
    seed, benchmark, split and protected domains."""
    method = config["method"]
    defaults = registry.method_values(method["name"])
    out = [f"method={method['name']}", f"seed={config['seed']}", f"train.steps={config['train']['steps']}",
           f"train.lr={config['train']['lr']}", f"benchmark.split={config['benchmark'].get('split', 'test')}"]
    if (registry.CONF / "benchmark" / f"{config['benchmark']['name']}.yaml").is_file():
        out.append(f"benchmark={config['benchmark']['name']}")  # the earlier micro world is no longer the default
    if config["benchmark"].get("protect") is not None:
        out.append(f"benchmark.protect={_text(config['benchmark']['protect'])}")
    out += [f"method.{k}={_text(v)}" for k, v in method.items() if k != "name" and defaults.get(k, ABSENT) != v]
    for dotted, earlier in run_identity.LATER_KEYS.items():
        key = dotted.split(".", 1)[1]
        if key in defaults and key not in method and defaults[key] != earlier:
            out.append(f"method.{key}={_text(earlier)}")
    return out


def _flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_every_committed_record_holds_the_config_its_run_id_hashes():
    files = [p for p in RESULTS.rglob(RECORD_NAME) if SCALES_DIR not in p.relative_to(RESULTS).parts]
    assert len(files) > 250  # the committed studies (docs/results), not an empty glob
    wrong = [str(p) for p in files
             if run_identity.run_id_of((record := json.loads(p.read_text()))["config"]) != record["run_id"]]
    assert not wrong, wrong


@pytest.mark.slow
def test_committed_run_ids_recompute_from_todays_config_tree(capsys):
    records = committed_records()
    changed = {}
    # Composed once per config without its seed (no value in conf/ reads the seed: checked here), then given each
    # record's seed: composing is most of this test's time, and most configs ran at several seeds.
    assert not [p for p in registry.CONF.rglob("*.yaml") if "${seed}" in p.read_text()]
    composed: dict[tuple[str, ...], dict] = {}
    with initialize_config_dir(config_dir=str(registry.CONF), version_base="1.3"):
        for run_id, (path, record) in records.items():
            if earlier_definition(record):
                continue  # its method is defined otherwise today (checked below)
            overrides = overrides_of(record["config"])
            unseeded = tuple(o for o in overrides if not o.startswith("seed="))
            if unseeded not in composed:
                typed = validate_config(compose("config", overrides=list(overrides)))
                composed[unseeded] = run_identity.scientific_config(OmegaConf.to_container(typed, resolve=True))
            now = {**composed[unseeded], "seed": record["config"]["seed"]}
            if run_identity.run_id_of(now) != run_id:
                was, is_now = _flat(record["config"]), _flat(now)
                changed[run_id] = (path, {k: (was.get(k, ABSENT), is_now.get(k, ABSENT))
                                          for k in sorted(set(was) | set(is_now)) if was.get(k, ABSENT) != is_now.get(k, ABSENT)})
    redefined = [run_id for run_id, (_, record) in records.items() if earlier_definition(record)]
    # Only the five baselines that follow their authors since 2026-12 (CHANGELOG.md) are redefined.
    assert {records[run_id][1]["method"] for run_id in redefined} <= {"lwf", "inflora", "ewc", "corda", "loranull"}
    with capsys.disabled():
        print(f"\n{len(records) - len(changed) - len(redefined)} of {len(records)} committed run ids recompute equal "
              f"from conf/; {len(redefined)} were made under an earlier definition of their method")
        for run_id, (path, diff) in changed.items():
            print(f"  {run_id} {path.relative_to(REPO)}: differs in {', '.join(diff)}")
    folders = {str(path.relative_to(REPO)).split("/records/")[0] for path, _ in changed.values()}
    assert folders <= set(EARLIER_BENCHMARK), folders - set(EARLIER_BENCHMARK)
    assert all(key.startswith("benchmark.") or was == ABSENT for _, diff in changed.values()
               for key, (was, _) in diff.items()), changed
    earlier = [run_id for run_id, (path, _) in records.items() if str(path.relative_to(REPO)).split("/records/")[0]
               in EARLIER_BENCHMARK]
    assert sorted(changed) == sorted(set(earlier) - set(redefined))  # every run of an earlier benchmark differs, and no other run
