"""The one training loop every method hooks into: SFT on response tokens, checkpoints, exact resume.

A run killed (SIGTERM) or preempted (SIGUSR2) saves a checkpoint at the next step boundary: the
method's trainable state, optimizer, scheduler, data position and every RNG state. Re-running the
same config resumes from the newest intact checkpoint (`experiments.checkpoints`) and ends where an uninterrupted
run would.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from transformers import get_scheduler

from experiments.batching import sft_loss_sum, target_groups
from experiments.checkpoints import resume, save_checkpoint
from experiments.config import TrainConfig
from experiments.methods import Method, RunContext
from experiments.progress import progress_bar
from experiments.stopped_time import StoppedTime

log = logging.getLogger("suite.train")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Preempted(Exception):
    """Training stopped at a step boundary after a signal; a checkpoint for `step` was saved."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}; checkpoint {checkpoint}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(RuntimeError):
    """The loss or the gradient norm of a step became nan or infinite: training stopped at that step, before its
    checkpoint (what the step's update made of the model is nan too, or will be)."""

    def __init__(self, step: int, what: str, value: float, lr: float, configured_lr: float) -> None:
        kind = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        super().__init__(f"{what} became {kind} at step {step} (lr {lr:.3g} at this step, train.lr={configured_lr:g})")
        self.step = step


@dataclass
class TrainResult:
    """What training did: steps, per-step losses (mean SFT loss over the step's micro-batches), time (the steps' wall
    time, less any time the process was stopped: `experiments.stopped_time`), tokens."""

    steps: int
    losses: list[float] = field(default_factory=list)
    tokens_seen: int = 0
    train_seconds: float = 0.0
    resumed_from: Optional[int] = None

    @property
    def final_loss(self) -> Optional[float]:
        return self.losses[-1] if self.losses else None


class DataStream:
    """Endless seeded stream of example indices: epoch e is a permutation drawn from seed + e.

    Its position (epoch, offset) is all a checkpoint needs to continue the exact same order.
    """

    def __init__(self, n: int, seed: int) -> None:
        if n <= 0:
            raise ValueError("the training set is empty")
        self.n, self.seed = n, seed
        self.epoch, self.offset = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.offset == self.n:
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.offset])
            self.offset += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def restore(self, state: dict) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._order = self._permutation(self.epoch)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """Learning-rate schedule from transformers: constant, linear or cosine decay after linear warmup."""
    name = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[kind]
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max(total, 1))


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and Python's RNG."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class SignalFlag:
    """Records SIGTERM/SIGUSR2 so the loop can checkpoint at a step boundary; restores handlers on exit.

    After the checkpoint, a previous Python-level handler (e.g. a cluster launcher's requeue
    handler) is called with the signal, so this loop composes with it instead of replacing it.
    """

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "SignalFlag":
        for sig in HANDLED_SIGNALS:
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no signal handling possible
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def forward(self) -> None:
        """Call the handler that was installed before ours, if it was a Python callable."""
        handler = self.previous.get(self.signum)
        if callable(handler):
            handler(self.signum, None)


