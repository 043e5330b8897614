"""The report folder: every table (Markdown + LaTeX), figure (PNG + PDF) and data file, `index.md`, and
`index.html` (all of it on one self-contained page, with samples of what each method changed: `analysis.html_page`).

Deterministic: the same records and the same command give byte-identical files (no timestamps,
sorted inputs, fixed float formatting, figure metadata without dates), so a committed report can
be checked against a re-run (`python -m analysis report ... --check`).
"""

from __future__ import annotations

import filecmp
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import pandas as pd

from analysis import bootstrap as BT
from analysis import comparable
from analysis import figures as figure_render
from analysis import matched as MT
from analysis import methods as M
from analysis import html_page, pareto, read_ledger, render, schema
from analysis import samples as SM
from analysis.analyze import Analysis, analyze
from analysis.collect import Collection, collect, machine_counts, thread_counts, threads_text
from analysis.schema import PER_ITEM_COL
from analysis.tables import OPTIONAL, all_tables, group_label
from analysis.worlds import world_lines
from analysis.variants import split_variants
from suite_schema import layout

INDEX = "index.md"
INDEX_TITLE = "# Analysis report"
SUBDIRS = ("tables", "figures", "data")
OWNED_SUFFIXES = (".md", ".tex", ".png", ".pdf", ".csv", ".html")

TABLE_TEXT = {
    "main": "KL at the matched coding requirement, every level: ATLAS and the baselines",
    "verdict": "Per method and level: does ATLAS keep less headline, near and far KL (Holm-corrected paired t-tests)",
    "main_pooled": "The main table with the retained KL pooled over tokens (each domain weighs by its scored tokens)",
    "main_near": "The main table with the near items' retained KL (benchmarks with far items)",
    "main_far": "The main table with the far items' retained KL",
    "main_far_pooled": "The main table with the far items' retained KL pooled over tokens",
    "main_all_pooled": "The main table with the near and far items' retained KL pooled over tokens",
    **{f"main_{dom}": f"The main table with {dom}'s retained KL alone, matched on that domain's fronts"
       for dom in pareto.DOMAIN_ORDER},
    "paired": "ATLAS against each method, paired over seeds (mean difference, interval, paired t, sign test; "
              "raw and Holm-corrected p)",
    "paired_near": "The paired table with the near items' retained KL (its own Holm family)",
    "paired_far": "The paired table with the far items' retained KL (its own Holm family)",
    "paired_items": "ATLAS against each method, resampling code problems and retained items (interval and p), next "
                    "to the paired table's interval over seeds",
    "dominance": "Share of ATLAS's measured points dominated by a same-seed point of each method, and the reverse",
    "ablations": "The ATLAS variants at every level and their paired difference to ATLAS",
    "backbones": "KL at the primary level, one column per backbone",
    "domains": "Each retained domain's KL at the primary level (math vs commonsense)",
    "answers": "Answer-level stability at the primary level: rewritten math answers, flipped choices, accuracy change",
    "costs": "Trainable parameters, stored bytes, train seconds, decode tokens/s",
}
DATA_TEXT = {
    "runs.csv": "every complete run used (one row per run id, all columns of the collected table)",
    "skipped.csv": "runs left out, with the reason",
    "thresholds.csv": "the absolute pass@1 requirement of every level on every backbone; gain levels: the base's mean "
                      "pass@1 (gain_lo), the reference's (reference_pass1; gain_hi: raised to gain_lo when lower)",
    "pareto_points.csv": "sweep points per domain: seeds, mean and 95% interval of pass@1 and KL, on_frontier",
    "matched_per_seed.csv": "per level, method and seed: reached, KL, chosen sweep point, the pass@1 gap of the two "
                            "measured points the KL was read between (bracket_gap)",
    "matched_summary.csv": "per level and method: seeds reaching, mean, std, 95% t and bootstrap intervals",
    "paired.csv": "ATLAS against each method per level: pairs, mean difference, t and bootstrap intervals, t, p, sign test, "
                  "Holm-corrected p (p_t_holm, p_sign_holm)",
    "paired_items.csv": "ATLAS against each method per level, resampling code problems and retained items: problems, "
                        "items, pairs, mean difference, resamples with a pair, percentile interval, bootstrap p and its "
                        "Holm correction",
    "paired_near.csv": "as paired.csv with the near items' KL (benchmarks with far items)",
    "paired_far.csv": "as paired.csv with the far items' KL",
    "matched_pooled_per_seed.csv": "as matched_per_seed.csv with the token-pooled retained KL",
    "matched_pooled_summary.csv": "as matched_summary.csv with the token-pooled retained KL",
    "matched_near_summary.csv": "as matched_summary.csv with the near items' KL (benchmarks with far items)",
    "matched_far_summary.csv": "as matched_summary.csv with the far items' KL",
    "matched_far_pooled_summary.csv": "as matched_summary.csv with the far items' KL pooled over tokens",
    "matched_all_pooled_summary.csv": "as matched_summary.csv with the near and far items' KL pooled over tokens",
    "dominance.csv": "ATLAS against each method: measured points on shared seeds and how many the other dominates "
                     "(kl: mean or pooled)",
    "domains_per_seed.csv": "per domain at the primary level: per-seed matched KL",
    "matched_domains_summary.csv": "per domain, level and method, the domain's KL alone: seeds reaching, mean, std, "
                                   "95% t and bootstrap intervals",
    "answers_per_seed.csv": "per seed at the primary level: the chosen point's answer-level metrics",
}


