"""The report as one self-contained page, `index.html`: no server, network or script needed to read it.

It holds `index.md`'s text (runs, code versions, warnings, test reads, levels, data files, skipped runs), every
table rendered from the same `render.Table` as its Markdown and LaTeX files, every figure as an embedded PNG
(base64 data URI), and per method a sample of what it changed (`analysis.samples`). Every text is HTML-escaped
(model output included); the page is a pure function of its inputs, so a re-run gives the same bytes.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Sequence

from analysis import methods as M
from analysis import render
from analysis.samples import MethodSamples, RetainedGroup, value_text

HTML_INDEX = "index.html"
#: index.md's pointer to this page (left out of the page itself).
INDEX_LINE = (f"All of it on one self-contained page, with samples of what each method changed: "
              f"[{HTML_INDEX}]({HTML_INDEX}) (open it in a browser).")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 78em;
       padding: 0 1.5em; color: #1b1f24; background: #fff; line-height: 1.45; }
h1 { border-bottom: 2px solid #1b1f24; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #c8ccd1; padding-bottom: .15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: .9em; }
th, td { border: 1px solid #c8ccd1; padding: .25em .55em; vertical-align: top; }
th { background: #eef1f4; }
tr:nth-child(even) td { background: #f8f9fa; }
td.r, th.r { text-align: right; } td.l, th.l { text-align: left; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .88em; }
pre { background: #f4f5f7; border: 1px solid #dde0e4; padding: .5em; overflow: auto; max-height: 22em;
      white-space: pre-wrap; word-break: break-word; margin: 0; }
td pre { max-height: 12em; }
figure { margin: 1em 0 2em; } figure img { max-width: min(100%, 60em); border: 1px solid #dde0e4; }
figcaption { font-size: .9em; color: #444; }
.note { color: #555; font-style: italic; }
.tnote { color: #444; font-size: .85em; margin: .3em 0; max-width: 70em; }
.absent { color: #8a5a00; font-style: italic; }
.passed { color: #116329; font-weight: 600; } .failed { color: #a40e26; font-weight: 600; }
.caption { font-size: .9em; color: #444; margin: .2em 0; }
"""


# ---- the Markdown of index.md, the few constructs it uses ----------------------------------------

_CODE = re.compile(r"`([^`]*)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def inline(text: str) -> str:
    """One line of index.md's Markdown as escaped HTML: `code`, [links](href), **bold**, *italic*, escaped pipes."""
    out = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        s = html.escape(part.replace("\\|", "|"), quote=True)
        s = _LINK.sub(lambda m: f'<a href="{m.group(2)}">{m.group(1)}</a>', s)
        s = _BOLD.sub(r"<strong>\1</strong>", s)
        out.append(_ITALIC.sub(r"<em>\1</em>", s))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))] if line.strip() != "|" else []


def _md_table(rows: list[str]) -> list[str]:
    head, sep, body = _cells(rows[0]), _cells(rows[1]), [_cells(r) for r in rows[2:]]
    aligns = ["r" if s.endswith(":") and not s.startswith(":") else "l" for s in sep]
    out = ["<table>", "<tr>" + "".join(f'<th class="{a}">{inline(h)}</th>' for h, a in zip(head, aligns)) + "</tr>"]
    for r in body:
        out.append("<tr>" + "".join(f'<td class="{a}">{inline(c)}</td>' for c, a in zip(r, aligns)) + "</tr>")
    return out + ["</table>"]


