"""The report's `index.html`: self-contained (figures embedded, no script, no outside reference), every table and the
index's text on it, per method a sample of changed retained items and code completions (model output escaped),
deterministic; and rendered by a headless Chromium without console errors into a screenshot that is not blank."""

import base64
import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_synth import code_item, record, retained_item, sweep, write, write_samples
from PIL import Image

from analysis import samples as SM
from analysis.report import write_report
from suite_schema import layout

REFERENCE = "lora:train.steps=900"
EVIL = "<script>alert('x')</script> & </pre>"  # model output that must stay text
COMMAND = "python -m analysis report RECORDS --out REPORT"


def _atlas_samples(seed: int) -> list[dict]:
    """Four math items (three changed, the first prompt hostile), three choice items (one flipped), one far item."""
    items = [retained_item(i, "math", changed=i != 1, prompt=f"s{seed} math {i}" + (f" {EVIL}" if i == 0 else ""))
             for i in range(4)]
    items += [retained_item(i, "choice", changed=i == 2, prompt=f"s{seed} choice {i}") for i in range(3)]
    items.append(retained_item(0, "math", changed=True, set_="far", prompt=f"s{seed} far math 0"))
    return items


def _code() -> list[dict]:
    return [code_item("T/0", 0, False, f"    return {EVIL!r}"), code_item("T/1", 1, False, "    return 1 # fail b"),
            code_item("T/2", 2, True, "    return 2 # pass a"), code_item("T/3", 3, False, "    return 3 # fail c"),
            code_item("T/0", 0, True, "    return 4 # sampled", kind="sample")]


def _write_runs(root: Path) -> None:
    for rec in [record("base", s, 0.10, {"math": 0.0, "commonsense": 0.0}) for s in range(2)]:
        write(root, rec)
    for rec in sweep("lora", [(100, [(0.22, 0.03), (0.23, 0.032)]), (900, [(0.38, 0.12), (0.37, 0.125)])]):
        path = write(root, rec)
        write_samples(path, code=_code())  # no retained samples: made before they were stored
    for rec in sweep("atlas", [(300, [(0.36, 0.02), (0.35, 0.022)])]):
        rec["provenance"]["git_sha"] = "def"  # a second code version: the index warns
        path = write(root, rec)
        write_samples(path, retained=_atlas_samples(rec["seed"]), code=_code())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    _write_runs(root)
    out = root / "report"
    rep = write_report([str(root)], out, reference=REFERENCE, command=COMMAND, samples=2)
    return root, out, rep, (out / "index.html").read_text(encoding="utf-8")


def _section(page: str, start: str, end: str) -> str:
    return page[page.index(start):page.index(end, page.index(start))]


def _table_section(page: str, name: str) -> str:
    start = page.index(f'<h3 id="table-{name}">')
    ends = [i for i in (page.find("<h3", start + 1), page.find("<h2", start + 1)) if i > 0]
    return page[start:min(ends)]


@pytest.mark.slow  # writes a report
def test_page_embeds_every_figure_and_refers_to_nothing_outside(report):
    _, out, rep, page = report
    pngs = sorted((out / "figures").glob("*.png"))
    assert pngs and out / "index.html" in rep.files
    for png in pngs:
        assert f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"' in page
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) == len(pngs) and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    assert "<style>" in page and 'rel="stylesheet"' not in page


@pytest.mark.slow  # writes a report
def test_page_has_every_table_with_the_markdown_cells(report):
    _, out, _, page = report
    mds, checked = sorted((out / "tables").glob("*.md")), 0
    assert mds
    for md in mds:
        text = md.read_text(encoding="utf-8")
        title = text.split("\n", 1)[0].removeprefix("# ")
        assert f'<h3 id="table-{md.stem}">{html.escape(title)}</h3>' in page
        body = _table_section(page, md.stem)
        for line in text.split("\n")[2:]:
            if line.startswith("|") and not line.startswith("|:") and not line.startswith("|-"):
                for cell in re.split(r"(?<!\\)\|", line.strip("|")):
                    cell = cell.strip().replace("\\|", "|")
                    if cell.startswith("**") and cell.endswith("**"):
                        cell = f"<strong>{html.escape(cell[2:-2])}</strong>"
                    else:
                        cell = html.escape(cell)
                    assert f">{cell}</t" in body, (md.name, cell)
                    checked += 1
    assert checked > 100 and "<strong>" in page  # cells of every table, the best values in bold