@dataclass
class Report:
    folder: Path
    collection: Collection
    analysis: Analysis
    files: list[Path] = field(default_factory=list)
    ledger: Optional[read_ledger.Ledger] = None  # the test-read ledger(s) in or above the record folders, if any
    absent: list[str] = field(default_factory=list)  # tables left out (`tables.OPTIONAL`) and why, one line each


def _csv(df: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, lineterminator="\n")
    return path


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")
    return path


def _md(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _versions(runs: pd.DataFrame, prefix: str) -> pd.DataFrame:
    sha = runs[f"{prefix}_sha"] if f"{prefix}_sha" in runs.columns else pd.Series([None] * len(runs))
    dirty = runs[f"{prefix}_dirty"] if f"{prefix}_dirty" in runs.columns else pd.Series([None] * len(runs))
    return pd.DataFrame({"sha": sha.fillna("unknown").astype(str).values,
                         "dirty": dirty.map(lambda d: bool(d) if isinstance(d, (bool, int)) else None).values,
                         "method": runs["method"].values})


def code_versions(runs: pd.DataFrame) -> list[dict]:
    """The code versions the runs were made with: one entry per (git sha, dirty flag), with its run count and
    methods, most runs first; runs without provenance count as sha `unknown`. A run that reused another run's training
    (`train.reused_from`) also counts for the version that trained it, where that differs from its own."""
    if runs.empty:
        return []
    frame = _versions(runs, "provenance/git")
    if "provenance/train_git_sha" in runs.columns:
        reused = runs["provenance/train_git_sha"].notna().values
        training = _versions(runs, "provenance/train_git")
        other = reused & ((training["sha"] != frame["sha"]) | (training["dirty"] != frame["dirty"])).values
        frame = pd.concat([frame, training[other]], ignore_index=True)
    out = []
    for (s, d), g in frame.groupby(["sha", frame["dirty"].astype(str)], sort=True):
        out.append({"sha": s, "dirty": g["dirty"].iloc[0], "runs": len(g), "methods": M.ordered(g["method"].unique())})
    return sorted(out, key=lambda v: (-v["runs"], v["sha"]))


def warnings_of(a: Analysis) -> list[str]:
    """Sweep points whose runs differ outside the knobs (several runs for one seed, or other config)."""
    out = []
    runs = a.runs
    if runs.empty:
        return out
    seeds = pareto.per_seed(runs, [])
    multi = seeds[seeds["n_runs"] > 1]
    for _, r in multi.iterrows():
        out.append(f"{r['method']} on {group_label(r['backbone'], r['benchmark'])}, sweep point {r['sweep_key']}, "
                   f"seed {int(r['seed'])}: {int(r['n_runs'])} runs that differ outside the knobs; their mean is used.")
    versions = code_versions(runs)
    if len(versions) > 1:
        out.append(f"the runs come from {len(versions)} code versions (see Code versions): a table may compare "
                   "numbers computed by different code.")
    threads = thread_counts(runs)
    if len(threads) > 1:
        out.append(f"the runs were trained with different intra-op thread counts ({threads_text(threads, 'runs')}; "
                   "`cost.threads`): float sums differ in order between them, so equal configs give slightly "
                   "different numbers.")
    machines = machine_counts(runs)
    if len(machines) > 1:
        listed = ", ".join(f"{m}: {n} runs" for m, n in machines.items())
        out.append(f"the runs were made on {len(machines)} kinds of machine ({listed}; `provenance.machine`): their "
                   "float kernels round differently, so equal configs give different numbers (docs/analysis.md).")
    if "config_key" in runs.columns:
        n_cfg = runs.groupby("sweep_key")["config_key"].nunique()
        for key in sorted(n_cfg[n_cfg > 1].index):
            g = runs[runs["sweep_key"] == key].iloc[0]
            out.append(f"{g['method']} on {group_label(g['backbone'], g['benchmark'])}, sweep point {key}: runs with "
                       f"{int(n_cfg[key])} different configs outside the knobs and seed (e.g. eval settings).")
    return out


def _index(rep: Report, command: str, tables, figures, missing, data_files) -> str:
    a, col = rep.analysis, rep.collection
    runs = a.runs
    lines = [INDEX_TITLE, "", "Regenerate (and check against this folder) with:", "",
             "```", command, "```", "", html_page.INDEX_LINE, "", "## Runs", ""]
    counts = col.counts()
    lines.append(f"- Sources read (record files and W&B runs): {col.n_sources}")
    lines.append(f"- Complete runs used: {len(runs)}")
    lines.append(f"- Skipped: {len(col.skipped)}" + (
        " (" + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")" if counts else ""))
    lines.append("")
    if len(runs):
        lines += ["| Backbone | Benchmark | Method | Runs | Sweep points | Seeds |", "|:---|:---|:---|---:|---:|:---|"]
        for (bb, bench), g in runs.groupby(["backbone", "benchmark"], sort=True):
            for method in M.ordered(g["method"]):
                gm = g[g["method"] == method]
                seeds = ",".join(str(int(s)) for s in sorted(gm["seed"].unique()))
                lines.append(f"| {_md(bb)} | {_md(bench)} | {_md(method)} | {len(gm)} | {gm['sweep_key'].nunique()} "
                             f"| {seeds} |")
        lines.append("")
    worlds = world_lines(runs["benchmark"].unique()) if len(runs) else []
    if worlds:
        lines += ["Benchmarks:", ""] + [f"- {_md(w)}" for w in worlds] + [""]
    versions = code_versions(runs)
    if versions:
        lines += ["## Code versions", "", "| Commit | Uncommitted changes | Runs | Methods |", "|:---|:---|---:|:---|"]
        for v in versions:
            dirty = "unknown" if v["dirty"] is None else ("yes" if v["dirty"] else "no")
            lines.append(f"| {_md(v['sha'][:12])} | {dirty} | {v['runs']} | {_md(', '.join(v['methods']))} |")
        lines.append("")
    warns = warnings_of(a)
    if warns:
        lines += ["### Warnings", ""] + [f"- {_md(w)}" for w in warns] + [""]
    lines += read_ledger.index_lines(rep.ledger, col.table, _md)

    lines += ["## Requirement levels", ""]
    lines.append("Levels: " + ", ".join(f"`{lv.spec}` ({lv.label})" for lv in a.levels)
                 + f"; primary level (single-level tables and figures): `{a.primary_level.spec}`"
                 + ("; KL interpolated along each training run's scale curve, the least over a method's runs, per seed."
                    if a.interpolate else "; no interpolation."))
    lines.append("")
    lines += _gap_lines(a)
    if any(lv.kind == "gain" for lv in a.levels):
        lines.append(f"Gain levels are shares of the coding gain of the reference point `{a.reference.spec}` "
                     f"({a.reference.label}, scale 1, mean over its seeds) over the base model's mean pass@1; "
                     "no other method enters a level.")
        lines.append("")
    if len(a.thresholds):
        gains = any(lv.kind == "gain" for lv in a.levels)
        ref = f"reference pass@1 ({a.reference.label}, mean over seeds)"
        lines += ["| Backbone | Benchmark | Level | pass@1 required | "
                  + (f"base pass@1 (mean over runs) | {_md(ref)} |" if gains else ""),
                  "|:---|:---|:---|---:|" + ("---:|---:|" if gains else "")]
        for _, r in a.thresholds.iterrows():
            ends = [render.fmt_num(float(r[c]), 4) if pd.notna(r[c]) else "" for c in ("gain_lo", "reference_pass1")]
            lines.append(f"| {_md(r['backbone'])} | {_md(r['benchmark'])} | {_md(r['level'])} | "
                         f"{render.fmt_num(float(r['threshold']), 4)} |" + (f" {ends[0]} | {ends[1]} |" if gains else ""))
        lines.append("")

    lines += ["## Tables", "", "| Files | Shows |", "|:---|:---|"]
    for t, paths in tables:
        links = ", ".join(f"[{p}]({p})" for p in paths)
        shows = TABLE_TEXT.get(t.name, t.title) + (f" — *absent: {_md(t.absent)}*" if t.absent else "")
        lines.append(f"| {links} | {_md(shows)} |")
    lines += ["", "## Figures", "", "| Files | Shows |", "|:---|:---|"]
    for spec, paths in figures:
        links = ", ".join(f"[{p}]({p})" for p in paths)
        lines.append(f"| {links} | {_md(spec.title)} |")
    lines.append("")
    if missing:
        lines += ["Not drawn:", ""] + [f"- {_md(m)}" for m in missing] + [""]
    lines += ["## Data", "", "| File | Holds |", "|:---|:---|"]
    for p in data_files:
        lines.append(f"| [{p}]({p}) | {_md(DATA_TEXT.get(Path(p).name, ''))} |")
    lines += ["", "## Skipped runs", ""]
    if col.skipped:
        lines += ["| Source | Kind | Run id | Method | Seed | Reason |", "|:---|:---|:---|:---|---:|:---|"]
        for s in col.skipped:
            lines.append(f"| {_md(s.source)} | {s.kind} | {_md(s.run_id or '')} | {_md(s.method or '')} | "
                         f"{'' if s.seed is None else s.seed} | {_md(s.reason)} |")
    else:
        lines.append("None.")
    lines.append("")
    return "\n".join(lines)


def _gap_lines(a: Analysis) -> list[str]:
    """With interpolation, per backbone and benchmark: the widest pass@1 gap between the two measured points any
    per-seed matched value (KL averaged over domains, every trained method, every level) was read between."""
    if not a.interpolate or a.matched_seed.empty:
        return []
    lines = []
    for _, r in MT.widest_gaps(a.matched_seed).iterrows():
        where = group_label(r["backbone"], r["benchmark"])
        if not r["n_bracketed"]:
            lines.append(f"Widest pass@1 gap interpolated across on {_md(where)}: none (every matched value is a "
                         "measured point's KL).")
        else:
            lines.append(f"Widest pass@1 gap interpolated across on {_md(where)}: "
                         f"{render.fmt_num(float(r['widest_gap']))} ({_md(M.label(r['method']))}, {_md(r['level'])}, "
                         f"seed {int(r['seed'])}), among {int(r['n_bracketed'])} per-seed matched values read between "
                         "two measured points of a run's scale curve (each one's gap: `bracket_gap` in "
                         "data/matched_per_seed.csv).")
    return lines + [""]


def _is_report(folder: Path) -> bool:
    try:
        with open(folder / INDEX, encoding="utf-8") as fh:
            return fh.readline().rstrip("\n") == INDEX_TITLE
    except OSError:
        return False


def _clean_stale(folder: Path, written: set[Path]) -> None:
    """Remove files of a previous report in the report's own subfolders that this run did not write."""
    for sub in SUBDIRS:
        d = folder / sub
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.is_file() and p.suffix in OWNED_SUFFIXES and p.resolve() not in written:
                p.unlink()


def default_command(dirs: Sequence[str], out: str | Path, levels: Sequence[str], primary: Optional[int],
                    interpolate: bool, wandb_paths: Sequence[str], reference: str = MT.DEFAULT_REFERENCE,
                    variants: Sequence[str] = (), resamples: int = BT.DEFAULT_RESAMPLES,
                    split_incomparable: bool = False, samples: int = SM.DEFAULT_SAMPLES) -> str:
    """The command line that regenerates a report with these arguments."""
    args = ["python", "-m", "analysis", "report", *map(str, dirs), "--out", str(out), "--levels", *map(str, levels)]
    if any(MT.parse_level(lv).kind == "gain" for lv in levels):
        args += ["--reference", str(reference)]
    if primary is not None:
        args += ["--primary", str(primary)]
    if not interpolate:
        args.append("--no-interpolate")
    for w in wandb_paths:
        args += ["--wandb", w]
    if variants:
        args += ["--variants", *variants]
    if resamples != BT.DEFAULT_RESAMPLES:
        args += ["--resamples", str(resamples)]
    if split_incomparable:
        args.append(comparable.SPLIT_FLAG)
    if samples != SM.DEFAULT_SAMPLES:
        args += ["--samples", str(samples)]
    return shlex.join(args)


def write_report(
    dirs: Sequence[str] = (),
    out: str | Path = "report",
    levels: Sequence[str] = MT.DEFAULT_LEVELS,
    primary: Optional[int] = None,
    interpolate: bool = True,
    wandb_paths: Sequence[str] = (),
    api: Any = None,
    command: Optional[str] = None,
    progress: bool = False,
    reference: str = MT.DEFAULT_REFERENCE,
    variants: Sequence[str] = (),
    resamples: int = BT.DEFAULT_RESAMPLES,
    split_incomparable: bool = False,
    samples: int = SM.DEFAULT_SAMPLES,
) -> Report:
    """Collect, analyse and write every table, figure and data file plus `index.md` and `index.html` into `out`.
    `variants`: knobs whose non-default settings make a method's records a method of their own (`analysis.variants`);
    `resamples`: of the bootstrap over code problems and retained items (`analysis.bootstrap`); `samples`: changed
    items and code completions shown per method and group in `index.html` (`analysis.samples`). A table in
    `tables.OPTIONAL` with nothing to show is not written; `Report.absent` says why. Nothing is written, and ValueError
    says why in one line, when no record is complete, when runs of one table group are not comparable
    (`analysis.comparable`; with `split_incomparable` each kind becomes a group of its own) or when a gain level lacks
    its base or reference runs."""
    BT.check_resamples(resamples)
    SM.check_samples(samples)
    folder = Path(out)
    # Stale files are only removed from a folder this command owns: new, or holding an earlier report.
    owned = not folder.exists() or _is_report(folder)
    col = collect(dirs, wandb_paths, api=api, progress=progress)
    _require_runs(col, dirs, wandb_paths)
    runs = comparable.check(split_variants(col.table, variants), split_incomparable)
    a = analyze(runs, MT.parse_levels(levels), primary, interpolate, reference=reference, resamples=resamples)
    rep = Report(folder, col, a, ledger=read_ledger.read_ledgers(dirs))
    if command is None:
        command = default_command(dirs, out, [lv.spec for lv in a.levels], primary, interpolate, wandb_paths,
                                  a.reference.spec, variants, resamples, split_incomparable, samples)

    written: list[Path] = []
    tables = []
    for t in all_tables(a):
        if t.name in OPTIONAL and t.absent:
            rep.absent.append(f"{t.name}: not written: {t.absent}")
            continue
        md = _write(folder / "tables" / f"{t.name}.md", render.to_markdown(t))
        tex = _write(folder / "tables" / f"{t.name}.tex", render.to_latex(t))
        written += [md, tex]
        tables.append((t, [f"tables/{t.name}.md", f"tables/{t.name}.tex"]))

    data = {
        "runs.csv": a.runs.drop(columns=[c for c in a.runs.columns
                                         if c.endswith("/accuracy_delta") or c in (pareto.POOLED_KL_COL, PER_ITEM_COL)
                                         or c in a.variants or c in LONG_COLUMNS]),
        "skipped.csv": col.skipped_frame(),
        "thresholds.csv": a.thresholds,
        "pareto_points.csv": a.points,
        "matched_per_seed.csv": a.matched_seed,
        "matched_summary.csv": a.matched,
        "paired.csv": a.paired,
        **({"paired_items.csv": a.items.table} if any(t.name == "paired_items" for t, _ in tables) else {}),
        "matched_pooled_per_seed.csv": a.pooled_seed,
        "matched_pooled_summary.csv": a.pooled,
        "dominance.csv": a.dominance,
        "domains_per_seed.csv": a.domain_seed,
        "matched_domains_summary.csv": a.domain_levels,
        "answers_per_seed.csv": a.answers,
    }
    for col, (_, summary) in a.variants.items():
        data[f"matched_{col.removeprefix('retained_kl_')}_summary.csv"] = summary
    for col, frame in a.paired_variants.items():
        data[f"paired_{col.removeprefix('retained_kl_')}.csv"] = frame
    data_files = []
    for name, df in data.items():
        written.append(_csv(df, folder / "data" / name))
        data_files.append(f"data/{name}")

    rendered, missing = figure_render.render_all(a, folder / "figures")
    figures = []
    for spec, paths in rendered:
        written += paths
        figures.append((spec, [f"figures/{p.name}" for p in paths]))

    index = _index(rep, command, tables, figures, missing, data_files)
    written.append(_write(folder / INDEX, index))
    shown = SM.method_samples(a.runs, a.matched_seed, a.primary_level.spec, samples)
    written.append(_write(folder / html_page.HTML_INDEX, html_page.page(
        index, [(t, TABLE_TEXT.get(t.name, "")) for t, _ in tables],
        [(spec.title, folder / p) for spec, paths in figures for p in paths if p.endswith(".png")], missing, shown)))
    if owned:
        _clean_stale(folder, {p.resolve() for p in written})
    rep.files = sorted(written, key=str)
    return rep


#: Columns of the collected table left out of runs.csv: canonical JSON of whole config sections, compared (not read)
#: by `analysis.comparable`.
LONG_COLUMNS = (schema.BENCHMARK_VERSION_COL,)


def _require_runs(col: Collection, dirs: Sequence[str], wandb_paths: Sequence[str]) -> None:
    """ValueError, in one line, when the sources hold no complete record: none found, or every one left out."""
    where = ", ".join([*map(str, dirs), *(f"wandb:{w}" for w in wandb_paths)])
    if not col.n_sources and not col.skipped:
        raise ValueError(f"no records in {where} (searched recursively for {layout.RECORD_NAME}): nothing to report")
    if col.table.empty:
        kinds = ", ".join(f"{k}: {n}" for k, n in col.counts().items())
        raise ValueError(f"no complete record in {where}: all {len(col.skipped)} left out ({kinds}; `python -m "
                         "analysis collect` lists why): nothing to report")


def compare_folders(expected: Path, actual: Path) -> list[str]:
    """Differences between two report folders: files missing on either side or with different bytes."""
    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    exp, act = files(expected), files(actual)
    out = [f"only in {expected}: {p}" for p in sorted(exp - act)]
    out += [f"only in the re-run: {p}" for p in sorted(act - exp)]
    out += [f"differs: {p}" for p in sorted(exp & act) if not filecmp.cmp(expected / p, actual / p, shallow=False)]
    return out


def check_report(dirs: Sequence[str], out: str | Path, **kwargs) -> list[str]:
    """Re-run the report into a temporary folder and list how it differs from the committed one in `out`."""
    folder = Path(out)
    if not (folder / INDEX).is_file():
        return [f"{folder / INDEX} does not exist: nothing to check against"]
    if kwargs.get("command") is None:
        levels = [lv.spec for lv in MT.parse_levels(kwargs.get("levels", MT.DEFAULT_LEVELS))]
        kwargs["command"] = default_command(dirs, out, levels, kwargs.get("primary"), kwargs.get("interpolate", True),
                                            kwargs.get("wandb_paths", ()), kwargs.get("reference", MT.DEFAULT_REFERENCE),
                                            kwargs.get("variants", ()), kwargs.get("resamples", BT.DEFAULT_RESAMPLES),
                                            kwargs.get("split_incomparable", False),
                                            kwargs.get("samples", SM.DEFAULT_SAMPLES))
    tmp = Path(tempfile.mkdtemp(prefix="analysis-check-"))
    try:
        write_report(dirs, tmp, **kwargs)
        return compare_folders(folder, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
