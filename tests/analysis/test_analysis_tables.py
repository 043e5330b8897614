"""Table rendering (Markdown, LaTeX booktabs, best in bold) and the paper tables on synthetic analyses."""

import pytest
from analysis_synth import record, sweep

from analysis import schema
from analysis.analyze import analyze
from analysis.collect import make_table
from analysis.render import Cell, Table, fmt_bytes, fmt_ci, fmt_count, fmt_num, fmt_p, tex_escape, to_latex, to_markdown
from analysis.stats import bootstrap_interval
from analysis.tables import all_tables


def table_of(records):
    return make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(records))


def test_number_formats():
    assert fmt_num(0.012345) == "0.0123" and fmt_num(1.2345) == "1.23" and fmt_num(123.45) == "123"
    assert fmt_num(0.00001234) == "1.23e-05" and fmt_num(None) == "—" and fmt_num(float("nan")) == "—"
    assert fmt_ci(0.0423, 0.00442) == "0.0423 ± 0.0044" and fmt_ci(0.5, None) == "0.500"
    assert fmt_ci(0.0, 0.0) == "0.00 ± 0.00"
    assert fmt_p(0.0004) == "<0.001" and fmt_p(0.0377) == "0.038" and fmt_p(None) == "n/a"
    assert fmt_count(1_500_000) == "1.50M" and fmt_count(12) == "12"
    assert fmt_bytes(3 * 2 ** 20) == "3.00 MiB" and fmt_bytes(100) == "100 B"


def _demo():
    t = Table("demo", "Demo: a_b & c", columns=["Method", "KL", "Speed"], group_header="Backbone")
    rows = [("A", 0.3, 10.0), ("B", 0.1, 20.0), ("C", 0.1, 5.0), ("D", 0.5, 20.0)]
    for i, (m, kl, sp) in enumerate(rows):
        t.rows.append([Cell(m), Cell(fmt_num(kl), kl), Cell(fmt_num(sp), sp)])
        t.groups.append("g1" if i < 2 else "g2")
    t.best = {1: "min", 2: "max"}
    t.notes = ["Δ ≥ 5% of x_y."]
    return t


def test_markdown_bolds_best_per_group():
    md = to_markdown(_demo())
    lines = md.splitlines()
    assert lines[0] == "# Demo: a_b & c"
    assert lines[2] == "| Backbone | Method | KL | Speed |"
    assert lines[4] == "| g1 | A | 0.300 | 10.0 |"
    assert lines[5] == "|  | B | **0.100** | **20.0** |"
    assert lines[6] == "| g2 | C | **0.100** | 5.00 |"
    assert lines[7] == "|  | D | 0.500 | **20.0** |"
    assert "Δ ≥ 5% of x_y." in md


def test_latex_booktabs_escaped_and_bold():
    tex = to_latex(_demo())
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"\begin{tabular}{llrr}" in tex
    assert r" & B & \textbf{0.100} & \textbf{20.0} \\" in tex
    assert r"\caption{Demo: a\_b \& c. $\Delta$ $\geq$ 5\% of x\_y.}" in tex
    assert tex.count(r"\midrule") == 2   # header rule + one between the two groups
    assert tex_escape("[0.1, 0.2]") == "{[}0.1, 0.2]"
    assert tex_escape("[-0.05, -1.2e-05]") == "{[}$-$0.05, $-$1.2e-05]"
    assert tex_escape("qwen3-8b") == "qwen3-8b"


def test_ties_and_lone_values_are_not_bold():
    t = Table("t", "T", columns=["Method", "v"], best={1: "min"})
    t.rows = [[Cell("a"), Cell("1", 1.0)], [Cell("b"), Cell("1", 1.0)]]
    assert "**" not in to_markdown(t)
    t.rows.append([Cell("c"), Cell("0.5", 0.5)])
    assert to_markdown(t).count("**") == 2
    single = Table("s", "S", columns=["Method", "v"], best={1: "min"}, rows=[[Cell("a"), Cell("1", 1.0)]])
    assert "**" not in to_markdown(single)


def test_absent_table_says_so():
    t = Table("x", "Ablations", absent="No runs of an ATLAS variant.")
    assert to_markdown(t) == "# Ablations\n\n_No runs of an ATLAS variant._\n"
    tex = to_latex(t)
    assert r"\emph{No runs of an ATLAS variant.}" in tex and "tabular" not in tex