@pytest.mark.slow  # writes a report
def test_page_has_the_index_text_and_warnings(report):
    _, out, _, page = report
    index = (out / "index.md").read_text(encoding="utf-8")
    assert "the runs come from 2 code versions" in index
    warnings = [ln[2:] for ln in index.split("### Warnings\n\n", 1)[1].split("\n\n", 1)[0].split("\n")]
    for w in warnings:
        assert f"<li>{html.escape(w)}</li>" in page
    assert f"<pre>{html.escape(COMMAND)}</pre>" in page
    assert "[index.html](index.html)" in index and 'href="index.html"' not in page  # index.md points here
    for heading in ("Runs", "Code versions", "Test reads", "Requirement levels", "Tables", "Figures", "Data",
                    "Skipped runs"):
        assert re.search(rf"<h2( id=\"\w+\")?>{heading}</h2>", page), heading


@pytest.mark.slow  # writes a report
def test_page_shows_changed_items_and_completions_escaped(report):
    _, _, _, page = report
    atlas = _section(page, "<h3>ATLAS on micro (micro)</h3>", "<h3>LoRA")
    # The lowest seed's run; two of the three rewritten near math answers (by index), the unchanged one never.
    assert "s0 math 0" in atlas and "s0 math 2" in atlas and "s1 " not in atlas
    assert "s0 math 3" not in atlas and "s0 math 1" not in atlas
    assert "near set, math: 3 of 4 answers rewritten (first 2 shown)" in atlas
    assert "near set, commonsense: 1 of 3 choices flipped (first 1 shown)" in atlas
    assert "s0 choice 2" in atlas and "s0 choice 0" not in atlas
    assert "<pre>0: the first</pre>" in atlas and "<pre>1: the second</pre>" in atlas
    assert "far set, math: 1 of 1 answers rewritten" in atlas
    assert atlas.index("near set, math") < atlas.index("near set, commonsense") < atlas.index("far set, math")
    # Completions: greedy first, passed and failed alternating, up to two.
    assert "# pass a" in atlas and "return &quot;&lt;script&gt;" in atlas and "# fail b" not in atlas
    assert "# sampled" not in atlas
    assert "greedy: 1 of 4 passed; sample: 1 of 1 passed; 2 shown." in atlas
    assert "AssertionError: wrong answer" in atlas
    assert EVIL not in page and html.escape(EVIL) in atlas
    lora = _section(page, "<h3>LoRA on micro (micro)</h3>", "<h3>Base model")
    assert SM.NOT_RECORDED in lora and "# pass a" in lora
    base = _section(page, "<h3>Base model on micro (micro)</h3>", "<h2>Data</h2>")
    assert SM.NOT_RECORDED in base and SM.CODE_NOT_RECORDED in base


def test_samples_unit_rules():
    code = [code_item("A", i, i % 3 == 0) for i in range(6)] + [code_item("A", 0, True, kind="sample")]
    got = SM.code_sample(code, 5)
    assert [(c["kind"], c["index"]) for c in got] == [("greedy", 0), ("greedy", 1), ("greedy", 3), ("greedy", 2),
                                                       ("sample", 0)]
    assert SM.code_sample(code, 0) == []
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(ValueError, match=rf"samples={re.escape(repr(bad))} is not allowed"):
            SM.check_samples(bad)


