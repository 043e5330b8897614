"""Config composition and validation before any compute: every error names key, value and what is allowed."""


import pytest
from hydra import compose, initialize_config_dir

from experiments.backbones import BackboneError
from experiments.config import validate_config
from experiments.data.benchmark import build_benchmark
from experiments.data.loaders import DataError
from experiments.job import preflight_backbone, run_id_for
from experiments.methods import MethodConfigError, build_method, build_named
from experiments.validation import ConfigError
from tests.conftest import REPO, run_cli

CONF = str(REPO / "conf")
BACKBONES = sorted(p.stem for p in (REPO / "conf" / "backbone").glob("*.yaml"))
METHODS = sorted(p.stem for p in (REPO / "conf" / "method").glob("*.yaml"))


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_paper_backbones_and_micro_exist():
    assert {"micro", "qwen3-8b", "qwen3-4b", "qwen3-0.6b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-2-9b"} <= set(BACKBONES)


@pytest.mark.slow
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_and_backbone_composes_and_validates(method, backbone):
    cfg = validate_config(composed(f"method={method}", f"backbone={backbone}"))
    assert cfg.method.name == method
    # The benchmark follows the backbone: micro backbone => the micro world v3; real ones => paper.
    assert cfg.benchmark.name == ("micro_v3" if backbone == "micro" else "paper")


def test_benchmark_override_beats_the_backbone_default():
    assert composed("backbone=qwen3-8b", "benchmark=micro").benchmark.name == "micro"


def test_eval_settings_follow_the_backbone_and_can_be_overridden():
    assert composed().eval.max_new_tokens_math == 96
    assert composed("backbone=qwen3-8b").eval.max_new_tokens_math == 384
    assert composed("backbone=qwen3-8b", "eval=micro").eval.max_new_tokens_math == 96
    assert composed("backbone=qwen3-8b", "eval.max_new_tokens_code=7").eval.max_new_tokens_code == 7


