"""Every figure draws at column width with readable fonts, legends off the data and fixed method styles; the
Pareto figures put KL on a log axis with its unit, keep the base model in view, explain their marks in a key and get
near/far figures exactly where records have far items (the files themselves are written and checked by the
end-to-end report test)."""

import copy

import matplotlib
import pytest
from analysis_synth import record, scenario
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis import methods as M
from analysis import schema
from analysis.analyze import analyze
from analysis.collect import make_table
from analysis.figure_axes import kl_scale, pass_limits
from analysis.figures import FONT_PT, RC, WIDTH_IN, _fit, _text_width_in, all_figures, pareto_figure


def legends(fig) -> list:
    """The figure's legends and those of its subfigures (method legend first, then the key)."""
    return list(fig.legends) + [leg for sub in fig.subfigs for leg in sub.legends]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for leg in legends(fig) for t in leg.get_texts()]


@pytest.fixture(scope="module")
def rendered():
    recs = [r for r in scenario() if r["backbone"] == "micro"]
    recs += [record("my_new_method", s, 0.3, {"math": 0.03, "commonsense": 0.03}) for s in range(2)]
    recs += [record(m, s, 0.3, {"math": 0.05, "commonsense": 0.03}) for s in range(2)
             for m in ("atlas_random", "atlas_global", "atlas_target")]
    # An EWC point that its other point dominates (drawn hollow).
    recs += [record("ewc", s, 0.24, {"math": 0.05, "commonsense": 0.05}, steps=900) for s in range(2)]
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
        for legend in legends(fig):
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
    labels = [t.get_text() for t in legends(pareto)[0].get_texts()]
    assert labels == ["ATLAS", "LoRA", "EWC", "my_new_method", "Base model"]
    ablation = next(spec.figure for spec in specs if spec.stem == "pareto_ablation_micro_mean")
    assert [t.get_text() for t in legends(ablation)[0].get_texts()] == [
        "ATLAS", "ATLAS global", "ATLAS no gate", "ATLAS target atlas", "ATLAS random atlas", "Base model"]
    assert M.style("atlas_nogate").color in {line.get_color() for line in ablation.axes[0].get_lines()}
    # The two scales of one LoRA training run are joined by a dotted line.
    dotted = [l for l in pareto.axes[0].get_lines() if l.get_linestyle() == ":"]
    assert len(dotted) == 1 and len(dotted[0].get_xdata()) == 2


def test_method_styles_are_fixed_and_distinct():
    known = [M.style(m) for m in M.KNOWN_ORDER]
    assert len({s.color for s in known}) == len(known)
    # Marker and line style together tell every known method apart in greyscale.
    assert len({(s.marker, s.linestyle) for s in known}) == len(known)
    assert M.style("atlas") == M.Style("#c62828", "o", "solid")
    assert all(s.linestyle in M.LINESTYLES for s in known) and ":" not in M.LINESTYLES.values()
    # Unknown names: derived from a SHA-256 of the name, the same in every process, and not a known method's pair.
    assert M.style("my_new_method") == M.style("my_new_method")
    assert M.style("my_new_method").color in M.EXTRA_COLORS
    assert M.style("my_new_method") == M.Style("#5254a3", "o", "dashdot")
    assert (M.style("my_new_method").marker, M.style("my_new_method").linestyle) not in {
        (s.marker, s.linestyle) for s in known}
    assert M.order_key("my_new_method") < M.order_key("atlas_global") < M.order_key("base")


def test_each_method_of_a_figure_has_its_own_marker_and_line_style(rendered):
    _, specs, _ = rendered
    for stem in ("pareto_micro_mean", "pareto_ablation_micro_mean"):
        fig = next(spec.figure for spec in specs if spec.stem == stem)
        handles = legends(fig)[0].legend_handles
        # The dash pattern as drawn (`_unscaled_dash_pattern`: get_linestyle() names every pattern "--").
        pairs = [(h.get_marker(), h._unscaled_dash_pattern) for h in handles]
        assert len(set(pairs)) == len(pairs), stem
        for h, label in zip(handles, legend_texts(fig)):
            method = next(m for m in M.ordered(["atlas", "lora", "ewc", "my_new_method", "base", "atlas_global",
                                                "atlas_nogate", "atlas_target", "atlas_random"]) if M.label(m) == label)
            assert h.get_marker() == M.style(method).marker and h.get_color() == M.style(method).color