def test_unreadable_samples_are_named(tmp_path):
    path = write(tmp_path, record("lora", 0, 0.3))
    (path.parent / layout.RETAINED_SAMPLES_NAME).write_text("[{", encoding="utf-8")
    (path.parent / "code_samples.json").write_text('{"not": "a list"}', encoding="utf-8")
    runs = pd.DataFrame([{"backbone": "micro", "benchmark": "micro", "method": "lora", "seed": 0, "scale": 1.0,
                          "sweep_key": "k", "run_id": "r", "source": str(path)},
                         {"backbone": "micro", "benchmark": "micro", "method": "ewc", "seed": 0, "scale": 1.0,
                          "sweep_key": "e", "run_id": "w", "source": "wandb:team/atlas/w"}])
    lora, ewc = SM.method_samples(runs, pd.DataFrame(), "gain:0.75", 3)
    assert lora.retained_note.startswith(f"{path.parent / layout.RETAINED_SAMPLES_NAME}: cannot be read (")
    assert lora.code_note == f"{path.parent / 'code_samples.json'}: not a JSON list of objects"
    assert lora.why == "seed 0 at scale 1" and ewc.retained_note == ewc.code_note == SM.NOT_A_FOLDER


@pytest.mark.slow  # writes a report
def test_page_is_deterministic_and_stale_pages_go(report, tmp_path):
    root, out, _, _ = report
    again = tmp_path / "again"
    (again / "figures").mkdir(parents=True)
    (again / "index.md").write_text("# Analysis report\n", encoding="utf-8")
    stale = again / "figures" / "old.html"
    stale.write_text("old", encoding="utf-8")
    write_report([str(root)], again, reference=REFERENCE, command=COMMAND, samples=2)
    assert (again / "index.html").read_bytes() == (out / "index.html").read_bytes() and not stale.exists()
    with pytest.raises(ValueError, match="samples=-1 is not allowed"):
        write_report([str(root)], tmp_path / "c", reference=REFERENCE, samples=-1)
    assert not (tmp_path / "c").exists()


# ---- headless Chromium -------------------------------------------------------------------------------

def _chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (CI is set): run scripts/install_chromium.sh")
        pytest.skip("chromium is not installed: scripts/install_chromium.sh installs it (Debian's chromium)")
    return browser


def render(page: Path, png: Path, profile: Path, height: int = 2400) -> list[str]:
    """Screenshot `page` with a headless Chromium (1280 px wide) into `png`; its console messages, as Chromium logs
    them on stderr (`INFO:CONSOLE` lines: console calls and uncaught errors)."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size=1280,{height}",
           "--enable-logging=stderr", "--v=0", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert png.is_file(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]


def test_chromium_reports_console_errors(tmp_path):
    """The check below can fail: a page with a console error and an uncaught exception is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('boom'); nothing();</script>"
                   "</body></html>", encoding="utf-8")
    console = render(bad, tmp_path / "bad.png", tmp_path / "profile", height=200)
    assert any("boom" in ln for ln in console) and any("nothing is not defined" in ln for ln in console)


@pytest.mark.slow  # writes a report
def test_chromium_renders_the_page_without_console_errors(report, tmp_path):
    _, out, _, _ = report
    png = tmp_path / "index.png"
    console = render(out / "index.html", png, tmp_path / "profile")
    if os.environ.get("ATLAS_SCREENSHOT_DIR"):  # keep the screenshot to look at
        shutil.copy(png, Path(os.environ["ATLAS_SCREENSHOT_DIR"]) / "index.png")
    assert console == []
    with Image.open(png) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(1 << 24)
        pixels = np.asarray(rgb)
    assert pixels.shape[:2] == (2400, 1280)
    ink = (pixels < 200).any(axis=2)  # dark enough to be text, rules or plot lines
    assert len(colours) > 50 and ink.mean() > 0.01
    # Text and tables reach down the page, not only a heading at the top.
    assert ink[1200:].mean() > 0.005