def test_tables_with_missing_inputs_say_so():
    recs = sweep("lora", [(100, [(0.3, 0.02), (0.32, 0.03)])])
    tables = {t.name: t for t in all_tables(analyze(table_of(recs), ["0.3"]))}
    assert tables["main"].absent is None and len(tables["main"].rows) == 1
    assert "No complete ATLAS runs" in tables["paired"].absent
    assert "ATLAS variant" in tables["ablations"].absent
    empty = {t.name: t for t in all_tables(analyze(make_table([]), ["0.3"]))}
    assert all(t.absent for t in empty.values()), {k: t.absent for k, t in empty.items()}
    for t in empty.values():
        assert t.absent in to_markdown(t)


def test_main_table_values_not_reached_and_bold():
    recs = sweep("atlas", [(100, [(0.30, 0.010), (0.32, 0.012), (0.31, 0.014)])])
    recs += sweep("lora", [(100, [(0.30, 0.020), (0.35, 0.030), (0.40, 0.040)])])
    recs += sweep("ewc", [(100, [(0.10, 0.001), (0.12, 0.002), (0.11, 0.001)])])
    recs += sweep("replay", [(100, [(0.33, 0.005), (0.20, 0.001), (0.20, 0.001)])])
    a = analyze(table_of(recs), ["0.3"])
    tables = {t.name: t for t in all_tables(a)}
    md = to_markdown(tables["main"])
    assert "| micro | ATLAS | retained activations | 3 | **0.0120 ± 0.0050** |" in md   # mean 0.012, half 4.3027 * 0.002 / sqrt 3
    assert "| LoRA | target only | 3 | 0.0300 ± 0.0248 |" in md
    assert "| EWC | retained prompts | 3 | not reached (0/3 seeds) |" in md
    assert "| Replay | retained prompts | 3 | 0.00500 (1/3 seeds) |" in md        # partial: never bold, even though lowest
    paired = to_markdown(tables["paired"])
    assert "| micro | LoRA | pass@1 ≥ 0.3 | 3 | -0.0180 |" in paired
    # Holm over the sign tests that exist (LoRA 0.25, Replay 1; EWC has no pair): 2 * 0.25 and max(0.5, 1).
    assert "| LoRA | pass@1 ≥ 0.3 | 3 |" in paired and "| 3/3 | 0.250 | 0.500 |  |" in paired
    assert ("| Replay | pass@1 ≥ 0.3 | 1 | 0.00500 | n/a | n/a | n/a | n/a | n/a | 0/1 | 1.000 | 1.000 | ATLAS only: 2 |"
            in paired)
    # LoRA: d = (-0.010, -0.018, -0.026); bootstrap over the 27 resamples of the 3 pairs
    lora = a.paired[a.paired["method"] == "lora"].iloc[0]
    assert (lora["boot_lo"], lora["boot_hi"]) == pytest.approx(bootstrap_interval([-0.010, -0.018, -0.026]))
    assert -0.026 < lora["boot_lo"] < lora["mean_diff"] < lora["boot_hi"] < -0.010
    assert "| EWC | pass@1 ≥ 0.3 | 0 | n/a |" in paired


def test_costs_answers_domains_tables():
    recs = [record("atlas", s, 0.4, {"math": 0.01, "commonsense": 0.03}, rates={"math": 0.1, "commonsense": 0.02},
                   cost={"stored_bytes": 2 ** 20, "train_seconds": 100.0}) for s in range(2)]
    recs += [record("lora", s, 0.4, {"math": 0.05, "commonsense": 0.02}, rates={"math": 0.3, "commonsense": 0.04},
                    cost={"stored_bytes": 2 ** 21, "train_seconds": 50.0}) for s in range(2)]
    tables = {t.name: t for t in all_tables(analyze(table_of(recs), ["0.3"]))}
    costs = to_markdown(tables["costs"])
    assert "| micro | ATLAS | 2 | 1.00K | **1.00 MiB** | 100 | 50.0 |" in costs
    assert "|  | LoRA | 2 | 1.00K | 2.00 MiB | **50.0** | 50.0 |" in costs
    answers = to_markdown(tables["answers"])
    assert "math: answers changed (%)" in answers and "commonsense: choices flipped (%)" in answers
    assert "| micro | ATLAS | **10.0 ± 0.0** |" in answers
    domains = to_markdown(tables["domains"])
    assert domains.splitlines()[2] == ("| Backbone | Method | math KL (nats/token) | commonsense KL (nats/token) | "
                                       "Mean over domains KL (nats/token) |")
    assert "| micro | ATLAS | **0.0100 ± 0.0000** | 0.0300 ± 0.0000 | **0.0200 ± 0.0000** |" in domains
    assert "|  | LoRA | 0.0500 ± 0.0000 | **0.0200 ± 0.0000** | 0.0350 ± 0.0000 |" in domains
