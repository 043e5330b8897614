"""Every figure draws at column width with readable fonts, legends off the data and fixed method styles
(the files themselves are written and checked by the end-to-end report test)."""

import matplotlib
import pytest
from analysis_synth import record, scenario
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis import methods as M
from analysis import schema
from analysis.analyze import analyze
from analysis.collect import make_table
from analysis.figures import FONT_PT, RC, WIDTH_IN, all_figures, pareto_figure


@pytest.fixture(scope="module")
def rendered():
    recs = [r for r in scenario() if r["backbone"] == "micro"]
    recs += [record("my_new_method", s, 0.3, {"math": 0.03, "commonsense": 0.03}) for s in range(2)]
    recs += [record(m, s, 0.3, {"math": 0.05, "commonsense": 0.03}) for s in range(2)
             for m in ("atlas_random", "atlas_global", "atlas_target")]
    # One training run drawn at two post-hoc scales.
    recs += [record("lora", s, p, {"math": kl, "commonsense": kl}, steps=300, scale=0.5)
             for s, (p, kl) in enumerate([(0.27, 0.03), (0.28, 0.032), (0.26, 0.031)])]
    a = analyze(make_table(schema.to_row(r, str(i)) for i, r in enumerate(recs)), reference="lora:train.steps=900")
    with matplotlib.rc_context(RC):
        specs, missing = all_figures(a)
    return a, specs, missing


def test_every_figure_is_drawn_at_column_width(rendered):
    a, specs, missing = rendered
    assert sorted(spec.stem for spec in specs) == [
        "ablation_micro", "answers_micro", "pareto_ablation_micro_mean", "pareto_micro_commonsense",
        "pareto_micro_math", "pareto_micro_mean"]
    assert missing == []
    for spec in specs:
        w, h = spec.figure.get_size_inches()
        assert w == WIDTH_IN and 0.5 * w < h < 1.6 * w


def test_fonts_legends_and_styles(rendered):
    a, specs, _ = rendered
    for spec in specs:
        fig = spec.figure
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        for text in fig.findobj(lambda o: hasattr(o, "get_fontsize") and hasattr(o, "get_text")):
            if text.get_text().strip():
                assert text.get_fontsize() >= FONT_PT, (spec.stem, text.get_text(), text.get_fontsize())
        for legend in fig.legends:
            lb = legend.get_window_extent(renderer)
            assert lb.x0 >= fig.bbox.x0 - 1 and lb.x1 <= fig.bbox.x1 + 1, spec.stem   # not clipped
            for ax in fig.axes:
                assert not lb.overlaps(ax.get_window_extent(renderer)), spec.stem
        # Everything stays inside the figure.
        fb = fig.bbox
        for ax in fig.axes:
            tb = ax.get_tightbbox(renderer)
            assert tb.x0 >= fb.x0 - 1 and tb.x1 <= fb.x1 + 1, spec.stem
    pareto = next(spec.figure for spec in specs if spec.stem == "pareto_micro_mean")
    colours = {line.get_color() for line in pareto.axes[0].get_lines()}
    for method in ("atlas", "lora", "ewc", "base", "my_new_method"):
        assert M.style(method).color in colours, method
    assert M.style("atlas_nogate").color not in colours
    labels = [t.get_text() for t in pareto.legends[0].get_texts()]
    assert labels == ["ATLAS", "LoRA", "EWC", "my_new_method", "Base model"]
    ablation = next(spec.figure for spec in specs if spec.stem == "pareto_ablation_micro_mean")
    assert [t.get_text() for t in ablation.legends[0].get_texts()] == [
        "ATLAS", "ATLAS global", "ATLAS no gate", "ATLAS target atlas", "ATLAS random atlas", "Base model"]
    assert M.style("atlas_nogate").color in {line.get_color() for line in ablation.axes[0].get_lines()}
    # The two scales of one LoRA training run are joined by a dotted line.
    dotted = [l for l in pareto.axes[0].get_lines() if l.get_linestyle() == ":"]
    assert len(dotted) == 1 and len(dotted[0].get_xdata()) == 2


def test_method_styles_are_fixed_and_distinct():
    known = [M.style(m) for m in M.KNOWN_ORDER]
    assert len({s.color for s in known}) == len(known)
    assert M.style("atlas") == M.Style("#c62828", "o")
    # Unknown names: derived from a SHA-256 of the name, the same in every process.
    assert M.style("my_new_method") == M.style("my_new_method")
    assert M.style("my_new_method").color in M.EXTRA_COLORS
    assert M.style("my_new_method") == M.Style("#5254a3", "o")
    assert M.order_key("my_new_method") < M.order_key("atlas_global") < M.order_key("base")


def test_tiny_kl_gets_a_unit_and_coinciding_levels_share_a_label():
    # A short run: pass@1 0 everywhere (every gain level is 0) and KL around 4e-5.
    recs = [record("lora", 0, 0.0, {"math": 2e-6, "commonsense": 7.3e-5}),
            record("base", 0, 0.0, {"math": 0.0, "commonsense": 0.0})]
    a = analyze(make_table(schema.to_row(r, str(i)) for i, r in enumerate(recs)))
    with matplotlib.rc_context(RC):
        fig = pareto_figure(a, "micro", "micro", "mean")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Retained KL (×10$^{-5}$) (lower is better)"
    assert max(line.get_xdata()[0] for line in ax.get_lines() if len(line.get_xdata())) == pytest.approx(3.75)
    assert [t.get_text() for t in ax.texts] == ["50/75/90%"]
