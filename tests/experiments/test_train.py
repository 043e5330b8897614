"""The one training loop: response-only loss, loss falls, checkpoints, exact resume after a signal."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from baselines.lora import LoRA
from experiments.backbones import load_backbone
from experiments.checkpoints import checkpoint_paths
from experiments.config import train_config
from experiments.methods import RunContext, build_named
from experiments.prompts import code_instruction_prompt, encode_pair
from experiments.train import (
    DataStream,
    Diverged,
    Preempted,
    seed_everything,
    train,
)
from tests.conftest import backbone_config, tiny_code


def setup(backbone_dir, run_dir: Path, method=None):
    seed_everything(0)
    bb = backbone_config(backbone_dir, name="tiny", target_modules=["q_proj", "v_proj", "up_proj"])
    model, tok = load_backbone(bb)
    ctx = RunContext(tokenizer=tok, benchmark=None, run_dir=run_dir, seed=0, target_modules=list(bb.target_modules))
    method = method or build_named("lora", rank=4, alpha=8)
    model = method.prepare(model, ctx)
    items = [{"instruction": "Complete the following Python function.", "input": p["prompt"],
              "response": p["canonical_solution"]} for p in tiny_code(10)]
    examples = [encode_pair(tok, code_instruction_prompt(i), i["response"], 96) for i in items]
    return model, method, examples, ctx, tok


def run_train(model, method, examples, ctx, tok, steps=8, lr=5e-3, **kw):
    return train(model, method, examples, ctx, train_config(steps=steps, lr=lr, batch_size=4, grad_accum=2,
                                                            checkpoint_every=3, progress=False, **kw))


def test_encode_pair_masks_the_prompt(tiny_backbone_dir):
    _, _, examples, _, tok = setup(tiny_backbone_dir, Path("/nonexistent"))
    ex = examples[0]
    n_prompt = sum(1 for l in ex["labels"] if l == -100)
    assert n_prompt > 0 and all(l == -100 for l in ex["labels"][:n_prompt])
    assert ex["labels"][n_prompt:] == ex["input_ids"][n_prompt:]
    assert ex["input_ids"][-1] == tok.eos_token_id
    # the prompt's final newline belongs to the response (prompts.split_boundary)
    assert tok.decode(ex["input_ids"][:n_prompt]).endswith("### Response:")
    assert tok.decode(ex["input_ids"][n_prompt:-1]) == "\n" + tiny_code(1)[0]["canonical_solution"]


@pytest.mark.trains
def test_loss_falls(tiny_backbone_dir, tmp_path):
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    result = run_train(model, method, examples, ctx, tok, steps=30, lr=3e-2)
    assert len(result.losses) == 30
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 0.2  # nats
    assert result.tokens_seen > 0 and result.train_seconds > 0


def test_data_stream_resumes_the_same_order():
    a = DataStream(7, seed=3)
    first = a.take(10)
    b = DataStream(7, seed=3)
    b.restore(a.state())
    assert a.take(12) == b.take(12)
    assert sorted(first[:7]) == list(range(7))  # an epoch is a permutation


class SignalAt(LoRA):
    """LoRA that sends itself a signal after a given optimizer step (a kill arriving mid-training)."""

    def __init__(self, at_step, signum, **kw):
        super().__init__(build_named("lora", **kw).params)
        self.at_step, self.signum = at_step, signum

    def after_step(self, model, ctx):
        if ctx.step == self.at_step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.trains
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_signal_checkpoints_and_resume_matches_uninterrupted(tiny_backbone_dir, tmp_path, signum):
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path / "straight")
    straight = run_train(model, method, examples, ctx, tok)

    run_dir = tmp_path / "interrupted"
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, run_dir, SignalAt(4, signum, rank=4, alpha=8))
    with pytest.raises(Preempted) as info:
        run_train(model, method, examples, ctx, tok)
    assert info.value.step == 4 and checkpoint_paths(run_dir)[-1].name == "step_00000004.pt"

    model, method, examples, ctx, tok = setup(tiny_backbone_dir, run_dir)  # a fresh process would do the same
    resumed = run_train(model, method, examples, ctx, tok)
    assert resumed.resumed_from == 4
    assert resumed.losses[:4] == straight.losses[:4]
    assert resumed.final_loss == pytest.approx(straight.final_loss, rel=1e-6, abs=1e-7)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


@pytest.mark.trains
def test_checkpoints_are_pruned_and_final_step_saved(tiny_backbone_dir, tmp_path):
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    run_train(model, method, examples, ctx, tok, steps=8, keep_checkpoints=2)
    assert [p.name for p in checkpoint_paths(tmp_path)] == ["step_00000006.pt", "step_00000008.pt"]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def _damage(path: Path, how: str) -> None:
    """Break a checkpoint as a crash, a full disk, bad storage or a stray command would."""
    import shutil

    import torch

    from experiments.checkpoints import save_checkpoint, step_of

    raw = path.read_bytes()
    if how == "half":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "flipped":  # same size, bytes inside a tensor changed: torch.load reads it without an error
        middle = len(raw) // 2
        path.write_bytes(raw[:middle] + bytes(b ^ 0xFF for b in raw[middle:middle + 16]) + raw[middle + 16:])
        torch.load(path, map_location="cpu", weights_only=False)
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "no_fields":  # a valid file with a matching checksum that is not the loop's state
        save_checkpoint(path.parents[1], step_of(path), {"step": step_of(path)}, keep=10)
    else:  # another step's state with its checksum
        for suffix in ("", ".sha256"):
            shutil.copyfile(path.with_name(f"step_00000006.pt{suffix}"), path.with_name(path.name + suffix))


@pytest.mark.trains
@pytest.mark.parametrize("how", ["half", "empty", "flipped", "directory", "no_fields", "other_step"])
def test_a_broken_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_newest_intact_one(
        tiny_backbone_dir, tmp_path, how, caplog):
    """A newest checkpoint that is truncated, empty, altered in place, a folder, or not the loop's state is moved to
    checkpoints/broken/ with one warning line naming it; the run resumes from the newest intact one and ends where an
    uninterrupted run ends."""
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    straight = run_train(model, method, examples, ctx, tok, keep_checkpoints=3)
    newest = checkpoint_paths(tmp_path)[-1]
    assert newest.name == "step_00000008.pt"
    _damage(newest, how)

    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    with caplog.at_level("WARNING", logger="suite.train"):
        resumed = run_train(model, method, examples, ctx, tok, keep_checkpoints=3)
    aside = list((tmp_path / "checkpoints" / "broken").iterdir())
    assert [p.name for p in aside if p.name.startswith("step_00000008-") and p.suffix == ".pt"], aside
    assert len(caplog.records) == 1, caplog.text
    assert caplog.records[0].getMessage().startswith(f"checkpoint {newest} is broken: ")
    assert caplog.records[0].getMessage().endswith(f"; moved to {[p for p in aside if p.suffix == '.pt'][0]}")
    assert resumed.resumed_from == 6 and resumed.losses == pytest.approx(straight.losses, rel=1e-6, abs=1e-7)
    assert [p.name for p in checkpoint_paths(tmp_path)] == ["step_00000003.pt", "step_00000006.pt", "step_00000008.pt"]


@pytest.mark.trains
def test_with_every_checkpoint_broken_the_run_trains_from_scratch(tiny_backbone_dir, tmp_path, caplog):
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    straight = run_train(model, method, examples, ctx, tok, steps=4)
    for path in checkpoint_paths(tmp_path):
        _damage(path, "half")
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path)
    with caplog.at_level("WARNING", logger="suite.train"):
        again = run_train(model, method, examples, ctx, tok, steps=4)
    assert again.resumed_from is None and again.losses == straight.losses
    assert len(caplog.records) == 2 and all("is broken: " in r.getMessage() for r in caplog.records)


class BreaksAt(LoRA):
    """LoRA whose step `at_step` goes wrong: a nan loss term (`part="loss"`), or an infinite gradient under a finite
    loss (`part="gradient"`)."""

    def __init__(self, at_step, part, **kw):
        super().__init__(build_named("lora", **kw).params)
        self.at_step, self.part = at_step, part

    def extra_loss(self, model, batch, ctx):
        if ctx.step != self.at_step:
            return None
        weight = next(p for p in model.parameters() if p.requires_grad)
        if self.part == "loss":
            return weight.sum() * float("nan")
        weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # training stops at this step
        return weight.sum() * 0.0


def train_every_step_saved(model, method, examples, ctx, **kw):
    """Six steps at a constant learning rate, with every step's checkpoint kept."""
    return train(model, method, examples, ctx, train_config(steps=6, batch_size=4, grad_accum=2, warmup_steps=0,
                                                            scheduler="constant", checkpoint_every=1,
                                                            keep_checkpoints=10, progress=False, **kw))


