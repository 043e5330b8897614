"""bench.gpu_hours reads the configs as Hydra composes them and prices every paper preset, scales included."""

from bench import gpu_hours
from suite_schema import registry


def test_every_paper_preset_is_priced_and_scales_cost_evaluations(capsys):
    ev = gpu_hours.paper_eval()
    assert ev["max_new_tokens_code"] == 512 and ev["max_new_tokens_choice"] == 16  # the latter from eval/micro
    assert gpu_hours.evaluations_per_run("paper_main") == 5 and gpu_hours.evaluations_per_run("paper_retained") == 1
    gpu_hours.main()
    out = capsys.readouterr().out
    presets = [p for p in registry.group_options("experiment") if p.startswith("paper_")]
    assert set(presets) == set(gpu_hours.PRESETS)
    for preset in presets:
        assert f"| `{preset}` |" in out


def test_reusing_the_tuning_sweep_s_trainings_saves_exactly_their_training_hours(capsys):
    hours = {b: gpu_hours.run_hours(b) for b in gpu_hours.PAPER_BACKBONES}
    main = gpu_hours.preset_hours(gpu_hours.PRESETS["paper_main"], 5, hours)
    # paper_tune trains 28 runs at the full length and LoRA's 4 at a mean 0.625 of it, all of them paper_main's seed 0
    saved = (28 + 4 * 0.625) * hours["qwen3-8b"][0]
    assert gpu_hours.REUSES == {"paper_main": "paper_tune"} and 0 < saved < main
    gpu_hours.main()
    out = capsys.readouterr().out
    assert f"| `paper_main` | 99 | {main:.0f} |" in out
    assert f"| `paper_main` after `paper_tune`, `reuse_training_from` | 99 (32 not trained again) | {main - saved:.0f} |" in out