def test_kl_axis_is_logarithmic_with_its_unit_and_the_base_on_top(rendered):
    a, specs, _ = rendered
    for spec in specs:
        if not spec.stem.startswith("pareto_"):
            continue
        ax = spec.figure.axes[0]
        # The base model's KL is 0: symlog, linear below a power of ten at or under the least positive KL mean.
        assert ax.get_xscale() == "symlog", spec.stem
        assert ax.get_xlabel().startswith("Retained KL (nats/token, log scale)\n"), spec.stem
        lin = ax.xaxis.get_transform().linthresh
        assert lin == pytest.approx(1e-2) and "linear below $10^{-2}$" in ax.get_xlabel()
        base = [line for line in ax.get_lines() if line.get_gid() == "base"]
        assert len(base) == 1, spec.stem
        (x,), (y,) = base[0].get_xdata(), base[0].get_ydata()
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert x == 0.0 and x0 < x < x1 and y0 < y < y1 and y == pytest.approx(0.10)
        others = [o for o in [*ax.get_lines(), *ax.collections] if o is not base[0]]
        assert base[0].get_zorder() > max(o.get_zorder() for o in others)  # drawn over every point, line and bar
        assert not base[0].get_clip_on()
        # Every drawn point lies inside the limits (level lines are drawn in axes coordinates along x).
        for line in ax.get_lines():
            if line.get_transform() != ax.transData:
                continue
            for px, py in zip(line.get_xdata(), line.get_ydata()):
                assert x0 < px < x1 and y0 <= py <= y1, (spec.stem, px, py)


def test_the_key_explains_markers_lines_bars_and_levels(rendered):
    _, specs, _ = rendered
    main = next(spec.figure for spec in specs if spec.stem == "pareto_micro_mean")
    key = [t.get_text() for t in legends(main)[1].get_texts()]
    # my_new_method has two seeds, the others three; one LoRA run is drawn at two scales (dotted).
    assert key == ["filled: on frontier", "hollow: off frontier", "bars: 95% t-interval, 2–3 seeds", "line: frontier",
                   "dotted: a run's scales", "levels: % of LoRA gain"]
    hollow = [line for line in main.axes[0].get_lines() if line.get_markerfacecolor() == "white"]
    assert [line.get_color() for line in hollow] == [M.style("ewc").color]  # EWC's dominated point
    ablation = next(spec.figure for spec in specs if spec.stem == "pareto_ablation_micro_mean")
    # Every variant point is on its frontier and none is drawn at post-hoc scales: the key names neither.
    assert [t.get_text() for t in legends(ablation)[1].get_texts()] == [
        "filled: on frontier", "bars: 95% t-interval, 2–3 seeds", "line: frontier", "levels: % of LoRA gain"]


def test_tiny_kl_on_a_log_axis_and_pass_at_one_all_zero_keeps_a_range():
    # A short run: pass@1 0 everywhere (every gain level is 0) and KL around 4e-5; the base at KL 0.
    recs = [record("lora", 0, 0.0, {"math": 2e-6, "commonsense": 7.3e-5}),
            record("base", 0, 0.0, {"math": 0.0, "commonsense": 0.0})]
    a = analyze(make_table(schema.to_row(r, str(i)) for i, r in enumerate(recs)))
    with matplotlib.rc_context(RC):
        fig = pareto_figure(a, "micro", "micro", "mean")
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog" and ax.xaxis.get_transform().linthresh == pytest.approx(1e-5)
    assert ax.get_xlabel().startswith("Retained KL (nats/token, log scale)\n")
    xs = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_transform() == ax.transData)
    assert xs == pytest.approx([0.0, 3.75e-5])
    lo, hi = ax.get_xlim()
    assert lo < 0.0 < 3.75e-5 < hi
    y0, y1 = ax.get_ylim()
    assert (y0, y1) == pytest.approx((-0.02, 0.08)) and y0 < 0.0 < y1
    assert [t.get_text() for t in ax.texts] == ["50/75/90%"]
    assert "no bars: one seed" in legend_texts(fig)