def sweep_jobs(*args):
    """The per-job override lists Hydra's basic sweeper expands a `-m` command line into."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(args))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


@pytest.mark.slow
def test_readme_sweep_composes_without_other_overrides():
    methods = ",".join(m for m in ("atlas", "lora") if m in METHODS)
    jobs = sweep_jobs(f"method={methods}", "backbone=qwen3-8b", "seed=0,1,2")
    assert len(jobs) == 3 * len(methods.split(","))
    ids = set()
    for job in jobs:
        cfg = validate_config(composed(*job))
        assert cfg.backbone.path == "Qwen/Qwen3-8B" and cfg.benchmark.name == "paper"
        ids.add(run_id_for(cfg))
    assert len(ids) == len(jobs)  # every job of the sweep is a distinct run
    # The real entry point prints one job's config without touching the hub.
    proc = run_cli([*jobs[0], "--cfg", "job"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Qwen/Qwen3-8B" in proc.stdout


def test_run_id_ignores_presentation_keys_and_tracks_science():
    base = run_id_for(composed())
    assert run_id_for(composed("logger=wandb", "train.progress=false", "run_root=/elsewhere")) == base
    assert run_id_for(composed("seed=1")) != base
    assert run_id_for(composed("method.rank=4")) != base


@pytest.mark.slow
def test_unknown_method_lists_valid_names():
    proc = run_cli(["method=nosuch", "--cfg", "job"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: method=nosuch is not allowed: one of ")
    for name in METHODS:
        assert name in proc.stderr


@pytest.mark.slow
def test_unknown_backbone_lists_valid_names():
    proc = run_cli(["backbone=nosuch", "--cfg", "job"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: backbone=nosuch is not allowed: one of ")
    assert "qwen3-8b" in proc.stderr and "micro" in proc.stderr


def test_rank_must_be_positive():
    with pytest.raises(ConfigError, match=r"method.rank=0 is not allowed: an integer > 0"):
        validate_config(composed("method.rank=0"))
    with pytest.raises(MethodConfigError, match=r"method.rank=-2 is not allowed: an integer > 0"):
        build_named("lora", rank=-2)
    with pytest.raises(MethodConfigError, match=r"method.target_modules=\?\?\? is not allowed: a value"):
        build_method({"_target_": "baselines.lora.LoRA", "name": "lora", "rank": 2})


def test_negative_learning_rate():
    with pytest.raises(ConfigError, match=r"train.lr=-0.1 is not allowed: a number >= 0"):
        validate_config(composed("train.lr=-0.1"))


def test_type_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"train.steps"):
        validate_config(composed("train.steps=many"))


def test_bad_enum_values_list_what_is_allowed():
    with pytest.raises(ConfigError, match=r"train.scheduler='wavy' is not allowed: one of \['constant', 'linear', 'cosine'\]"):
        validate_config(composed("train.scheduler=wavy"))
    with pytest.raises(ConfigError, match=r"logger.mode='loud'"):
        validate_config(composed("logger=wandb", "logger.mode=loud"))
    assert validate_config(composed("logger=wandb", "logger.group=g1")).logger.group == "g1"
    with pytest.raises(ConfigError, match=r"logger.job_type='' is not allowed: null \(derived\) or a name"):
        validate_config(composed("logger=wandb", "logger.job_type=''"))


def test_missing_local_data_path(tmp_path):
    cfg = validate_config(composed(f"benchmark.retained.math.local={tmp_path / 'absent'}"))
    with pytest.raises(DataError, match=r"local=.*absent.* is not allowed: a path that exists"):
        build_benchmark(cfg.benchmark)


def test_paper_benchmark_with_missing_data_root(tmp_path):
    cfg = validate_config(composed("backbone=qwen3-8b", f"benchmark.data_root={tmp_path}"))
    with pytest.raises(DataError, match=r"benchmark.data_root=.* is not allowed: a path that exists \(.*gpteacher_codegen.* does not"):
        build_benchmark(cfg.benchmark)


def test_empty_dataset(tmp_path, tiny_benchmark_dir):
    (tmp_path / "calibration.jsonl").write_text("")
    cfg = validate_config(composed(f"benchmark.retained.math.local={tmp_path}",
                                   f"benchmark.target.train.local={tiny_benchmark_dir / 'code'}"))
    with pytest.raises(DataError, match=r"split 'calibration' is empty"):
        build_benchmark(cfg.benchmark)


def test_missing_target_modules(tiny_backbone_dir):
    cfg = validate_config(composed(f"backbone.path={tiny_backbone_dir}", "backbone.target_modules=[q_proj,c_attn]"))
    with pytest.raises(BackboneError, match=r"backbone.target_modules=\['q_proj', 'c_attn'\] is not allowed: names of the model's Linear modules \(\['c_attn'\] not found; allowed: \[.*'q_proj'"):
        preflight_backbone(cfg.backbone)


@pytest.mark.slow
def test_validation_errors_are_one_line_on_the_command_line(tiny_backbone_dir):
    proc = run_cli([f"backbone.path={tiny_backbone_dir}", "backbone.target_modules=[nope]"], timeout=120)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    assert lines[-1].startswith("error: backbone.target_modules=['nope']"), proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr


def test_paper_benchmark_loads_from_local_copies(shared_data):
    cfg = validate_config(composed("backbone=qwen3-8b", f"benchmark.data_root={shared_data}",
                                   "benchmark.target.train.max_items=50"))
    bench = build_benchmark(cfg.benchmark)
    assert len(bench.target_train) == 50
    assert sum(p.get("suite") == "humaneval" for p in bench.target_eval) == 164
    assert len(bench.retained["math"].calibration) == 1000 and len(bench.retained["math"].evaluation) == 500
    assert len(bench.retained["commonsense"].evaluation) == 500


def test_unknown_method_hyperparameter_lists_allowed():
    with pytest.raises(MethodConfigError, match=r"method.rnak=4 is not allowed: a parameter of baselines.lora.LoRA, one of \[.*'rank'"):
        build_method({"_target_": "baselines.lora.LoRA", "name": "lora", "rnak": 4})


@pytest.mark.parametrize("group,schema", [("backbone", "BackboneConfig"), ("train", "TrainConfig"), ("eval", "EvalConfig")])
def test_every_value_is_written_once(group, schema):
    """The schema declares types only (every field MISSING); each YAML of the group, with the same-group files its
    `defaults` list names, sets every key (so `group.key=value` works without `+`), and a file that starts from
    another writes only the values it changes."""
    from dataclasses import MISSING as NO_DEFAULT
    from dataclasses import fields

    from omegaconf import MISSING, OmegaConf

    import experiments.config as C

    cls = getattr(C, schema)
    names = {f.name for f in fields(cls)}
    assert all(f.default == MISSING and f.default_factory is NO_DEFAULT for f in fields(cls)), schema

    def composed(path):
        raw = OmegaConf.to_container(OmegaConf.load(path))
        out = {}
        for parent in raw.pop("defaults", []):
            if isinstance(parent, str) and parent != "_self_":
                inherited = composed(path.parent / f"{parent}.yaml")
                repeated = {k for k, v in raw.items() if k in inherited and inherited[k] == v}
                assert not repeated, f"{path.name} repeats {parent}.yaml's values of {sorted(repeated)}"
                out.update(inherited)
        return {**out, **{k: v for k, v in raw.items() if not isinstance(v, dict) or k != "defaults"}}

    for path in sorted((REPO / "conf" / group).glob("*.yaml")):
        missing = names - set(composed(path))
        assert not missing, f"{path.name} lacks {sorted(missing)}"


def test_train_defaults_are_written_in_one_place():
    """Each training default has one home, conf/train/default.yaml: not the schema, not `train()`'s signature."""
    import inspect

    from experiments.train import train

    params = inspect.signature(train).parameters
    assert "cfg" in params and not ({"steps", "lr", "warmup_steps", "scheduler", "log_every"} & set(params))


