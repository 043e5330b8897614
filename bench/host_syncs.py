"""Where a training step would make the host wait for an accelerator: the calls that read a tensor's value on the host.

    python -m bench.host_syncs                          # micro, lora and atlas, 3 steps each
    python -m bench.host_syncs --methods lora,atlas,ewc,lwf,replay --steps 4

On a GPU, the host queues kernels and runs ahead of them; any call that needs a device tensor's value on the host
(`item`, `int(t)`, `if t:`, `tolist`, `nonzero`, a blocking copy) stops it there until the device has finished
everything queued before, so nothing new is queued while the device works. Each method is prepared as `run.py`
prepares it (`bench.throughput.LoopVariant`) and trained by `experiments.train.train` for `--steps` steps while a
`torch.overrides.TorchFunctionMode` (`HostSyncCounter`) records every such call with where it was made: the innermost
frame in this repository, and the library (transformers, peft, torch) if the call was made inside one.

What is counted, on tensors that live on the device:
- value reads (`VALUE_READS`): `item`, `tolist`, `int()`, `float()`, `bool()` (an `if` on a tensor), `index()`,
  `nonzero`, `argwhere`, `unique`, `masked_select`, `repeat_interleave` (their output size is data-dependent);
- blocking copies (`copy_kind`): a host tensor moved to the device without `non_blocking=True`
  (`.to(<device>)`, `.cuda()`), and a device tensor brought to the host (`.cpu()`, `.to("cpu")`).

On a GPU machine (`run.py`, and so this script, trains on the GPU when there is one) "on the device" is the tensor's
own device and the count is exact. On the CPU it is emulated: the model's parameters, buffers and gradients, every
tensor moved with `.to(<device>)`, every tensor made by a factory given a device (but the string "cpu", which code
writes for tensors it keeps on the host), and every result of an operation with such an input are marked as device
tensors; a tensor made on the host from Python values (a collated batch, a sampler's `randperm`, AdamW's step
counters) is not, and `.cpu()` or `.to("cpu")` of a marked tensor is a copy to the host. One artefact remains: on
the CPU `.to(<device>)` returns its own tensor, so a host tensor read after it has been moved is counted; move last.
Written here because torch's own check (`torch.cuda.set_sync_debug_mode`) exists only on CUDA and cannot say where
a call came from.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from bench.common import REPO, command_line, environment, table, write_json
from bench.throughput import LoopVariant
from experiments.train import train

SCRIPT = "host_syncs"
DEFAULT_METHODS = ("lora", "atlas")
VALUE_READS = frozenset({"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "nonzero", "argwhere",
                         "unique", "unique_consecutive", "masked_select", "repeat_interleave"})
LIBRARIES = ("transformers", "peft", "torch", "accelerate")
FLAG = "_bench_on_device"  # the attribute that marks a tensor as living on the (emulated) device


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors in `obj` and, recursively, in its tuples, lists and dict values."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in tensors_in(item)]
    return []


def _names_host(value) -> bool:
    """Whether a device argument is the string "cpu", which code writes for tensors it keeps on the host (AdamW's step
    increment, `.to("cpu")`); a `torch.device` is taken as the run's device."""
    return isinstance(value, str) and value.split(":")[0] == "cpu"


