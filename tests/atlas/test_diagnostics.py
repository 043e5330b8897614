"""The conditioning diagnostics: AUROC against a hand count, every per-site figure against a hand computation
on a hand-built atlas, the scored positions they are also measured at, the report of a prepared ATLAS on the tiny
setup, and `python -m atlas.inspect`, reading a record or measuring a finished run again (`--recompute`)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from atlas.atlas import SiteAtlas
from atlas.diagnostics import auroc, site_report
from atlas.inspect import main as inspect_main
from atlas.layer import AtlasLinear
from tests.atlas.atlas_helpers import layer_site


def test_auroc_counts_pairs_with_ties_half():
    # pairs target > retained: 0.9 beats 3, 0.8 beats 2 and ties 1, 0.3 beats 1: (3 + 2.5 + 1) / 9
    assert auroc(torch.tensor([0.9, 0.8, 0.3]), torch.tensor([0.1, 0.4, 0.8])) == pytest.approx(6.5 / 9)
    assert auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auroc(torch.tensor([0.0]), torch.tensor([1.0])) == 0.0
    with pytest.raises(ValueError):
        auroc(torch.tensor([]), torch.tensor([1.0]))


def hand_site() -> SiteAtlas:
    """Two clusters in 3-d at (0,0,0) and (10,0,0), sigma^2 = 1; each keeps direction e1; gate quantile delta = 1;
    the filter cap is 1 and both clusters use it."""
    centers = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    filters = torch.zeros(2, 3, 1)
    filters[:, 0, 0] = 1.0
    return SiteAtlas(centers, torch.ones(2), filters, torch.tensor([1, 1], dtype=torch.int32), torch.tensor(0.0))


def test_site_report_matches_a_hand_computation():
    site = layer_site(hand_site())
    linear = torch.nn.Linear(3, 2)
    module = AtlasLinear(linear, site, rank=1, alpha=1.0)
    retained = torch.tensor([[0.5, 0.0, 0.0], [10.0, 0.5, 0.0]])  # delta 0.25 each; first all along e1
    target = torch.tensor([[0.0, 3.0, 0.0], [10.0, 0.0, 4.0]])  # delta 9 and 16; all energy off e1 for the first
    report = site_report(site, [module], retained, target, filter_rank=1)
    sig = lambda d: 1.0 / (1.0 + math.exp(-math.log(d)))  # noqa: E731  g = sigmoid(log delta - log q), log q = 0
    assert report["gate_retained"] == pytest.approx((sig(0.25) + sig(0.25)) / 2, rel=1e-5)
    assert report["gate_target"] == pytest.approx((sig(9.0) + sig(16.0)) / 2, rel=1e-5)
    # pass share: ||x||^2 minus the part along e1, over ||x||^2
    assert report["filter_pass_retained"] == pytest.approx((0.0 + 0.25 / 100.25) / 2, rel=1e-5)
    assert report["filter_pass_target"] == pytest.approx((1.0 + 16.0 / 116.0) / 2, rel=1e-5)
    assert report["auroc_delta"] == 1.0 and report["auroc_filter"] == 1.0
    assert report["rank_mean"] == 1.0 and report["at_cap_share"] == 1.0
    assert report["plain_nearest_differs"] == 0.0  # equal radii: plain and normalised distance agree
    assert report["residual_retained"] == 0.0 and "auroc_residual" not in report  # B = 0: no residual yet
    with torch.no_grad():
        module.lora_B.fill_(1.0)
    trained = site_report(site, [module], retained, target, filter_rank=2)
    assert trained["residual_target"] > trained["residual_retained"] >= 0.0 and trained["at_cap_share"] == 0.0


def test_the_diagnostics_phase_says_what_it_does_how_far_it_is_and_how_long_it_took(tiny, tmp_path, capsys):
    """At the end of an ATLAS run the diagnostics take minutes on a real backbone: a start and an end line (with
    seconds) in the log, and progress on stderr for each forward pass and for the site figures."""
    import logging

    from tests.baselines.baseline_helpers import prepared

    model, method, ctx = prepared(tiny, "atlas", tmp_path / "run")
    ctx.progress = True
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("suite.atlas")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `logger.level =`: setLevel clears the cached "is INFO enabled" answers
    capsys.readouterr()
    try:
        report = method.diagnostics(model, ctx)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    n_sites = len(method.sites)
    assert lines[0] == f"diagnostics: gate, filter and residual at {n_sites} sites on held-out tokens ..."
    assert re.fullmatch(r"diagnostics: gate, filter and residual at \d+ sites on held-out tokens: done in "
                        r"\d+\.\d s", lines[-1]), lines
    assert float(lines[-1].split("done in ")[1][:-2]) == pytest.approx(method.costs()["diagnostics_seconds"], abs=0.1)
    err = capsys.readouterr().err  # captured output is no terminal: plain lines, each bar's last state at least
    assert "\r" not in err
    for name in ("retained", "target", *report["by_domain"]):
        assert re.search(rf"^diagnostics {name}: 100%", err, re.M), (name, err)
    total = n_sites * (1 + 2 * len(report["by_domain"]))  # pooled retained, then each domain alone and scored
    assert re.search(rf"^diagnostics sites: 100%.* {total}/{total} ", err, re.M), err


def test_plain_nearest_differs_counts_retained_tokens_the_radii_give_to_another_center():
    """Centers at 0 and 10 on e1 with sigma^2 = 1 and 16: a retained token at 4 is nearer 0 in plain distance (16
    against 36) but nearer 10 in normalised distance (16 against 36 / 16); one at 1 stays with 0 (1 against 81 / 16)."""
    atlas = hand_site()
    atlas.sigma2 = torch.tensor([1.0, 16.0])
    site = layer_site(atlas)
    module = AtlasLinear(torch.nn.Linear(3, 2), site, rank=1, alpha=1.0)
    retained = torch.tensor([[4.0, 0.0, 0.0], [1.0, 0.0, 0.0], [9.0, 0.0, 0.0], [3.5, 0.1, 0.0]])
    target = torch.tensor([[0.0, 3.0, 0.0]])
    report = site_report(site, [module], retained, target, filter_rank=1)
    assert report["plain_nearest_differs"] == pytest.approx(2 / 4)


def test_a_prepared_atlas_reports_every_site_and_inspect_prints_it(tiny, tmp_path, capsys):
    from tests.baselines.baseline_helpers import prepared

    model, method, ctx = prepared(tiny, "atlas", tmp_path / "run")
    report = method.diagnostics(model, ctx)
    assert set(report["sites"]) == {s.name for s in method.sites} and len(report["sites"]) >= 4
    for row in (report["mean"], report["layer0"]):
        assert 0.0 <= row["gate_retained"] <= 1.0 and 0.0 <= row["filter_pass_target"] <= 1.0
        assert 0.0 <= row["auroc_delta"] <= 1.0 and 0.0 <= row["at_cap_share"] <= 1.0
    assert report["layer0"]["n_retained"] > 0 and report["layer0"]["n_target"] > 0
    assert set(report["by_domain"]) == set(ctx.reference().domains) and len(report["by_domain"]) >= 2
    for row in report["by_domain"].values():
        assert 0.0 <= row["gate_retained"] <= 1.0 and 0.0 <= row["auroc_gate"] <= 1.0
    assert set(report["by_domain_scored"]) == set(report["by_domain"])
    for row in report["by_domain_scored"].values():
        assert 0.0 <= row["gate_retained"] <= 1.0 and 0.0 <= row["filter_pass_target"] <= 1.0
    assert method.costs()["diagnostics_seconds"] > 0
    record = {"run_id": "abc", "method": "atlas", "backbone": "tiny", "benchmark": "tiny", "seed": 0,
              "diagnostics": report}
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert inspect_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "AUROC delta" in out and out.count("\n") >= len(report["sites"]) + 3 and "mean" in out
    assert all(f"{name} alone" in out and f"{name} at the scored positions" in out for name in report["by_domain"])
    (tmp_path / "record.json").write_text(json.dumps({**record, "diagnostics": None}))
    assert inspect_main([str(tmp_path)]) == 2


def test_the_report_equals_site_reports_over_a_separate_collection_for_each_comparison(tiny, tmp_path):
    # conditioning_report collects each sequence set once for all its token selections and computes each site's target
    # signals once per selection; the figures must be exactly those of collecting and reporting every comparison alone
    from atlas.diagnostics import _mean, conditioning_report
    from experiments.activations import collect_inputs
    from experiments.calibration import held_out_sequences
    from tests.baselines.baseline_helpers import prepared

    model, method, ctx = prepared(tiny, "atlas", tmp_path / "run")
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, AtlasLinear):
            m.lora_B.data.normal_(0.0, 0.1)  # a nonzero residual, so its figures and AUROC are compared too
    rank = method.params.filter_rank
    report = conditioning_report(model, method.sites, ctx, rank, max_tokens=64, seed=3)
    by_domain_seqs, target_seqs = held_out_sequences(ctx)
    kw = dict(pad_id=ctx.tokenizer.pad_token_id, batch_size=16, max_tokens=64, seed=3, device=ctx.device,
              progress=False)
    named = dict(model.named_modules())

    def alone(seqs, target_inputs, key):
        inputs = collect_inputs(model, method.sites, seqs, token_mask_key=key, **kw)
        return {s.name: site_report(named[s.modules[0]].site, [named[n] for n in s.modules], inputs[s.name],
                                    target_inputs[s.name], rank) for s in method.sites}

    for key, field in (("attention_mask", "by_domain"), ("scored", "by_domain_scored")):
        target = collect_inputs(model, method.sites, target_seqs, token_mask_key=key, **kw)
        assert {name: _mean(alone(seqs, target, key)) for name, seqs in by_domain_seqs.items()} == report[field]
        if key == "attention_mask":
            pooled = alone([s for seqs in by_domain_seqs.values() for s in seqs], target, key)
            assert pooled == report["sites"] and report["mean"] == _mean(pooled)
    assert "auroc_residual" in report["mean"]


def test_site_report_at_conditioning_zero_still_reads_the_filter():
    """At conditioning 0 the layer computes no assignment at all; the report's filter figures still use k*."""
    retained = torch.tensor([[0.5, 0.0, 0.0], [10.0, 0.5, 0.0]])
    target = torch.tensor([[0.0, 3.0, 0.0], [10.0, 0.0, 4.0]])
    reports = {}
    for c in (1.0, 0.0):
        site = layer_site(hand_site(), conditioning=c)
        reports[c] = site_report(site, [AtlasLinear(torch.nn.Linear(3, 2), site, rank=1, alpha=1.0)], retained,
                                 target, filter_rank=1)
    for key in ("filter_pass_retained", "filter_pass_target", "auroc_filter", "auroc_delta"):
        assert reports[0.0][key] == pytest.approx(reports[1.0][key])
    assert reports[0.0]["gate_target"] == 1.0 and reports[0.0]["auroc_gate"] == 0.5


