"""bench.gpu_hours reads the configs as Hydra composes them and prices every paper preset, scales included."""

from bench import gpu_hours
from suite_schema import registry


def test_every_paper_preset_is_priced_and_scales_cost_evaluations(capsys):
    ev = gpu_hours.paper_eval()
    assert ev["max_new_tokens_code"] == 512 and ev["max_new_tokens_choice"] == 16  # the latter from eval/micro
    # paper_main: 5 scales and up to 12 refined ones (conf/eval/scales/fronts.yaml); paper_retained: scale 1 only, nothing
    # to refine between
    assert gpu_hours.evaluations_per_run("paper_main") == 5 + 12 and gpu_hours.evaluations_per_run("paper_retained") == 1
    gpu_hours.main()
    out = capsys.readouterr().out
    presets = [p for p in registry.group_options("experiment") if p.startswith("paper_")]
    assert set(presets) == set(gpu_hours.PRESETS)
    for preset in presets:
        assert f"| `{preset}` |" in out


def test_reusing_the_tuning_sweep_s_trainings_saves_exactly_their_training_hours(capsys):
    hours = {b: gpu_hours.run_hours(b) for b in gpu_hours.PAPER_BACKBONES}
    main = gpu_hours.preset_hours(gpu_hours.PRESETS["paper_main"], gpu_hours.evaluations_per_run("paper_main"), hours)
    # paper_tune trains the grid at the full length and LoRA's points at a mean 0.625 of it, at seeds 0 and 1, all of
    # them paper_main's runs (its seeds 0 and 1)
    grid, lora = gpu_hours.grid_points()
    assert (grid, lora) == (32, 4)  # 8 methods x 4 points (conf/point/tune_*), LoRA's 4 steps
    saved = 2 * (grid + lora * 0.625) * hours["qwen3-8b"][0]
    assert gpu_hours.REUSES == {"paper_main": "paper_tune"} and 0 < saved < main
    gpu_hours.main()
    out = capsys.readouterr().out
    runs = 3 * (grid + lora + 1)
    assert f"| `paper_main` | {runs} | {main:.0f} |" in out
    assert f"| `paper_main` after `paper_tune`, `reuse_training_from` | {runs} ({2 * (grid + lora)} not trained again) | " \
           f"{main - saved:.0f} |" in out
