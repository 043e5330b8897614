"""The paper's experiments as presets (conf/experiment/*.yaml): each composes, and its multirun expands,
exactly as `python run.py -m experiment=NAME` would, into the expected set of valid, distinct runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from experiments.config import validate_config
from experiments.job import run_id_for
from suite_schema import registry, run_identity
from tests.conftest import REPO, run_cli, sweep_jobs

CONF = REPO / "conf"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
POINTS = sorted(p.stem for p in (CONF / "point").glob("*.yaml"))
FIVE = ("qwen3-8b", "qwen3-4b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-2-9b")
# The tuning presets, evaluated on the dev split (seeds 0 and 1; micro_tune_1pt, the 2-hour cut, seed 0); every other
# preset is evaluated on the test split.
DEV = ("micro_tune", "paper_tune", "micro_tune_extended", "micro_tune_1pt", "micro_v3_tune")
SEEDS = {"micro_defaults": (0,), "micro_tune_1pt": (0,), "micro_v3_main": (0, 1, 2, 3, 4),
         **{preset: (0, 1) for preset in DEV if preset != "micro_tune_1pt"}}
# Which tuning preset chose (or, for paper_main, is) each evaluation preset's points, and how many points per method.
TUNED_BY = {"micro_main": ("micro_tune", 2), "micro_backbones": ("micro_tune", 2), "micro_main_1pt": ("micro_tune", 1),
            "micro_tune_1pt": ("micro_tune", 2), "micro_extended": ("micro_tune_extended", 2),
            "micro_v3_main": ("micro_v3_tune", 2), "paper_main": ("paper_tune", 4), "paper_backbones": ("paper_tune", 4)}
# The methods each tuning preset may tune (registry groups) besides the base, and the candidates each gets;
# micro_tune_extended also runs the reference (LoRA at its defaults) the levels are shares of.
TUNES = {"micro_tune": (("reference", "baseline", "retained"), 4), "paper_tune": (("reference", "baseline", "retained"), 4),
         "micro_tune_extended": (("extended",), 4), "micro_v3_tune": (("reference", "baseline", "retained"), 9)}


# `+point=` overrides of the points chosen on dev under their method's earlier definition (conf/point/*.yaml marked
# "# Stale:"): the decisive re-run tunes those methods again.
STALE = {f"+point={p.stem}" for p in (REPO / "conf/point").glob("*.yaml") if "\n# Stale: chosen under" in p.read_text()}


def expand(preset: str, *extra: str) -> list[list[str]]:
    """The per-job override lists of `python run.py -m experiment=PRESET EXTRA...` (Hydra's basic sweeper)."""
    return sweep_jobs([f"experiment={preset}", *extra])


_CONFIGS: dict[tuple[str, ...], Any] = {}


def configs_of(jobs: list[list[str]]) -> list:
    """The validated configs of jobs given as override lists, each composed once per test process (composing is
    most of this module's time, and several tests read the same presets' jobs; none changes a config)."""
    missing = [tuple(job) for job in jobs if tuple(job) not in _CONFIGS]
    if missing:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            for job in missing:
                _CONFIGS[job] = validate_config(compose("config", overrides=list(job)))
    return [_CONFIGS[tuple(job)] for job in jobs]


def jobs_of(preset: str, seed: int | None = None) -> list:
    """The validated configs of a preset's jobs (only those of `seed` when given)."""
    return configs_of([j for j in expand(preset) if seed is None or f"seed={seed}" in j])


def run_ids_of(jobs: list[list[str]]) -> list[str]:
    """The run ids of jobs given as override lists (as `expand` returns them)."""
    return [run_id_for(c) for c in configs_of(jobs)]


def methods_of(preset: str) -> Counter:
    """How many seed-0 jobs of `preset` run each method (on paper_backbones: on one backbone)."""
    cfgs = jobs_of(preset, seed=0)
    if preset == "paper_backbones":
        cfgs = [c for c in cfgs if c.backbone.name == "qwen3-8b"]
    return Counter(c.method.name for c in cfgs)


def test_every_preset_has_a_micro_twin_and_a_role():
    paper = {p for p in PRESETS if p.startswith("paper_")}
    assert paper == {"paper_main", "paper_backbones", "paper_retained", "paper_ablations", "paper_tune"}
    assert {p.replace("paper_", "micro_") for p in paper} <= set(PRESETS)
    roles = set(TUNED_BY) | set(TUNES) | {"micro_tune_1pt", "micro_defaults"} | {p for p in PRESETS if p.endswith(
        ("_retained", "_ablations"))}
    assert set(PRESETS) == roles
    # the methods beyond the paper: at their defaults with WiSE-FT scales, and under micro_main's protocol
    assert {"micro_defaults", "micro_tune_extended", "micro_extended"} <= set(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_on_the_command_line(preset):
    proc = run_cli([f"experiment={preset}", "--cfg", "job"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "backbone:" in proc.stdout and "method:" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_multirun_expands_to_distinct_valid_runs(preset):
    jobs = expand(preset)
    seeds = Counter(o for job in jobs for o in job if o.startswith("seed="))
    expected_seeds = SEEDS.get(preset, (0, 1, 2))
    assert seeds == {f"seed={s}": len(jobs) // len(expected_seeds) for s in expected_seeds}
    # Seeds change nothing else, so seed 0's jobs stand for the rest (and keep the test fast).
    cfgs = jobs_of(preset, seed=0)
    assert len(cfgs) == len(jobs) // len(expected_seeds) and all(c.seed == 0 for c in cfgs)
    ids = [run_id_for(c) for c in cfgs]
    assert len(set(ids)) == len(ids), "two jobs of one preset would share a run directory"
    micro = preset.startswith("micro_")
    assert {c.backbone.name for c in cfgs} == ({"micro"} if micro else set(FIVE) if preset == "paper_backbones"
                                                else {"qwen3-8b"})
    assert all(c.benchmark.split == ("dev" if preset in DEV else "test") for c in cfgs)
    if preset.endswith("_retained"):
        assert Counter(tuple(c.benchmark.protect) for c in cfgs) == {("math",): len(cfgs) // 2,
                                                                     ("commonsense",): len(cfgs) // 2}
    else:
        assert all(c.benchmark.protect is None for c in cfgs)
    if micro:
        assert all(c.eval.max_new_tokens_code == 128 for c in cfgs)
        assert all(c.train.lr == 3.0e-3 for c in cfgs if c.method.name != "fullft")
        full_lrs = {c.train.lr for c in cfgs if c.method.name == "fullft"}  # its own rates (conf/method/fullft.yaml)
        assert full_lrs <= {1.0e-5, 3.0e-5, 1.0e-4, 3.0e-4}
        assert all(c.train.steps <= 600 for c in cfgs)  # no point trains longer than the default budget
    else:  # the real backbones' training and generation lengths (conf/train/paper.yaml, conf/eval/paper.yaml)
        assert all(c.train.lr == 2.0e-4 and c.eval.max_new_tokens_code == 512 and c.eval.max_new_tokens_math == 384
                   for c in cfgs)
        assert all(c.backbone.dtype == "bfloat16" for c in cfgs)
        assert all(c.train.steps <= 1250 for c in cfgs)


@pytest.mark.parametrize("preset", sorted(TUNES))
def test_tuning_presets_give_every_method_they_tune_the_same_budget(preset):
    """Equal budget on dev: the same number of points per method along its knob (4; micro_v3_tune 5 and 2 in each of
    its extension rounds), none longer than the default budget, of the methods of the registry groups the preset tunes,
    plus the base model (and, for the extended methods, the reference)."""
    methods = methods_of(preset)
    groups, candidates = TUNES[preset]
    allowed = set(registry.members(*groups))
    extra = {"base": 1, "lora": 1} if preset == "micro_tune_extended" else {"base": 1}
    assert {m: methods[m] for m in extra} == extra
    tuned = {m: n for m, n in methods.items() if m not in extra}
    assert tuned and set(tuned) <= allowed and set(tuned.values()) == {candidates}, tuned
    budget = registry.group_values("train", "default" if preset.startswith("micro_") else "paper")["steps"]
    assert max(c.train.steps for c in jobs_of(preset)) == budget


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(TUNED_BY))
def test_evaluation_presets_run_the_methods_their_tuning_chose_at_equal_budget(preset):
    tune, per_method = TUNED_BY[preset]
    methods = methods_of(preset)
    reference = {"lora": 1} if tune == "micro_tune_extended" else {}
    assert methods["base"] == 1 and set(methods) == set(methods_of(tune))
    assert {m: n for m, n in methods.items() if m != "base" and m not in reference} == {
        m: per_method for m in methods_of(tune) if m != "base" and m not in reference}
    assert all(methods[m] == n for m, n in reference.items())


def test_defaults_preset_runs_each_method_once_at_its_defaults():
    """micro_defaults: every method it lists at the values of its own conf/method file (full fine-tuning at
    train.lr 1e-4, conf/method/fullft.yaml), once, none an ablation; each trained run at the WiSE-FT scales."""
    cfgs = jobs_of("micro_defaults", seed=0)
    methods = Counter(c.method.name for c in cfgs)
    assert set(methods.values()) == {1} and not set(methods) & set(registry.members("ablation"))
    assert {"base", "atlas", "lora"} <= set(methods) <= set(registry.method_names())
    for c in cfgs:
        knobs = {k: v for k, v in c.method.items() if k not in registry.NOT_HYPERPARAMETERS}
        assert knobs == registry.method_values(c.method.name), c.method.name
    assert all(list(c.eval.scales) == [0.0, 0.25, 0.5, 0.75, 1.0] for c in cfgs)
    assert next(c for c in cfgs if c.method.name == "fullft").train.lr == 1.0e-4


@pytest.mark.parametrize("family", ["micro", "paper"])
def test_ablation_presets_run_atlas_and_each_of_its_variants_alike(family):
    methods = methods_of(f"{family}_ablations")
    assert set(methods) == set(registry.members("reference", "ablation")) and len(set(methods.values())) == 1


@pytest.mark.slow
def test_main_presets_sweep_each_method_knob():
    """The main presets' points move the knob each method's authors name: micro_main's 2 tuned points per method
    (ATLAS's along `conditioning`, LoRA's including the reference, LoRA at its defaults, that the report's levels are
    shares of, every other method at the default budget), paper_main's 4 grid points (ATLAS's 4 conditionings,
    LoRA's steps up to the budget)."""
    def by_method(preset):
        out: dict = {}
        for c in jobs_of(preset, seed=0):
            out.setdefault(c.method.name, []).append(c)
        return out

    paper = by_method("paper_main")
    assert len({c.method.conditioning for c in paper["atlas"]}) == 4
    assert max(c.train.steps for c in paper["lora"]) == 625
    micro = by_method("micro_main")
    assert len({c.method.conditioning for c in micro["atlas"]}) == 2
    assert 600 in {c.train.steps for c in micro["lora"]}
    assert all(c.train.steps == 600 for name, cs in micro.items() if name != "lora" for c in cs)


@pytest.mark.slow
def test_one_point_presets_are_the_full_protocol_cut_to_its_high_points():
    """The 2-hour cut (docs/reproducing.md): micro_tune_1pt runs, on dev, exactly micro_tune's runs of the two points
    per method that micro_main reads (same run ids, so a full micro_tune in the same run root leaves nothing to run),
    and micro_main_1pt one of them per method at seeds 0, 1, 2, at micro_main's post-hoc scales: LoRA's is the
    reference, every other is micro_main's first point (its high one)."""
    main_on_dev = [job for job in expand("micro_main", "benchmark.split=dev") if "seed=0" in job]
    assert sorted(run_ids_of(expand("micro_tune_1pt"))) == sorted(run_ids_of(main_on_dev))
    # A point chosen under its method's earlier definition (marked stale) need not be on today's grid.
    tuned = [job for job in expand("micro_tune_1pt") if not any(o in STALE for o in job)]
    assert set(run_ids_of(tuned)) <= set(run_ids_of(expand("micro_tune")))
    for seed in (0, 1, 2):
        cut = jobs_of("micro_main_1pt", seed=seed)
        assert Counter(c.method.name for c in cut) == {m: 1 for m in methods_of("micro_tune")}
        first = [job for job in expand("micro_main") if f"seed={seed}" in job
                 and any(o.startswith("+point=") and (o.endswith("_1") or o.endswith("_base")) for o in job)]
        assert sorted(run_id_for(c) for c in cut) == sorted(run_ids_of(first))
        assert {c.train.steps for c in cut if c.method.name == "lora"} == {600}
        assert {tuple(c.eval.scales) for c in cut} == {tuple(c.eval.scales) for c in jobs_of("micro_main", seed=0)}


@pytest.mark.slow
def test_extended_presets_reuse_micro_main_and_micro_tune_runs():
    """eval.scales is not part of the run id: micro_defaults's runs of paper methods at points micro_main also
    runs (base, the default ATLAS and LoRA, ...) are micro_main's seed-0 runs; the extra methods are not.
    micro_extended's base and reference are micro_main's runs at every seed, and micro_tune_extended's are
    micro_tune's, so the thirteen methods share the levels' runs."""
    main_ids = {run_id_for(c) for c in jobs_of("micro_main", seed=0)}
    defaults = {c.method.name: run_id_for(c) for c in jobs_of("micro_defaults", seed=0)}
    assert {defaults[m] for m in ("base", "atlas", "lora", "replay", "ewc", "lwf")} <= main_ids
    assert not {defaults[m] for m in registry.members("extended") if m in defaults} & main_ids
    for seed in (0, 1, 2):
        main = {run_id_for(c) for c in jobs_of("micro_main", seed=seed)}
        extended = {run_id_for(c): c.method.name for c in jobs_of("micro_extended", seed=seed)}
        assert sorted(name for run_id, name in extended.items() if run_id in main) == ["base", "lora"]
    tune = {run_id_for(c) for c in jobs_of("micro_tune")}
    tune_extended = {run_id_for(c): c.method.name for c in jobs_of("micro_tune_extended")}
    assert sorted(name for run_id, name in tune_extended.items() if run_id in tune) == ["base", "base", "lora", "lora"]  # at seeds 0 and 1


@pytest.mark.slow
@pytest.mark.parametrize("family", ["micro", "paper"])
def test_presets_sharing_the_main_runs_evaluate_its_scales(family):
    """The backbones and ablations presets share runs with the main sweep (skipped once complete), so they evaluate
    the main sweep's post-hoc scales: a shared record is complete for both and every table's fronts are built the
    same way. The backbones preset is the main sweep's points on the backbone axis (on micro: the same runs)."""
    main = jobs_of(f"{family}_main", seed=0)
    scales = {tuple(c.eval.scales) for c in main}
    assert len(scales) == 1 and len(next(iter(scales))) > 1
    for preset in (f"{family}_backbones", f"{family}_ablations"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # the preset's own eval.scales
            assert tuple(compose("config", overrides=[f"experiment={preset}"]).eval.scales) in scales, preset
    main_ids = {run_id_for(c) for c in main}
    on_main_backbone = [job for job in expand(f"{family}_backbones") if "seed=0" in job
                        and f"backbone={main[0].backbone.name}" in job]  # composing the other backbones adds nothing
    assert set(run_ids_of(on_main_backbone)) == main_ids
    atlas = [job for job in expand(f"{family}_ablations") if "seed=0" in job and "method=atlas" in job]
    shared = [run_id for run_id in run_ids_of(atlas) if run_id in main_ids]
    assert len(atlas) == {"micro": 2, "paper": 3}[family] and len(shared) == 1  # ATLAS at the default length: main's


@pytest.mark.slow
@pytest.mark.parametrize("family", ["micro", "paper"])
def test_retained_presets_run_the_main_points_of_the_methods_that_read_retained_data(family):
    def points(preset):
        return {o.split("=", 1)[1] for job in expand(preset) for o in job if o.startswith("+point=")}

    main = {p for p in points(f"{family}_main") if "_base" not in p and "_lora_" not in p}
    assert main and points(f"{family}_retained") == main
    assert {c.method.name for c in jobs_of(f"{family}_retained", seed=0)} == set(methods_of(f"{family}_main")) - {
        "base", "lora"}  # LoRA and the base model read no retained data


def test_default_points_are_the_plain_method_runs():
    """A point at a method's defaults is the same run (same id) as `run.py method=NAME`, so presets share runs."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for point, method in (("micro_atlas_q90", "atlas"), ("micro_lora_s600", "lora"), ("micro_base", "base")):
            via_point = validate_config(compose("config", overrides=[f"+point={point}", "seed=1"]))
            plain = validate_config(compose("config", overrides=[f"method={method}", "seed=1"]))
            assert run_id_for(via_point) == run_id_for(plain), point


def test_every_point_is_used_by_a_preset():
    used = {job_point for preset in ("micro_main", "paper_main", "micro_defaults", "micro_tune", "paper_tune",
                                     "micro_tune_extended", "micro_extended", "micro_main_1pt", "micro_v3_tune",
                                     "micro_v3_main")
            for job in expand(preset) for job_point in [o.split("=", 1)[1] for o in job if o.startswith("+point=")]}
    assert used == set(POINTS)


@pytest.mark.slow
def test_micro_run_ids_are_unchanged():
    """Refactors keep the science: every seed-0 job of every micro preset (and `python run.py` with no
    overrides) has the run id recorded in fixtures/micro_run_ids.json, so finished runs are still found.
    A change of science regenerates the file on purpose and says why in the commit."""
    import json

    golden = json.loads((REPO / "tests/experiments/fixtures/micro_run_ids.json").read_text())
    jobs = {preset: [job for job in expand(preset) if not any(o in job for o in ("seed=1", "seed=2"))]
            for preset in PRESETS if preset.startswith("micro_")}
    now = {"defaults": {"(no overrides)": run_ids_of([[]])[0]}}
    for preset, preset_jobs in jobs.items():
        now[preset] = {" ".join(sorted(o for o in job if not o.startswith("experiment="))): run_id
                       for job, run_id in zip(preset_jobs, run_ids_of(preset_jobs))}
    assert now == golden


def test_a_key_added_later_changes_the_run_id_only_away_from_its_earlier_behaviour():
    """`LATER_KEYS` (suite_schema/run_identity.py): ATLAS's `filter_basis: null` and `filter_members: kmeans` compute what runs
    did before the keys existed, so at those values the keys are left out of the run id, and the runs made then
    (the default's run id before the defaults became assigned filters in a 32-direction basis) keep their ids;
    any other value, the defaults included, is another run."""
    from omegaconf import OmegaConf

    earlier_default_run = "73794eee4b142921"  # `python run.py` before the change of defaults (committed, earlier world)
    (cfg,) = configs_of([["benchmark=micro", "method.filter_basis=null", "method.filter_members=kmeans"]])
    assert run_id_for(cfg) == earlier_default_run
    data = OmegaConf.to_container(cfg, resolve=True)
    assert {"filter_basis", "filter_members"} <= set(data["method"])
    assert not {"filter_basis", "filter_members"} & set(run_identity.scientific_config(data)["method"])
    plain = run_ids_of([[]])[0]
    others = run_ids_of([["method.filter_basis=null"], ["method.filter_members=kmeans"]])
    assert len({earlier_default_run, plain, *others}) == 4