def markdown(text: str) -> str:
    """index.md's Markdown as HTML: headings, fenced code, pipe tables, `- ` lists and paragraphs."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
        elif m := re.match(r"(#{1,6}) (.*)", line):
            n = len(m.group(1))
            out.append(f"<h{n}>{inline(m.group(2))}</h{n}>")
            i += 1
        elif line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out += _md_table(lines[i:j])
            i = j
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{inline(lines[i][2:])}</li>")
                i += 1
            out += ["<ul>", *items, "</ul>"]
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"(#{1,6} |```|\||- )", lines[i]):
                para.append(inline(lines[i]))
                i += 1
            out.append("<p>" + " ".join(para) + "</p>")
    return "\n".join(out)


def sections(text: str) -> list[tuple[str, str]]:
    """index.md cut at its `## ` headings: (heading, Markdown from that heading on); the part before the first has
    heading ""."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in text.split("\n"):
        if line.startswith("## "):
            out.append((line[3:].strip(), []))
        out[-1][1].append(line)
    return [(h, "\n".join(body)) for h, body in out]


# ---- tables, figures and samples -----------------------------------------------------------------

def table_html(table: render.Table, shows: str = "") -> str:
    """A `render.Table` as an HTML table (group column, alignment and the bold best as in its Markdown), with its
    title, the `shows` line and its notes; its `absent` sentence when it has nothing to show."""
    out = [f'<h3 id="table-{html.escape(table.name)}">{html.escape(table.title)}</h3>']
    if shows:
        out.append(f'<p class="caption">{html.escape(shows)}</p>')
    if table.absent is not None:
        return "\n".join(out + [f'<p class="absent">{html.escape(table.absent)}</p>'])
    grouped = bool(table.groups) and any(table.groups)
    header = ([table.group_header] if grouped else []) + table.columns
    aligns = (["l"] if grouped else []) + [render._align(table, j) for j in range(len(table.columns))]
    out += ["<table>", "<tr>" + "".join(f'<th class="{a}">{html.escape(h)}</th>' for h, a in zip(header, aligns))
            + "</tr>"]
    mask, prev = table.bold_mask(), None
    for i, row in enumerate(table.rows):
        cells = []
        if grouped:
            g = table.groups[i]
            cells.append(html.escape(g) if g != prev else "")
            prev = g
        for j, cell in enumerate(row):
            text = html.escape(cell.text)
            cells.append(f"<strong>{text}</strong>" if mask[i][j] and text else text)
        out.append("<tr>" + "".join(f'<td class="{a}">{c}</td>' for c, a in zip(cells, aligns)) + "</tr>")
    out.append("</table>")
    out += [f'<p class="tnote">{inline(n)}</p>' for n in table.notes]
    return "\n".join(out)


