"""CorDA, knowledge-preserved mode (Yang et al., NeurIPS 2024, arXiv 2406.05223), as the authors' code
(github.com/iboing/CorDA: build_corda.py, cordalib/act_aware_utils.py, cordalib/decomposition.py) builds it, through
peft's port of the same steps (`preprocess_corda`, `init_lora_weights="corda"`), driven to match it:

Covariance of each adapted Linear's input (the authors' forward hook; peft's is the same, in float32 as the
authors' README gives as their default):
  the retained calibration prompts (no responses), in a seeded order, joined by the tokens of "\\n\\n" into one
  stream cut into consecutive windows of `max_length` tokens, at most `max_windows` of them; one window per
  forward pass (batch 1, no padding); each window's inputs X (tokens x in) are divided by |max X| (the magnitude
  of the signed maximum, as theirs), and
      C = sum_w X_w^T X_w / n_windows
Decomposition (float32):
  C_d = C + damp mean(diag C) I, damp = 0.01, doubled until ||C_d C_d^-1 - I||_F < 0.05
  W0 C_d = U S V^T (singular values descending); KPM keeps the LAST r components (the smallest)
  B0 = U_r sqrt(S_r / s),  A0 = sqrt(S_r / s) V_r^T C_d^-1,  W_res = W0 - s B0 A0,  s = alpha / r
The authors' adapter has no scale (their forward is W_res x + U sqrt(S) sqrt(S) V^T C_d^-1 x, and their LoRA
baseline uses lora_alpha = r), so `alpha: null` (= rank, s = 1) gives their factors exactly; peft's S /= s keeps
s B0 A0 the same for any alpha but shrinks both factors by sqrt(s). Both factors train.

*Adaptation*: the authors' "knowledge" data are NQ-open questions packed into 2048-token windows (Llama-2's
context), 256 windows; here the retained domains' calibration prompts, packed the same way into windows of the run's
`max_length`, at most 256 windows. Their hook divides the sum by the constant 256, their window count in every run;
here the sum is divided by the number of windows (the same whenever there are 256).

Ties: the split between kept and frozen components is whatever order float32 `torch.linalg.svd` returns, as in
the authors' code. When the r-th and (r+1)-th smallest singular values of W0 C_d are equal the kept subspace is not
unique (any rotation of the tied block is as valid); W_res + s B0 A0 = W0 and the adapter's singular values (the r
smallest) hold either way. Near ties are resolved exactly as the authors' code resolves them, since the same C
reaches the same float32 SVD.

Post-hoc scale, export and resume: `baselines.common.ResidualLoRA` (W0 + alpha D against the true W0; the converted
update D = s (B A - B0 A0) as a plain rank-2r LoRA). The decomposition is cached in the run folder (peft's
`cache_file`, its sha256 beside it; a damaged one is built again), so a resumed run rebuilds the same W_res, B0, A0.
Knobs: rank (the authors: 128 on Llama-2-7B), train.steps.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from peft import get_peft_model
from peft.tuners.lora.config import CordaConfig
from peft.tuners.lora.corda import preprocess_corda

from baselines.common import ResidualLoRA
from baselines.lora import LoRAParams
from experiments.calibration import reference_pairs
from experiments.checkpoints import checksum_path, checksum_problem, move_sealed
from experiments.methods import RunContext, is_int, require
from experiments.progress import progress_bar
from experiments.prompts import encode_text
from experiments.tensor_files import error_summary

log = logging.getLogger("suite.train")

CACHE_FILE = "corda_eigens.pt"
INIT_DIR = "corda_init"
WINDOW_SEPARATOR = "\n\n"  # the authors join the QA questions with it before cutting windows
DEFINITION_HELP = ('"authors" (records of the earlier definition "2026-11" stay readable, but that definition no '
                   'longer runs)')


def require_definition(definition: str) -> None:
    """Only the authors' definition runs (`definition: authors`)."""
    require("definition", definition, definition == "authors", DEFINITION_HELP)


def prompt_windows(ctx: RunContext, max_windows: int) -> list[list[int]]:
    """Token windows of the retained calibration prompts as the authors' calibration loader cuts its QA text: the
    prompts (no responses) in an order drawn with the run's seed, joined by the tokens of "\\n\\n", cut into
    consecutive windows of `ctx.max_length` tokens (the last one may be shorter), the first `max_windows` of them."""
    prompts = [p.prompt_ids for p in reference_pairs(ctx.reference(), ctx.max_length, drop_empty=False)]
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(ctx.seed)).tolist()
    separator = encode_text(ctx.tokenizer, WINDOW_SEPARATOR)
    stream: list[int] = []
    for i, index in enumerate(order):
        stream += (separator if i else []) + list(prompts[index])
    size = ctx.max_length
    return [stream[i:i + size] for i in range(0, len(stream), size)][:max_windows]


