"""Self-replay: retained calibration prompts with the base model's own responses mixed into the target SFT batches.

Minimising the NLL of the base's samples y ~ p_base(.|x) is, in expectation over y,
KL(p_base || p_theta) + const on the replayed prompts (cf. SDFT, Yang et al., ACL 2024,
arXiv 2402.13669): replay without gold labels. Responses come from the reference cache's
calibration split (sampled at the reference temperature with the reference seed). With
`labelled: true` the replayed responses are the benchmark's gold answers instead, rendered with
`experiments.prompts` exactly as the evaluation sees them.

Per micro-batch of B target examples, k replayed examples with E[k] = rho * B (`mode: replace`:
the last k target examples are replaced, so the share is k / B) or E[k] = rho * B / (1 - rho)
(`mode: append`: all B target examples stay, the share is k / (B + k)). k is floor(E[k]) plus one
with probability frac(E[k]); k and the replayed items are drawn from a generator seeded by
(seed, step, micro-batch), so a resumed run replays exactly what an uninterrupted one would.
The loss is the loop's SFT loss on response tokens of every example in the batch. Knob: rho.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from baselines.common import MicroCounter, step_generator
from baselines.lora import LoRA, LoRAParams
from experiments.calibration import calibration_pairs, labelled_calibration_examples, pair_example
from experiments.methods import RunContext, require

MODES = ("replace", "append")


def replay_count(batch_size: int, rho: float, mode: str, u: float) -> int:
    """Replayed examples in one micro-batch: floor(E[k]) + (u < frac(E[k])), E[k] as the module docstring says."""
    expected = rho * batch_size if mode == "replace" else rho * batch_size / (1.0 - rho)
    k = math.floor(expected)
    if u < expected - k:
        k += 1
    return min(k, batch_size) if mode == "replace" else k


@dataclass(kw_only=True)
class ReplayParams(LoRAParams):
    """LoRA's, plus the replayed share `rho`, whether replayed examples `replace` target ones or are
    `append`ed, and whether they carry gold answers (`labelled`) instead of the base's own responses."""

    rho: float
    mode: str
    labelled: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        require("mode", self.mode, self.mode in MODES, f"one of {list(MODES)}")
        ok = 0.0 <= self.rho <= 1.0 if self.mode == "replace" else 0.0 <= self.rho < 1.0
        require("rho", self.rho, ok, "in [0, 1] (mode replace) or [0, 1) (mode append)")
        require("labelled", self.labelled, isinstance(self.labelled, bool), "true or false")


class Replay(LoRA):
    """LoRA trained on target batches with a share rho of retained calibration examples mixed in."""

    Params = ReplayParams
    params: ReplayParams

    def __init__(self, params: ReplayParams) -> None:
        super().__init__(params)
        self.pool: list[dict[str, list[int]]] = []
        self._micro = MicroCounter()

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        if self.params.labelled:
            self.pool = labelled_calibration_examples(ctx)
        else:
            self.pool = [pair_example(p) for p in calibration_pairs(ctx)]
        self._costs["replay_pool_size"] = len(self.pool)
        return super().prepare(model, ctx)

    def draw(self, batch_size: int, ctx: RunContext, index: int) -> list[dict[str, list[int]]]:
        """The replayed examples of micro-batch `index` of step `ctx.step`."""
        g = step_generator(ctx.seed, ctx.step, index, "replay")
        k = replay_count(batch_size, self.params.rho, self.params.mode, float(torch.rand((), generator=g)))
        if k == 0:
            return []
        n = len(self.pool)
        if k <= n:
            picks = torch.randperm(n, generator=g)[:k].tolist()
        else:
            picks = torch.randint(n, (k,), generator=g).tolist()
        return [self.pool[i] for i in picks]

    def mix_batches(self, examples: list[dict], ctx: RunContext) -> list[dict]:
        if not self.pool:
            raise RuntimeError("replay: prepare() was not called (no replay pool)")
        index = self._micro.next(ctx.step)
        replayed = self.draw(len(examples), ctx, index)
        if self.params.mode == "replace":
            return list(examples[: len(examples) - len(replayed)]) + replayed
        return list(examples) + replayed