def test_axis_ranges_worked_out():
    assert pass_limits([0.0, 0.0]) == pytest.approx((-0.02, 0.08))
    assert pass_limits([1.0]) == pytest.approx((0.92, 1.02))
    assert pass_limits([0.2, 0.7]) == pytest.approx((0.17, 0.73))
    assert pass_limits([]) == (0.0, 1.0)
    s = kl_scale([0.0, 0.003, 0.2], [0.0, 0.5])
    assert (s.kind, s.linthresh, s.lo) == ("symlog", pytest.approx(1e-3), pytest.approx(-3e-4))
    assert s.hi == pytest.approx(0.5 * 10 ** 0.12)
    s = kl_scale([0.02, 0.4], [0.01, 0.6])
    assert (s.kind, s.linthresh) == ("log", None)
    assert (s.lo, s.hi) == (pytest.approx(0.01 / 10 ** 0.12), pytest.approx(0.6 * 10 ** 0.12))
    assert kl_scale([0.0], []).kind == "symlog"  # only zeros: still a log axis with a linear piece


def test_long_titles_wrap_within_the_figure():
    parts = ["micro (micro_v3@dev)", "mean of domains, near and far items", "ATLAS variants"]
    title = _fit(parts)
    assert title.split("\n") == ["micro (micro_v3@dev)", "mean of domains, near and far items · ATLAS variants"]
    assert all(_text_width_in(line) <= WIDTH_IN - 0.5 for line in title.split("\n"))
    assert _fit(["micro", "math"]) == "micro · math"


def with_far(rec: dict, far: float) -> dict:
    """The record with far retained items of KL `far` in both domains, on the micro_v3 benchmark."""
    rec = copy.deepcopy(rec)
    m = rec["metrics"]
    m["retained_near"] = m.pop("retained")
    m["retained_far"] = {d: {"kl_token_mean": far, "kl_seq_mean": 5 * far, "n_tokens": 500, "n": 30}
                         for d in ("math", "commonsense")}
    rec["benchmark"] = rec["config"]["benchmark"]["name"] = "micro_v3"
    return rec


def test_near_and_far_figures_exactly_where_records_have_far_items():
    old = [record("base", 0, 0.1, {"math": 0.0, "commonsense": 0.0}), record("lora", 0, 0.5, steps=600),
           record("atlas", 0, 0.5)]
    new = [with_far(record("base", s, 0.1, {"math": 0.0, "commonsense": 0.0}), 0.0) for s in (0, 1)]
    new += [with_far(record("lora", s, 0.5, {"math": 0.4, "commonsense": 0.2}, steps=600), 0.8) for s in (0, 1)]
    new += [with_far(record("atlas", s, 0.5, {"math": 0.02, "commonsense": 0.04}), 0.2) for s in (0, 1)]
    a = analyze(make_table(schema.to_row(r, str(i)) for i, r in enumerate(old + new)),
                reference="lora:train.steps=600")
    with matplotlib.rc_context(RC):
        specs, _ = all_figures(a)
    stems = sorted(spec.stem for spec in specs if spec.stem.startswith("pareto_"))
    assert stems == ["pareto_micro_commonsense", "pareto_micro_math", "pareto_micro_mean",
                     "pareto_micro_micro_v3_commonsense", "pareto_micro_micro_v3_far", "pareto_micro_micro_v3_math",
                     "pareto_micro_micro_v3_mean", "pareto_micro_micro_v3_near"]
    fig = {spec.stem: spec.figure for spec in specs}
    for stem, f in fig.items():  # titles of the longer group name stay inside the figure
        renderer = FigureCanvasAgg(f).get_renderer()
        f.draw(renderer)
        tb = f.axes[0].get_tightbbox(renderer)
        assert tb.x0 >= f.bbox.x0 - 1 and tb.x1 <= f.bbox.x1 + 1, stem
    for stem, kl in (("near", 0.03), ("far", 0.2)):  # ATLAS: near (0.02 + 0.04) / 2, far 0.2
        ax = fig[f"pareto_micro_micro_v3_{stem}"].axes[0]
        assert f"{stem} items, mean of domains" in ax.get_title(loc="left")
        atlas = [line for line in ax.get_lines() if line.get_color() == M.style("atlas").color
                 and line.get_marker() == "o"]
        assert [list(line.get_xdata()) for line in atlas] == [[pytest.approx(kl)]]
    assert "math, near items" in fig["pareto_micro_micro_v3_math"].axes[0].get_title(loc="left")
    assert "mean of near and far" in fig["pareto_micro_micro_v3_mean"].axes[0].get_title(loc="left")
    assert fig["pareto_micro_math"].axes[0].get_title(loc="left") == "micro · math"
