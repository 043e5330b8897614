"""bench.gpu_hours reads the configs as Hydra composes them and prices every paper preset, scales included."""

from bench import gpu_hours


def test_every_paper_preset_is_priced_and_scales_cost_evaluations(capsys):
    ev = gpu_hours.paper_eval()
    assert ev["max_new_tokens_code"] == 512 and ev["max_new_tokens_choice"] == 16  # the latter from eval/micro
    assert gpu_hours.evaluations_per_run("paper_main") == 5 and gpu_hours.evaluations_per_run("paper_retained") == 1
    gpu_hours.main()
    out = capsys.readouterr().out
    presets = sorted(p.stem for p in (gpu_hours.CONF / "experiment").glob("paper_*.yaml"))
    assert set(presets) == set(gpu_hours.PRESETS)
    for preset in presets:
        assert f"| `{preset}` |" in out
