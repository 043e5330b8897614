"""Where a trained run moved the model: mean per-token KL(base || trained) of the next-token distributions on
held-out retained tokens (each domain alone) and on held-out target tokens.

    python -m experiments.evaluation.movement runs/<run_id> [more run dirs] [--data-root DIR] [--cache-dir DIR]
                                                  [--json out.json]

The tokens are those of `experiments.calibration.held_out_sequences` on the run's own split (dev in a dev run):
each retained domain's evaluation prompts followed by the base model's responses, and the code problems' prompts
followed by their reference solutions; KL is taken at the response / solution tokens, in nats per token. The
retained figures measure what the retained KL measures, on the base's own responses; the target figure says how
far the run moved where it was meant to learn. `selectivity` = target / mean over retained domains: how much
more the run moved target tokens than retained ones (a method that learns everywhere alike scores about 1).
Run from the checkout the run was made in (benchmark paths in the config are relative to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from experiments import records
from experiments.backbones import load_model
from experiments.calibration import held_out_sequences
from experiments.evaluation.trained_run import load_run
from experiments.log import quiet_console, stderr_console, timed_phase
from experiments.methods import method_class
from experiments.progress import progress_bar
from experiments.prompts import collate

TARGET_GROUP = "target"


@torch.no_grad()
def token_kl(base: torch.nn.Module, trained: torch.nn.Module, sequences: Sequence[dict], pad_id: int,
             batch_size: int = 16, desc: Optional[str] = None) -> torch.Tensor:
    """(n,) KL(base || trained) in nats at every labelled token (labels != -100) of `sequences`, float32; with
    `desc`, a progress bar (on stderr) over the batches."""
    out = []
    for i in progress_bar(range(0, len(sequences), batch_size), desc=desc, unit="batch", disable=desc is None):
        batch = collate(list(sequences[i:i + batch_size]), pad_id)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        p = torch.log_softmax(base(**inputs).logits.float(), -1)
        q = torch.log_softmax(trained(**inputs).logits.float(), -1)
        mask = batch["labels"] != -100  # the position predicting a labelled token is the one before it
        mask = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
        out.append((p.exp() * (p - q)).sum(-1)[mask])
    return torch.cat(out) if out else torch.zeros(0)


def movement(run_dir: Path, data_root: Optional[str] = None, cache_dir: Optional[str] = None) -> dict:
    """Mean per-token KL(base || trained) per retained domain and on the target, and the selectivity, of one run
    (the base's responses come from the reference cache in `cache_dir`, as evaluation resolves it)."""
    with stderr_console() as log, timed_phase(log.getChild("movement"), f"loading {run_dir} and its backbone"):
        run = load_run(Path(run_dir), data_root, cache_dir)
        typed, tokenizer, base, record = run.config, run.tokenizer, run.base, run.record
        retained, target = held_out_sequences(run.ctx)
        trained = method_class(typed.method._target_).load_export(load_model(typed.backbone), run.export)
    trained.eval()
    kl = {name: float(token_kl(base, trained, seqs, tokenizer.pad_token_id, desc=f"KL {name}").mean())
          for name, seqs in retained.items()}
    kl[TARGET_GROUP] = float(token_kl(base, trained, target, tokenizer.pad_token_id, desc="KL target").mean())
    mean_retained = sum(kl[name] for name in retained) / len(retained)
    return {"run_id": record["run_id"], "method": record.get("method"), "seed": record.get("seed"),
            "split": record.get("split"), "kl": kl,
            "selectivity": kl[TARGET_GROUP] / mean_retained if mean_retained > 0 else float("inf")}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.evaluation.movement",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--data-root", default=None, help="the benchmark's data_root, as the run had it")
    parser.add_argument("--cache-dir", default=None, help="the reference cache folder, as the run had it (eval.cache_dir)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    out = []
    for run_dir in args.run_dirs:
        try:
            res = movement(run_dir, args.data_root, args.cache_dir)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        out.append(res)
        cells = ", ".join(f"{name} {value:.3f}" for name, value in res["kl"].items())
        print(f"{res['run_id']} {res['method']} seed {res['seed']} ({res['split']}): KL(base || trained) per token: "
              f"{cells}; selectivity {res['selectivity']:.1f}")
    if args.json:
        records.atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    quiet_console()  # `... | head`: no traceback when the reader goes
    sys.exit(main())