def train(
    model: torch.nn.Module,
    method: Method,
    examples: list[dict],
    ctx: RunContext,
    cfg: TrainConfig,
    *,
    log_fn: Optional[Callable[[dict, int], None]] = None,
    autocast_dtype: Optional[torch.dtype] = None,
) -> TrainResult:
    """Train `model` for `cfg.steps` optimizer steps of `cfg.batch_size` x `cfg.grad_accum` encoded examples.

    Loss: mean token cross-entropy on response tokens (labels != -100) per micro-batch, divided
    by `grad_accum`, plus the method's `extra_loss` (once per micro-batch, given its last group). A micro-batch
    runs as at most `cfg.length_groups` right-padded groups of similar length, with logits only at target
    positions (`experiments.batching`: the same loss). Resumes from the newest intact checkpoint in `ctx.run_dir`
    when one exists (broken ones are moved aside: `experiments.checkpoints.resume`). Raises `Preempted` after
    saving a checkpoint on a signal, and `Diverged` (saving nothing) at the first step whose loss or gradient norm
    is nan or infinite.
    `cfg` is a `TrainConfig` whose batch size and accumulation are set (`experiments.config.resolved_train`).
    """
    if cfg.batch_size is None or cfg.grad_accum is None:
        raise ValueError("train(): cfg.batch_size and cfg.grad_accum must be set (experiments.config.resolved_train)")
    steps, batch_size, grad_accum, pad_id = cfg.steps, cfg.batch_size, cfg.grad_accum, ctx.tokenizer.pad_token_id
    params = method.trainable_parameters(model)
    if steps > 0 and not params:
        raise ValueError(f"method {method.name!r} left no trainable parameters")
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = make_scheduler(optimizer, cfg.scheduler, cfg.warmup_steps, steps)
    stream = DataStream(len(examples), ctx.seed)
    result = TrainResult(steps=steps)
    start = 0

    resumed = resume(ctx.run_dir)
    if resumed:
        path, state = resumed
        method.load_state_dict(model, state["method"])
        optimizer.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        stream.restore(state["stream"])
        set_rng_state(state["rng"])
        start = state["step"]
        result.losses = list(state["losses"])
        result.tokens_seen = state["tokens_seen"]
        result.train_seconds = state["train_seconds"]
        result.resumed_from = start
        log.info("resumed from checkpoint %s at step %d", path.name, start)

    def snapshot(step: int) -> dict:
        return {
            "step": step,
            "method": method.state_dict(model),
            "optimizer": optimizer.state_dict(),
            "scheduler": sched.state_dict(),
            "stream": stream.state(),
            "rng": rng_state(),
            "losses": result.losses,
            "tokens_seen": result.tokens_seen,
            "train_seconds": result.train_seconds,
        }

    model.train()
    bar = progress_bar(total=steps, initial=start, desc=f"train {method.name}", disable=not cfg.progress, dynamic_ncols=True)
    with SignalFlag() as flag, StoppedTime() as stopped:
        for step in range(start + 1, steps + 1):
            t0, stopped0 = time.perf_counter(), stopped.seconds
            ctx.step = step
            optimizer.zero_grad(set_to_none=True)
            # The step's loss is summed on the device (float64, as a Python float sum would be) and read once, at the
            # end of the step: a read per group would make the host wait for each backward (bench.host_syncs).
            step_total = None
            for _ in range(grad_accum):
                micro = method.mix_batches([examples[i] for i in stream.take(batch_size)], ctx)
                groups = target_groups(micro, pad_id, cfg.length_groups, ctx.device)
                if not groups.batches:
                    raise ValueError(f"train(): step {step}: none of the micro-batch's {len(micro)} examples has a "
                                     "response token to train on (labels all -100)")
                for g_index, batch in enumerate(groups.batches):  # one forward and backward per length group
                    with torch.autocast(ctx.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        loss = sft_loss_sum(model, batch) / groups.targets
                        if g_index == len(groups.batches) - 1:  # the method's term once per micro-batch
                            extra = method.extra_loss(model, batch, ctx)
                            if extra is not None:
                                loss = loss + extra
                    (loss / grad_accum).backward()
                    part = loss.detach().double() / grad_accum
                    step_total = part if step_total is None else step_total + part
                result.tokens_seen += groups.tokens
            # max_grad_norm 0 (no clipping): an infinite bound scales nothing, and the norm is still measured
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or math.inf)
            lr = sched.get_last_lr()[0]
            optimizer.step()
            sched.step()
            method.after_step(model, ctx)
            step_loss, norm = torch.stack((step_total, grad_norm.to(step_total))).tolist()  # the step's one read
            for what, value in (("loss", step_loss), ("gradient norm", norm)):
                if not math.isfinite(value):
                    bar.close()
                    raise Diverged(step, what, value, lr, cfg.lr)
            result.losses.append(step_loss)
            result.train_seconds += max(0.0, time.perf_counter() - t0 - (stopped.seconds - stopped0))
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}")
            if log_fn and (step % cfg.log_every == 0 or step == steps):
                log_fn({"train/loss": step_loss, "train/lr": sched.get_last_lr()[0], "train/tokens": result.tokens_seen}, step)
            if flag.signum is not None:
                path = save_checkpoint(ctx.run_dir, step, snapshot(step), cfg.keep_checkpoints)
                bar.close()
                log.info("%s: checkpoint saved at step %d", signal.Signals(flag.signum).name, step)
                flag.forward()
                raise Preempted(flag.signum, step, path)
            if step % cfg.checkpoint_every == 0 or step == steps:
                save_checkpoint(ctx.run_dir, step, snapshot(step), cfg.keep_checkpoints)
    bar.close()
    model.eval()
    return result