def figure_html(title: str, png: Path) -> str:
    """A figure as an embedded PNG (base64 data URI) with its title as caption."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    alt = html.escape(title, quote=True)
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(title)} ({html.escape(png.name)})</figcaption></figure>")


def _pre(text) -> str:
    return f"<pre>{html.escape(value_text(text))}</pre>"


def _choice(item: dict, key: str) -> str:
    idx, choices = item.get(key), item.get("choices") or []
    if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(choices):
        return f"{idx}: {choices[idx]}"
    return value_text(idx)


def _retained_html(g: RetainedGroup, label: str) -> list[str]:
    what = "choices flipped" if g.kind == "choice" else "answers rewritten"
    out = [f"<h5>{html.escape(g.set)} set, {html.escape(g.domain)}: {g.n_changed} of {g.n_items} {what}"
           f"{f' (first {len(g.shown)} shown)' if g.shown else ''}</h5>"]
    if not g.shown:
        return out
    out.append(f"<table><tr><th>Item</th><th>Prompt</th><th>Gold</th><th>Base</th><th>{html.escape(label)}</th></tr>")
    for it in g.shown:
        item = html.escape(value_text(it["id"] if it.get("id") is not None else it.get("index")))
        if g.kind == "choice":
            gold, base, new = (html.escape(_choice(it, "gold")), _pre(_choice(it, "base_choice")),
                               _pre(_choice(it, "adapted_choice")))
        else:
            gold = html.escape(value_text(it.get("gold")))
            base = _pre(it.get("base_answer"))
            if it.get("base_text") is not None:
                base += f"<details><summary>generation</summary>{_pre(it['base_text'])}</details>"
            new = _pre(it.get("adapted_answer"))
            if it.get("adapted_text") is not None:
                new += f"<details><summary>generation</summary>{_pre(it['adapted_text'])}</details>"
        out.append(f"<tr><td>{item}</td><td>{_pre(it.get('prompt'))}</td><td>{gold}</td><td>{base}</td>"
                   f"<td>{new}</td></tr>")
    return out + ["</table>"]


def samples_html(samples: Sequence[MethodSamples]) -> str:
    """Per method: the run shown, its changed retained items (base vs method) and its code completions."""
    out = ['<h2 id="samples">What each method changed</h2>',
           "<p>Per method one run (how it was chosen is named); its retained items whose answer or choice the method "
           "changed, the base model's next to the method's, and its code completions with their sandbox verdicts. "
           "Model output is shown as text.</p>"]
    if not samples:
        return "\n".join(out + ['<p class="note">No complete runs.</p>'])
    for s in samples:
        label = M.label(s.method)
        out.append(f"<h3>{html.escape(label)} on {html.escape(s.backbone)} ({html.escape(s.benchmark)})</h3>")
        out.append(f'<p class="caption">Run <code>{html.escape(s.run_id)}</code>, seed {s.seed}, scale '
                   f"{render.fmt_num(s.scale)}: {inline(s.why)}; <code>{html.escape(s.source)}</code></p>")
        out.append("<h4>Retained items</h4>")
        if s.retained_note:
            out.append(f'<p class="note">{html.escape(s.retained_note)}</p>')
        for g in s.retained:
            out += _retained_html(g, label)
        out.append("<h4>Code completions</h4>")
        if s.code_note:
            out.append(f'<p class="note">{html.escape(s.code_note)}</p>')
            continue
        counts = "; ".join(f"{kind}: {p} of {n} passed" for kind, (p, n) in s.code_counts.items())
        out.append(f'<p class="caption">{html.escape(counts)}; {len(s.code)} shown.</p>')
        if s.code:
            out.append("<table><tr><th>Task</th><th>Kind</th><th>Verdict</th><th>Completion</th></tr>")
            for c in s.code:
                status = value_text(c.get("status"))
                cls = "passed" if status == "passed" else "failed"
                reason = f"<br>{html.escape(value_text(c['reason']))}" if c.get("reason") else ""
                out.append(f"<tr><td>{html.escape(value_text(c.get('task_id')))}</td><td>"
                           f"{html.escape(value_text(c.get('kind')))} #{html.escape(value_text(c.get('index')))}</td>"
                           f'<td><span class="{cls}">{html.escape(status)}</span>{reason}</td>'
                           f"<td>{_pre(c.get('completion'))}</td></tr>")
            out.append("</table>")
    return "\n".join(out)


def page(index_md: str, tables: Sequence[tuple[render.Table, str]],
         figures: Sequence[tuple[str, Path]], missing: Sequence[str], samples: Sequence[MethodSamples]) -> str:
    """The whole page: index.md's sections in order, its Tables and Figures sections replaced by the rendered
    `tables` ((table, what it shows)) and embedded `figures` ((title, PNG path)) and the figures `missing`, then the
    method samples before the data files."""
    body = []
    for heading, md in sections(index_md):
        if heading == "Tables":
            body.append('<h2 id="tables">Tables</h2>')
            body += [table_html(t, shows) for t, shows in tables]
        elif heading == "Figures":
            body.append('<h2 id="figures">Figures</h2>')
            body += [figure_html(title, png) for title, png in figures]
            if missing:
                body += ["<p>Not drawn:</p>", "<ul>", *[f"<li>{html.escape(m)}</li>" for m in missing], "</ul>"]
            body.append(samples_html(samples))
        else:
            body.append(markdown(md.replace(f"\n{INDEX_LINE}\n", "\n")))
    return "\n".join(['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      "<title>Analysis report</title>", f"<style>{CSS}</style>", "</head>", "<body>",
                      *body, "</body>", "</html>", ""])
