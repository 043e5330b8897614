"""CorDA, knowledge-preserved mode (Yang et al., NeurIPS 2024, arXiv 2406.05223), through peft.

For each adapted Linear with weight W0 and the uncentered covariance C of its inputs on retained
calibration prompts, peft's `preprocess_corda` takes the SVD  W0 C = U S V^T  and keeps the *last*
r components (KPM: the directions the retained data uses least); `get_peft_model` with
`init_lora_weights="corda"` then sets

    B0 A0 = U_r S_r (V_r^T C^{-1}) / s,   W_res = W0 - s B0 A0

so h = W_res x + s B A x equals the base at init, and training moves B, A away from B0, A0.
The covariance is collected by peft's forward hook, which assumes batch size 1 (it squeezes the
batch dimension and normalises each sequence by its max): the calibration forward passes run one
sequence at a time, unpadded. `include_responses: true` also feeds the base's cached responses.

Post-hoc scale (WiSE-FT against the TRUE W0). The trained model is W0 + D with the converted
update D = s (B A - B0 A0). `scale(alpha)` gives W0 + alpha D by setting the LoRA scale to
alpha * s and the base weight to W_res + (1 - alpha) s B0 A0 (B0, A0 are kept from init), so
alpha = 0 is the base model and alpha = 1 the trained one; the base weight is moved by the
difference from the current alpha, never recomputed from a stored W0.

Export: peft's conversion (`save_pretrained(..., path_initial_model_for_weight_conversion=...)`)
writes D as a plain rank-2r LoRA adapter ([B | B0], [A ; -A0], alpha doubled) that loads onto the
unmodified base with `PeftModel.from_pretrained`. The eigen-decomposition is cached in the run
folder (peft's `cache_file`, with its sha256 beside it: a damaged one is built again), so a resumed run rebuilds
exactly the same W_res, B0 and A0.
Knobs: rank, and the training steps (`train.steps`).
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

from baselines.common import lora_layers
from baselines.lora import LoRA, LoRAParams, save_peft
from experiments.calibration import calibration_pairs, seeded_subset
from experiments.checkpoints import checksum_path, checksum_problem, move_sealed
from experiments.methods import RunContext, is_int, require
from experiments.progress import progress_bar
from experiments.tensor_files import error_summary

log = logging.getLogger("suite.train")

CACHE_FILE = "corda_eigens.pt"
INIT_DIR = "corda_init"


@dataclass(kw_only=True)
class CorDAParams(LoRAParams):
    """LoRA's, plus whether the covariance reads the base's responses too (`include_responses`) and how many
    calibration sequences it averages (`max_sequences`, null = all)."""

    include_responses: bool
    max_sequences: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("include_responses", self.include_responses, isinstance(self.include_responses, bool), "true or false")
        require("max_sequences", self.max_sequences,
                self.max_sequences is None or (is_int(self.max_sequences) and self.max_sequences > 0),
                "null (all calibration prompts) or an integer > 0")


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


class CorDA(LoRA):
    """peft CorDA (KPM) adapters; covariance from retained calibration data."""

    run_files = (CACHE_FILE,)

    Params = CorDAParams
    params: CorDAParams
    exact_export = False  # the export is the converted update: the same function, other float32 rounding

    def __init__(self, params: CorDAParams) -> None:
        super().__init__(params)
        self.init_factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # module -> (B0, A0)
        self.alpha_now = 1.0
        self.init_dir: Optional[Path] = None

    def peft_init(self) -> dict:
        return {"init_lora_weights": "corda"}

    def calibration_ids(self, ctx: RunContext) -> list[list[int]]:
        pairs = seeded_subset(calibration_pairs(ctx), self.params.max_sequences, ctx.seed)
        return [p.prompt_ids + (p.response_ids if self.params.include_responses else []) for p in pairs]

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
            # One unpadded sequence per forward: peft's covariance hook squeezes the batch dimension.
            for ids in progress_bar(self.calibration_ids(ctx), desc="CorDA covariance", disable=not ctx.progress):
                model(input_ids=torch.tensor([ids], device=ctx.device))

        t0 = time.perf_counter()
        preprocess_corda(model, config, run_model=None if reused else run_model)
        if not reused:
            move_sealed(build_file, cache_file)
            config.corda_config.cache_file = str(cache_file)
        self._costs.update(covariance_build_seconds=time.perf_counter() - t0, eigens_reused=reused)
        model = get_peft_model(model, config)
        self.init_factors = {n: (m.lora_B["default"].weight.detach().clone(), m.lora_A["default"].weight.detach().clone())
                             for n, m in lora_layers(model).items()}
        self.alpha_now = 1.0
        # The initial adapter, for peft's conversion of the trained adapter into a plain LoRA at export.
        self.init_dir = run_dir / INIT_DIR
        shutil.rmtree(self.init_dir, ignore_errors=True)
        save_peft(model, self.init_dir)
        return model

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """The converted update D = s (B A - B0 A0) as a plain rank-2r LoRA on the true base; returns its bytes."""
        if self.init_dir is None:
            raise RuntimeError("corda: export before prepare")
        if self.alpha_now != 1.0:
            raise RuntimeError(f"corda: export at scale {self.alpha_now}; call scale(model, 1.0) first")
        save_peft(model, out_dir, path_initial_model_for_weight_conversion=str(self.init_dir))
        return sum(os.path.getsize(p) for p in Path(out_dir).glob("adapter_model.*"))

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """W0 + alpha * s (B A - B0 A0): LoRA scale alpha * s, base weight W_res + (1 - alpha) s B0 A0."""
        layers = lora_layers(model)
        with torch.no_grad():
            for name, layer in layers.items():
                b0, a0 = self.init_factors[name]
                s = layer.lora_alpha["default"] / layer.r["default"]
                weight = layer.get_base_layer().weight
                shift = (self.alpha_now - alpha) * s * (b0.float() @ a0.float())
                weight.copy_((weight.float() + shift.to(weight.device)).to(weight.dtype))
        super().scale(model, alpha)
        self.alpha_now = float(alpha)