@torch.no_grad()
def window_covariances(model: torch.nn.Module, modules: dict[str, torch.nn.Module], windows: list[list[int]],
                       device: torch.device | str, progress: bool = False) -> dict[str, torch.Tensor]:
    """Name -> (in, in) float32 covariance of each module's input as the authors' hook builds it: per window (one
    forward pass each) X / |max X|, then sum_w X_w^T X_w / n_windows. (CorDA's own run goes through peft's hook,
    which computes the same; LoRA-Null uses this one.)"""
    sums: dict[str, torch.Tensor] = {}

    def hook_for(name: str):
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            x = x / x.max().abs()
            sums[name] = sums.get(name, 0) + x.T @ x
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in modules.items()]
    was_training = model.training
    model.eval()
    try:
        for ids in progress_bar(windows, desc="covariance", disable=not progress):
            model(input_ids=torch.tensor([ids], device=device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {n: sums[n] / len(windows) for n in modules}


def intact_cache(path: Path) -> bool:
    """Whether the decomposition an earlier attempt saved at `path` can be reused: it matches its checksum file (one
    written before those existed: it loads). A damaged one is said in one warning line and removed."""
    problem = checksum_problem(path)
    if problem is None and not checksum_path(path).exists():
        try:
            torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as exc:  # torch raises RuntimeError, EOFError, OSError, ... for a damaged file
            problem = f"cannot be read ({error_summary(exc)})"
    if problem:
        log.warning("%s is damaged: %s; building it again", path, problem)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        checksum_path(path).unlink(missing_ok=True)
    return problem is None


@dataclass(kw_only=True)
class CorDAParams(LoRAParams):
    """LoRA's, with `alpha: null` meaning alpha = rank (s = 1, the authors' unscaled adapter); the definition
    (`authors` only) and the most prompt windows the covariance reads (`max_windows`, the authors' 256)."""

    alpha: Optional[float]
    definition: str
    max_windows: int

    def __post_init__(self) -> None:
        require_definition(self.definition)
        require("max_windows", self.max_windows, is_int(self.max_windows) and self.max_windows > 0, "an integer > 0")
        if self.alpha is None and is_int(self.rank):
            self.alpha = float(self.rank)
        require("alpha", self.alpha, self.alpha is not None, "null (= rank) or > 0")
        super().__post_init__()


class CorDA(ResidualLoRA):
    """CorDA (KPM) adapters as the authors build them, through peft; covariance from retained calibration prompts."""

    run_files = (CACHE_FILE,)
    init_dir_name = INIT_DIR

    Params = CorDAParams
    params: CorDAParams

    def peft_init(self) -> dict:
        return {"init_lora_weights": "corda"}

    def calibration_windows(self, ctx: RunContext) -> list[list[int]]:
        """The token windows the covariance reads (`prompt_windows`)."""
        return prompt_windows(ctx, self.params.max_windows)

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        run_dir = Path(ctx.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        cache_file = run_dir / CACHE_FILE
        reused = cache_file.exists() and intact_cache(cache_file)
        # peft writes its cache with a plain torch.save: build into a temporary name, then rename.
        build_file = cache_file if reused else run_dir / f".{CACHE_FILE}.tmp-{os.getpid()}"
        config = self.lora_config(targets, corda_config=CordaConfig(corda_method="kpm", cache_file=str(build_file),
                                                                    verbose=False))

        def run_model() -> None:
            # One unpadded window per forward: peft's covariance hook (like the authors') squeezes the batch dimension.
            for ids in progress_bar(self.calibration_windows(ctx), desc="CorDA covariance", disable=not ctx.progress):
                model(input_ids=torch.tensor([ids], device=ctx.device))

        t0 = time.perf_counter()
        preprocess_corda(model, config, run_model=None if reused else run_model)
        if not reused:
            move_sealed(build_file, cache_file)
            config.corda_config.cache_file = str(cache_file)
        self._costs.update(covariance_build_seconds=time.perf_counter() - t0, eigens_reused=reused)
        model = get_peft_model(model, config)
        self.remember_init(model, run_dir)
        return model
