"""bench.host_syncs: which calls would make the host wait for the device, counted on the CPU by marking device tensors,
and the training loop's own count (one read per step)."""

import json

import pytest
import torch

from bench import host_syncs
from bench.host_syncs import HostSyncCounter


def counted(counter: HostSyncCounter) -> dict[str, int]:
    out: dict[str, int] = {}
    for (call, _), n in counter.counts.items():
        out[call] = out.get(call, 0) + n
    return out


def test_reads_of_device_tensors_count_and_reads_of_host_tensors_do_not():
    model = torch.nn.Linear(3, 2)
    with HostSyncCounter(emulate=True) as counter:
        counter.watch(model)
        host = torch.tensor([1.0, 2.0, 3.0])  # made on the host from Python values
        assert host.sum().item() == 6.0 and host.tolist() == [1.0, 2.0, 3.0] and int(host[0]) == 1
        out = model(host)  # a parameter among the inputs: the result lives on the device
        out.sum().item()
        bool(out[0] > 0)
        out.nonzero()
        float(out[1].detach())
        made_there = torch.zeros(2, device=model.weight.device)  # a factory given the device
        made_there.tolist()
    assert counted(counter) == {"item": 1, "__bool__": 1, "nonzero": 1, "__float__": 1, "tolist": 1}
    # the origin is the line of this file that made the call
    assert all(origin.startswith("tests/bench/test_host_syncs.py:") for _, origin in counter.counts)


def test_copies_between_host_and_device():
    model = torch.nn.Linear(3, 2)
    device = model.weight.device
    with HostSyncCounter(emulate=True) as counter:
        counter.watch(model)
        host = torch.ones(4, 3)
        moved = host.to(device)  # waits: a blocking host-to-device copy
        queued = torch.ones(4, 3).to(device, non_blocking=True)  # does not wait
        model(moved).cpu()  # device to host: waits
        model(queued).to("cpu")  # the same, spelled as .to("cpu")
        model(moved).to(torch.float64)  # a cast, not a copy between devices
        model.weight.to(device)  # already there
        queued.sum().item()  # the non-blocking copy's result lives on the device
    assert counted(counter) == {"to (to device)": 1, "cpu (to host)": 1, "to (to host)": 1, "item": 1}


def test_gradients_and_optimizer_state_are_on_the_device_but_adamw_step_counters_are_not():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with HostSyncCounter(emulate=True) as counter:
        counter.watch(model)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()  # reads its step counters with .item(): host tensors, no wait
        assert counted(counter) == {}
        model.weight.grad.norm().item()
        opt.state[model.weight]["exp_avg"].sum().item()
    assert counted(counter) == {"item": 2}
    # the gradient hooks are removed on exit: a gradient accumulated afterwards is not marked
    opt.zero_grad(set_to_none=True)
    model(torch.ones(1, 3)).sum().backward()
    assert model.weight.grad is not None and not getattr(model.weight.grad, host_syncs.FLAG, False)


def test_on_a_real_device_only_tensors_off_the_cpu_count():
    with HostSyncCounter(emulate=False) as counter:
        torch.ones(2).sum().item()
        torch.ones(2).to("cpu")
    assert counted(counter) == {}


@pytest.mark.slow
def test_command_line_counts_one_read_per_step_in_the_loop(tmp_path, monkeypatch):
    """`python -m bench.host_syncs` on micro: the suite's own code reads once per training step (the step's loss
    and gradient norm, together) whatever the number of length groups; before, it read 18 (per length group: the loss, the token count,
    the logit positions, and three blocking copies)."""
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "host_syncs.json"
    host_syncs.main(["--methods", "lora", "--steps", "2", "--out", str(out)])
    payload = json.loads(out.read_text())
    (lora,) = payload["methods"]
    assert lora["method"] == "lora" and lora["steps"] == 2 and lora["emulated_device"]
    direct = [r for r in lora["by_origin"] if " via " not in r["origin"]]
    assert [(r["call"], r["origin"].split(":")[0], r["count"]) for r in direct] == [
        ("tolist", "experiments/train.py", 2)]
    assert lora["direct_per_step"] == 1.0
    assert lora["per_step"] == lora["direct_per_step"] + lora["via_libraries_per_step"]


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps 0"),
    (["--methods", "lora,nosuch"], "nosuch"),
])
def test_bad_arguments_are_refused_before_any_work(argv, message):
    with pytest.raises(SystemExit, match=message):
        host_syncs.main(argv)
