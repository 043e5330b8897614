"""A method's per-site statistics in the run folder: reused by a resumed run, built again when damaged."""

import torch

from experiments.activations import load_or_build_site_tensors


def test_saved_statistics_are_reused_and_damaged_ones_built_again(tmp_path, caplog):
    calls = []

    def build():
        calls.append(1)
        return {"layer.0/basis": torch.arange(64.0).reshape(8, 8)}, {"layer.0": ["q_proj", "v_proj"]}

    path = tmp_path / "olora_basis.safetensors"
    first = load_or_build_site_tensors(path, build)
    again = load_or_build_site_tensors(path, build)
    assert len(calls) == 1 and not first[2] and again[2] and again[1] == {"layer.0": ["q_proj", "v_proj"]}
    raw = path.read_bytes()
    path.write_bytes(raw[:-64] + bytes(b ^ 0xFF for b in raw[-64:-60]) + raw[-60:])  # one value changed in place
    with caplog.at_level("WARNING", logger="suite.train"):
        tensors, sites, loaded = load_or_build_site_tensors(path, build)
    assert len(calls) == 2 and not loaded and torch.equal(tensors["layer.0/basis"], first[0]["layer.0/basis"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} is damaged: does not match its digest (truncated or altered); building it again"]
    assert load_or_build_site_tensors(path, build)[2] and len(calls) == 2