def test_any_eval_key_overrides_without_plus():
    assert validate_config(composed("eval.max_items_per_domain=30", "backbone.revision=abc")).eval.max_items_per_domain == 30


@pytest.fixture
def nothing_loads(monkeypatch):
    """`experiments.job.run` with every loader replaced by one that fails the test: a refusal must come first."""
    from experiments import job

    def loaded(*args, **kwargs):
        raise AssertionError("a refused config loaded something")

    for name in ("load_backbone", "load_model", "build_benchmark", "train"):
        monkeypatch.setattr(job, name, loaded)
    return job.run


@pytest.mark.parametrize("override, message", [
    ("train.lr=nan", "train.lr=nan is not allowed: a finite number"),
    ("train.lr=inf", "train.lr=inf is not allowed: a finite number"),
    ("train.max_grad_norm=nan", "train.max_grad_norm=nan is not allowed: a finite number"),
    ("train.weight_decay=-1", "train.weight_decay=-1.0 is not allowed: a number >= 0"),
    ("train.max_grad_norm=-1", "train.max_grad_norm=-1.0 is not allowed: a number >= 0 (0 = no clipping)"),
    ("method.gate_temperature=inf", "method.gate_temperature=inf is not allowed: a finite number"),
    ("eval.scales=[0.5,nan]", "eval.scales[1]=nan is not allowed: a finite number"),
    ("seed=18446744073709551616", ("seed=18446744073709551616 is not allowed: an integer in [0, 4294967295] "
                                   "(the seeds numpy takes)")),
    ("seed=-1", "seed=-1 is not allowed: an integer in [0, 4294967295] (the seeds numpy takes)"),
    ("method.rank=1000000", ("method.rank=1000000 is not allowed: at most 192, the width of the adapted layer "
                             "model.layers.0.self_attn.q_proj (192 in, 192 out)")),
])
def test_values_no_run_can_use_are_refused_in_one_line_before_anything_loads(nothing_loads, tmp_path, override,
                                                                           message):
    with pytest.raises(ConfigError) as info:
        nothing_loads(composed(override, f"run_root={tmp_path}"))
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []


def test_a_method_built_without_the_config_refuses_non_finite_values():
    with pytest.raises(MethodConfigError, match=r"^method.alpha=nan is not allowed: a finite number$"):
        build_named("lora", alpha=float("nan"))


def test_a_rank_above_a_layers_width_is_refused_on_the_loaded_model_too(tiny_backbone_dir, tmp_path):
    """Where no weightless model was checked first (a method prepared directly), `prepare` refuses the rank before
    adapting anything."""
    from experiments.backbones import load_backbone
    from experiments.methods import RunContext
    from tests.conftest import backbone_config

    bb = backbone_config(tiny_backbone_dir, target_modules=["q_proj", "k_proj"])
    model, tok = load_backbone(bb)
    ctx = RunContext(tokenizer=tok, benchmark=None, run_dir=tmp_path, target_modules=list(bb.target_modules))
    build_named("lora", rank=16).prepare(model, ctx)  # k_proj maps 32 to 16: rank 16 fits
    model, _ = load_backbone(bb)
    with pytest.raises(MethodConfigError, match=r"^method.rank=17 is not allowed: at most 16, the width of the "
                                                r"adapted layer model.layers.0.self_attn.k_proj \(32 in, 16 out\)$"):
        build_named("lora", rank=17).prepare(model, ctx)