class _Embed(torch.nn.Module):
    """Token id -> (id, 0) into one Linear: a site whose input at a position names the token there."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)

    def forward(self, input_ids, attention_mask=None):
        return self.proj(torch.stack([input_ids.float(), torch.zeros_like(input_ids, dtype=torch.float)], -1))


def test_scored_positions_are_the_last_prompt_token_and_every_response_token_but_the_last():
    from experiments.activations import Site, collect_inputs

    # prompt 11 12 13 + response 14 15; prompt 21 + response 22 23 24 (labels -100 on the prompt)
    seqs = [{"input_ids": [11, 12, 13, 14, 15], "labels": [-100, -100, -100, 14, 15]},
            {"input_ids": [21, 22, 23, 24], "labels": [-100, 22, 23, 24]}]
    site = [Site("s", ["proj"], 2)]
    got = {key: collect_inputs(_Embed(), site, seqs, pad_id=0, progress=False, token_mask_key=key)["s"][:, 0].tolist()
           for key in ("attention_mask", "labels", "scored")}
    assert got["attention_mask"] == [11, 12, 13, 14, 15, 21, 22, 23, 24]
    assert got["labels"] == [14, 15, 22, 23, 24]
    assert got["scored"] == [13, 14, 21, 22, 23]  # each predicts the response token after it
    with pytest.raises(ValueError, match="token_mask_key 'response'"):
        collect_inputs(_Embed(), site, seqs, pad_id=0, progress=False, token_mask_key="response")


def test_one_pass_collects_every_token_selection_as_its_own_pass_would():
    from experiments.activations import Site, collect_inputs, collect_inputs_by_mask

    calls = []

    class Counted(_Embed):
        def forward(self, input_ids, attention_mask=None):
            calls.append(input_ids.shape[0])
            return super().forward(input_ids, attention_mask)

    seqs = [{"input_ids": list(range(10 * i + 1, 10 * i + 3 + i % 4)), "labels": [-100] + list(range(10 * i + 2,
             10 * i + 3 + i % 4))} for i in range(7)]
    site = [Site("s", ["proj"], 2)]
    keys = ("attention_mask", "labels", "scored")
    kw = dict(pad_id=0, batch_size=3, max_tokens=9, seed=4, progress=False)
    model = Counted()
    together = collect_inputs_by_mask(model, site, seqs, keys + ("scored",), **kw)
    assert calls == [3, 3, 1]  # one forward per batch, not one per key
    assert list(together) == list(keys)
    for key in keys:
        alone = collect_inputs(model, site, seqs, token_mask_key=key, **kw)["s"]
        assert together[key]["s"].shape[0] == 9 and torch.equal(together[key]["s"], alone)
    assert not torch.equal(together["labels"]["s"], together["scored"]["s"])
    with pytest.raises(ValueError, match="token_mask_key 'response'"):
        collect_inputs_by_mask(model, site, seqs, ("scored", "response"), **kw)
    with pytest.raises(ValueError, match="at least one"):
        collect_inputs_by_mask(model, site, seqs, (), **kw)


@pytest.mark.slow
def test_recompute_measures_a_finished_run_s_diagnostics_again_from_its_export(tiny_backbone_dir, tiny_benchmark_dir,
                                                                              tmp_path, capsys):
    from suite_schema.layout import RECORD_NAME
    from tests.conftest import run_cli, tiny_overrides

    cache = tmp_path / "cache"
    ov = tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", cache,
                        **{"train.steps": "8", "train.lr": "0.02"})
    for method in ("atlas", "lora"):
        done = run_cli([f"method={method}", *ov])
        assert done.returncode == 0, done.stderr[-3000:]
    runs = {json.loads(p.read_text())["method"]: p.parent for p in (tmp_path / "runs").rglob(RECORD_NAME)}
    record = json.loads((runs["atlas"] / RECORD_NAME).read_text())
    assert inspect_main([str(runs["atlas"]), "--recompute", "--cache-dir", str(cache), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    # The same trained model, split, seed and code: the run's own figures, and the scored positions besides.
    for key in ("gate_retained", "gate_target", "residual_retained", "residual_target", "auroc_gate"):
        assert again["mean"][key] == pytest.approx(record["diagnostics"]["mean"][key], rel=1e-4, abs=1e-6), key
    assert set(again["by_domain_scored"]) == set(record["diagnostics"]["by_domain"])
    for row in again["by_domain_scored"].values():
        assert 0.0 <= row["gate_retained"] <= 1.0 and row["residual_target"] > 0.0
    assert inspect_main([str(runs["atlas"]), "--recompute", "--cache-dir", str(cache)]) == 0
    assert "at the scored positions" in capsys.readouterr().out
    assert inspect_main([str(runs["lora"]), "--recompute", "--cache-dir", str(cache)]) == 2
    assert "holds no atlas" in capsys.readouterr().err
