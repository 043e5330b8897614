"""`benchmark.protect`: methods calibrate only on the protected retained domains; evaluation keeps all."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.calibration import labelled_calibration_examples, reference_pairs
from experiments.validation import ConfigError
from tests.baselines.baseline_helpers import run_context
from tests.conftest import compose_tiny


def _protecting(tiny, names):
    return dataclasses.replace(tiny.benchmark, protect=names)


def test_null_protect_keeps_every_domain(tiny, tmp_path):
    ctx = run_context(tiny, tmp_path)
    assert tiny.benchmark.protect is None
    assert sorted(ctx.reference().domains) == sorted(tiny.benchmark.retained)
    assert ctx.reference() is tiny.reference


def test_protect_one_domain_filters_what_methods_see(tiny, tmp_path):
    domains = sorted(tiny.benchmark.retained)
    assert len(domains) >= 2, "the tiny benchmark needs two retained domains for this test"
    keep = domains[0]
    ctx = run_context(tiny, tmp_path)
    ctx.benchmark = _protecting(tiny, [keep])
    ref = ctx.reference()
    assert list(ref.domains) == [keep]
    # The view's key differs, so keyed statistics (EWC's Fisher) never mix protect settings.
    assert ref.key != tiny.reference.key and ref.key.startswith(tiny.reference.key)
    n_keep = len(tiny.reference.domains[keep].split("calibration").prompt_ids)
    assert len(reference_pairs(ref)) == n_keep < len(reference_pairs(tiny.reference))
    labelled = labelled_calibration_examples(ctx)
    assert len(labelled) == len(tiny.benchmark.retained[keep].calibration)
    # The full cache is untouched: evaluation still reads every domain.
    assert sorted(tiny.reference.domains) == domains


@pytest.mark.parametrize("value, fragment", [
    ("[nosuch]", "benchmark.protect=['nosuch'] is not allowed"),
    ("[]", "benchmark.protect=[] is not allowed"),
])
def test_protect_names_must_be_retained_domains(tiny_backbone_dir, tiny_benchmark_dir, tmp_path, value, fragment):
    with pytest.raises(ConfigError) as err:
        compose_tiny(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache",
                     f"benchmark.protect={value}")
    assert fragment in str(err.value)
    assert "non-empty list of distinct retained domains" in str(err.value)