@pytest.mark.trains
@pytest.mark.parametrize("part, max_grad_norm, message", [
    ("loss", 1.0, r"^loss became nan at step 3 \(lr 0.005 at this step, train.lr=0.005\)$"),
    ("gradient", 0.0, r"^gradient norm became inf at step 3 \(lr 0.005 at this step, train.lr=0.005\)$"),
])
def test_a_nan_loss_or_gradient_stops_training_at_that_step_without_its_checkpoint(tiny_backbone_dir, tmp_path, part,
                                                                                   max_grad_norm, message):
    """Step 3 goes wrong: training stops there (no step 4 begins), keeps the checkpoints of steps 1 and 2, writes none
    of step 3, and says what became what; with clipping off (max_grad_norm 0) the gradient norm is measured all the
    same."""
    model, method, examples, ctx, _ = setup(tiny_backbone_dir, tmp_path, BreaksAt(3, part, rank=4, alpha=8))
    with pytest.raises(Diverged, match=message) as info:
        train_every_step_saved(model, method, examples, ctx, lr=5e-3, max_grad_norm=max_grad_norm)
    assert info.value.step == 3 and ctx.step == 3
    assert [p.name for p in checkpoint_paths(tmp_path)] == ["step_00000001.pt", "step_00000002.pt"]


class StoppedAt(SignalAt):
    """LoRA that stops its own process (SIGSTOP) after a given step; a helper process continues it `seconds` later."""

    def __init__(self, at_step, seconds, **kw):
        super().__init__(at_step, signal.SIGSTOP, **kw)
        self.seconds = seconds

    def after_step(self, model, ctx):
        if ctx.step == self.at_step:
            subprocess.Popen(["sh", "-c", f"sleep {self.seconds}; kill -CONT {os.getpid()}"])
        super().after_step(model, ctx)


@pytest.mark.trains
@pytest.mark.slow  # starts a helper process
def test_training_time_leaves_out_the_time_the_process_was_stopped(tiny_backbone_dir, tmp_path):
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path, StoppedAt(2, 2.0, rank=4, alpha=8))
    t0 = time.perf_counter()
    result = run_train(model, method, examples, ctx, tok, steps=3)
    wall = time.perf_counter() - t0
    assert wall > 2.0 and 0 < result.train_seconds < wall - 1.8, (wall, result.train_seconds)
    assert signal.getsignal(signal.SIGCONT) == signal.SIG_DFL and signal.set_wakeup_fd(-1) == -1  # all restored