def _device_argument(name: str, args: tuple, kwargs: dict):
    """The device a `.to` call names (keyword or second positional argument), or None (a dtype cast)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    if name == "to" and len(args) > 1 and (isinstance(args[1], torch.device) or (
            isinstance(args[1], str) and args[1].split(":")[0] in ("cpu", "cuda", "mps", "xpu"))):
        return args[1]
    return None


def _non_blocking(name: str, args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("non_blocking")) or (name == "to" and len(args) > 2 and args[2] is True)


def _origin(frame) -> str:
    """'path:line' of the innermost frame in this repository, with ' via <library>' when a library frame lies between
    it and the call."""
    library = None
    while frame is not None:
        filename = frame.f_code.co_filename
        path = Path(filename)
        inside_repo = path.is_relative_to(REPO) and ".venv" not in path.parts and "site-packages" not in path.parts
        if inside_repo and path != Path(__file__).resolve():
            where = f"{path.relative_to(REPO)}:{frame.f_lineno}"
            return where + (f" via {library}" if library else "")
        if library is None and ("site-packages" in path.parts or "dist-packages" in path.parts):
            for name in LIBRARIES:
                if name in path.parts:
                    library = name
                    break
        frame = frame.f_back
    return "outside the repository"


class HostSyncCounter(TorchFunctionMode):
    """Counts the calls that would make the host wait for the device, by call and origin (`counts`).

    `emulate`: decide what lives on the device by marking tensors (see the module docstring; for a run on the CPU);
    otherwise by each tensor's own device (for a run on an accelerator). `watch(model)` marks a model's parameters,
    buffers and (as they are accumulated) gradients when emulating."""

    def __init__(self, emulate: bool) -> None:
        super().__init__()
        self.emulate = emulate
        self.counts: collections.Counter = collections.Counter()
        self._hooks: list = []

    def on_device(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        return getattr(t, FLAG, False) if self.emulate else t.device.type != "cpu"

    @staticmethod
    def mark(t) -> None:
        if isinstance(t, torch.Tensor):
            setattr(t, FLAG, True)

    def watch(self, model: torch.nn.Module) -> None:
        if not self.emulate:
            return
        for t in [*model.parameters(), *model.buffers()]:
            self.mark(t)
        for p in model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda q: self.mark(q.grad)))

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return super().__exit__(*exc)

    def destination(self, name: str, args: tuple, kwargs: dict) -> Optional[str]:
        """Where a `.to` / `.cuda` / `.cpu` call moves its tensor: 'device', 'host', or None when it names no device.
        Emulating, every device is "cpu": `.cpu()` and the string "cpu" mean the host, any other device the run's."""
        if name == "cpu":
            return "host"
        if name == "cuda":
            return "device"
        if name != "to":
            return None
        device = _device_argument(name, args, kwargs)
        if device is None:
            return None
        if self.emulate:
            return "host" if _names_host(device) else "device"
        return "host" if torch.device(device).type == "cpu" else "device"

    def copy_kind(self, name: str, args: tuple, kwargs: dict, destination: Optional[str]) -> Optional[str]:
        """'to device' or 'to host' for a blocking copy between host and device, else None."""
        if destination is None or not args or not isinstance(args[0], torch.Tensor):
            return None
        on_device = self.on_device(args[0])
        if destination == "device" and not on_device and not _non_blocking(name, args, kwargs):
            return "to device"
        if destination == "host" and on_device:
            return "to host"
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        leaves = tensors_in((args, kwargs))
        destination = self.destination(name, args, kwargs)
        copy = self.copy_kind(name, args, kwargs, destination)
        if copy or (name in VALUE_READS and leaves and self.on_device(leaves[0])):
            self.counts[(name if not copy else f"{name} ({copy})", _origin(sys._getframe(1)))] += 1
        out = func(*args, **kwargs)
        # Emulating: a result lives on the device when it was moved there, or computed from a device tensor or made
        # by a factory given a device (but the string "cpu"), and was not moved to the host.
        if self.emulate and destination != "host" and (
                destination == "device" or any(self.on_device(t) for t in leaves)
                or (kwargs.get("device") is not None and not _names_host(kwargs["device"]))):
            for t in tensors_in(out):
                self.mark(t)
        return out


def count_method(name: str, backbone: str, overrides: Sequence[str], steps: int, scratch: Path) -> dict:
    """Prepare `name` as run.py does and train `steps` steps under `HostSyncCounter` (emulating a device when training
    runs on the CPU); the counts per step by call and origin. `direct_per_step` counts the calls made by the suite's
    own code, `via_libraries_per_step` those made inside transformers, peft or torch."""
    variant = LoopVariant(name, backbone, overrides, scratch)
    cfg = dataclasses.replace(variant.train_cfg, steps=steps, warmup_steps=0, checkpoint_every=10**9,
                              keep_checkpoints=1, progress=False)
    variant.ctx.run_dir = scratch / f"{name}-count"
    emulate = variant.ctx.device.type == "cpu"
    with HostSyncCounter(emulate=emulate) as counter:
        counter.watch(variant.model)
        train(variant.model, variant.method, variant.examples, variant.ctx, cfg)
    rows = [{"call": kind, "origin": origin, "count": n, "per_step": n / steps}
            for (kind, origin), n in sorted(counter.counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    total = sum(counter.counts.values())
    direct = sum(n for (_, origin), n in counter.counts.items() if " via " not in origin)
    return {"method": name, "steps": steps, "device": str(variant.ctx.device), "emulated_device": emulate,
            "per_step": total / steps, "direct_per_step": direct / steps,
            "via_libraries_per_step": (total - direct) / steps, "by_origin": rows}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="micro", help="conf/backbone/<name> (default micro)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated conf/method names")
    ap.add_argument("--steps", type=int, default=3, help="training steps counted per method (default 3)")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override for every method (repeatable)")
    ap.add_argument("--out", default=None, help="result JSON (default: bench/results/host_syncs.json)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        raise SystemExit(f"error: --steps {args.steps}: must be >= 1")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if not (REPO / "conf" / "method" / f"{m}.yaml").is_file()]
    if not methods or unknown:
        raise SystemExit(f"error: --methods {args.methods!r}: {unknown or 'none'} not in conf/method")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(device),
               "backbone": args.backbone, "methods": []}
    with tempfile.TemporaryDirectory(prefix="bench-host-syncs-") as tmp:
        for m in methods:
            print(f"[count] {m}", flush=True)
            result = count_method(m, args.backbone, args.override, args.steps, Path(tmp))
            payload["methods"].append(result)
            emulated = " (emulated)" if result["emulated_device"] else ""
            print(f"{m}: {result['per_step']:.1f} per step on {result['device']}{emulated}: "
                  f"{result['direct_per_step']:.1f} by the suite's code, {result['via_libraries_per_step']:.1f} inside "
                  "libraries")
            print(table(["call", "origin", "per step"],
                        [[r["call"], r["origin"], r["per_step"]] for r in result["by_origin"]]), flush=True)
    write_json(args.out, SCRIPT, payload)
    return payload


if __name__ == "__main__":
    main()
