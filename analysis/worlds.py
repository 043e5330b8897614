"""What each benchmark's records measure, as the report names it: the earlier micro world, and the v3 world whose
headline retained KL was registered (docs/evaluation.md, "Near and far retained items; the headline statistic")
before any of its test-split runs.

`REGISTERED_IN` is the commit that wrote that registration; `tests/analysis/test_worlds.py` checks that the commit
holds it, so the report's line cannot point at a text written later.
"""

from __future__ import annotations

#: The commit whose docs/evaluation.md registers the headline statistic of benchmarks with far items.
REGISTERED_IN = "a56d59de94cc16ac6399bb70cdb0400616153d8f"
#: The heading docs/evaluation.md registers it under.
REGISTRATION_HEADING = "## Near and far retained items; the headline statistic"

#: Benchmark name (before any `@<split>`) -> what its records measure.
WORLDS = {
    "micro": "the earlier micro world (v2, `benchmark=micro`): its retained items share the calibration split's "
             "templates and it has no far items; kept readable, not the world of new comparisons",
    "micro_v3": "the micro world v3: retained KL on near and far items; the headline `retained_kl_mean` is the mean "
                "of the near and far means over domains",
}


def world_lines(benchmarks) -> list[str]:
    """One line per benchmark among `benchmarks` (labels such as `micro_v3@dev`) that `WORLDS` describes, plus the
    registration line where one of them has far items."""
    names = sorted({str(b).split("@", 1)[0] for b in benchmarks})
    lines = [f"{name}: {WORLDS[name]}." for name in names if name in WORLDS]
    if "micro_v3" in names and REGISTERED_IN:
        lines.append(f"The headline statistic was registered in commit {REGISTERED_IN[:12]} (docs/evaluation.md), "
                     "before any micro v3 test-split run; the tables after the main one read the other KLs.")
    return lines
