"""The report names the world each benchmark's records come from, and the commit that registered the headline
retained KL, which must hold that registration (the report cannot point at a text written later)."""

from __future__ import annotations

import subprocess

import pytest

from analysis import worlds
from tests.conftest import REPO


def test_the_registration_commit_holds_the_headline_and_came_before_no_test_read():
    shown = subprocess.run(["git", "show", f"{worlds.REGISTERED_IN}:docs/evaluation.md"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    if shown.returncode:
        pytest.skip(f"this checkout has no git history with commit {worlds.REGISTERED_IN[:12]}: {shown.stderr.strip()}")
    text = shown.stdout
    assert worlds.REGISTRATION_HEADING in text
    assert "`retained_kl_mean` = (near + far) / 2, each the mean\nover domains of `kl_token_mean`" in text
    # the registration still says the same today
    assert "`retained_kl_mean` = (near + far) / 2" in (REPO / "docs" / "evaluation.md").read_text()


def test_world_lines_label_the_earlier_world_and_name_the_registration():
    lines = worlds.world_lines(["micro", "micro_v3@dev", "paper"])
    assert lines[0].startswith("micro: the earlier micro world (v2")
    assert lines[1].startswith("micro_v3: the micro world v3")
    assert worlds.REGISTERED_IN[:12] in lines[2]
    assert worlds.world_lines(["paper"]) == []
    assert not any(worlds.REGISTERED_IN[:12] in line for line in worlds.world_lines(["micro"]))
