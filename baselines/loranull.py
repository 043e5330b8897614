"""LoRA-Null (Tang et al., 2025, arXiv 2503.02659) as the authors' code (github.com/HungerPWAY/LoRA-Null:
build_adapter.py --singular_aware, adapterlib/act_aware_utils.py, adapterlib/decomposition.py
decompose_to_adapter2, train_model.py) builds it: the adapter is W0 restricted to the null space of the retained
prompts' activations.

Per site (the tensor a group of adapted modules reads; q/k/v read one, so one covariance serves them):
    C = the authors' covariance of the site's input: the retained calibration prompts (no responses) packed into
        windows of max_length tokens, one window per forward, each window X divided by |max X|,
        C = sum_w X_w^T X_w / n_windows   (`baselines.corda.prompt_windows`, `window_covariances`; CorDA's)
    N = the m eigenvectors of C with the SMALLEST eigenvalues   [d, m], m = null_dim (null = r, the authors')
per adapted module with weight W0:
    W0 N N^T = U S V^T                              (V = N Q, from the SVD of the small W0 N = U S Q^T)
    B0 = U_r sqrt(S_r / s),  A0 = sqrt(S_r / s) V_r^T,  W_res = W0 - s B0 A0  (= W0 - W0 N N^T when m = r)
    h  = W_res x + s B A x, training from B = B0, A = A0
The authors' adapter has no scale (h = W_res x + U sqrt(S) sqrt(S) V^T x; their LoRA runs use lora_alpha = r), so
`alpha: null` (= rank, s = 1) gives their factors. Both factors train (their train_model.py, "LoRA-Null v1");
`freeze_a: true` is their train_model_freeze_a.py ("v2": the down-projection A frozen, which the paper reports
preserves more): then every row of A lies in span(N) for good and ||D x|| <= ||D||_2 ||N^T x|| on any input x.

*Adaptation*: the authors' "pre-trained knowledge" activations come from 256 windows of 2048 tokens of NQ-open
questions; here from the retained domains' calibration prompts, packed the same way into windows of the run's
`max_length` (at most 256 windows), their sum divided by the number of windows (theirs by the constant 256; the
scale of C does not move its eigenvectors).
Eigenvectors: float64 `eigh` of C (the authors: float32 SVD of C; the same subspace up to float32 rounding); ties at
the m-th smallest eigenvalue are broken by eigh's order (the subspace is not unique there, as in theirs).

Per-run statistics (N per site, B0 and A0 per module) are saved in the run folder (`loranull_init.safetensors`) at
the first prepare, so a resumed run rebuilds the very same W_res, B0 and A0. Post-hoc scale is
`baselines.common.ResidualLoRA`'s (W0 + alpha D against the true W0). Export: the converted update
D = s (B A - B0 A0) as a plain rank-2r LoRA (ResidualLoRA's); with `freeze_a` (A = A0 throughout)
D = s (B - B0) A0 as a plain rank-r LoRA (up-projection B - B0, down-projection A0, the same alpha).
Knobs: rank, null_dim, train.steps / train.lr and the post-hoc scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from baselines.common import ResidualLoRA, adapter_bytes, lora_layers, probe_ids, set_residual_init
from baselines.corda import prompt_windows, require_definition, window_covariances
from baselines.lora import LoRAParams, save_peft
from experiments.activations import discover_sites
from experiments.methods import RunContext, is_int, require

INIT_FILE = "loranull_init.safetensors"


def null_space_of(covariance: torch.Tensor, dim: int) -> torch.Tensor:
    """(d, dim) orthonormal eigenvectors of the (d, d) covariance with the smallest eigenvalues, smallest first
    (float64 `eigh`, returned in float32)."""
    d = covariance.shape[0]
    if not 0 < dim <= d:
        raise ValueError(f"null-space dimension {dim} needs 0 < dim <= {d}")
    c = covariance.detach().double()
    _, vecs = torch.linalg.eigh((c + c.T) / 2)  # eigenvalues ascending
    return vecs[:, :dim].float().contiguous()


def null_space_basis(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`null_space_of` the uncentered second moment x^T x / n of (n, d) inputs x."""
    x64 = x.detach().double()
    return null_space_of((x64.T @ x64) / max(x.shape[0], 1), dim)


def null_factors(weight: torch.Tensor, null_basis: torch.Tensor, rank: int,
                 scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B0 [out, rank], A0 [rank, in]): s B0 A0 = the top `rank` singular components of W0 N N^T.

    From the SVD of the small W0 N = U S Q^T: W0 N N^T = U S (N Q)^T, so A0's rows lie in span(N).
    """
    basis = null_basis.to(weight.device).float()
    if not 0 < rank <= min(weight.shape[0], basis.shape[1]):
        raise ValueError(f"rank {rank} needs 0 < rank <= min(out features {weight.shape[0]}, null_dim {basis.shape[1]})")
    u, s, qh = torch.linalg.svd(weight.detach().float() @ basis, full_matrices=False)
    root = (s[:rank] / scaling).sqrt()
    v = qh[:rank] @ basis.T  # (rank, in): orthonormal rows inside span(N)
    return u[:, :rank] * root, root[:, None] * v


@dataclass(kw_only=True)
class LoRANullParams(LoRAParams):
    """LoRA's, with `alpha: null` meaning alpha = rank (s = 1, the authors' unscaled adapter); the definition
    (`authors` only), the null-space dimension per site (`null_dim`, null = rank), the most prompt windows the
    covariance reads (`max_windows`, the authors' 256) and whether A is frozen (`freeze_a`, the paper's v2)."""

    alpha: Optional[float]
    definition: str
    null_dim: Optional[int]
    max_windows: int
    freeze_a: bool

    def __post_init__(self) -> None:
        require_definition(self.definition)
        require("max_windows", self.max_windows, is_int(self.max_windows) and self.max_windows > 0, "an integer > 0")
        require("freeze_a", self.freeze_a, isinstance(self.freeze_a, bool), "true or false")
        if self.alpha is None and is_int(self.rank):
            self.alpha = float(self.rank)
        require("alpha", self.alpha, self.alpha is not None, "null (= rank) or > 0")
        super().__post_init__()
        require("null_dim", self.null_dim, self.null_dim is None or (is_int(self.null_dim) and self.null_dim >= self.rank),
                f"null (= rank) or an integer >= rank ({self.rank})")


class LoRANull(ResidualLoRA):
    """LoRA initialised from W0 on the null space of the retained prompts' activations (both factors train unless
    `freeze_a`)."""

    run_files = (INIT_FILE,)

    Params = LoRANullParams
    params: LoRANullParams

    def __init__(self, params: LoRANullParams) -> None:
        super().__init__(params)
        self.null_basis: dict[str, torch.Tensor] = {}  # backbone module name -> N [d, m]

    def build_init(self, model: torch.nn.Module, ctx: RunContext, targets: list[str]):
        """(`<site>/N` for every site, `<module>/B0` and `<module>/A0` for every adapted module, site -> modules)."""
        p = self.params
        null_dim = p.null_dim or p.rank
        modules = dict(model.named_modules())
        sites = discover_sites(model, targets, probe_ids(ctx))
        for site in sites:
            require("null_dim", null_dim, null_dim <= site.dim, f"at most {site.dim}, the input width of site {site.name}")
        windows = prompt_windows(ctx, p.max_windows)
        covariances = window_covariances(model, {site.name: modules[site.modules[0]] for site in sites}, windows,
                                         ctx.device, ctx.progress)
        s = p.alpha / p.rank
        out = {}
        for site in sites:
            basis = null_space_of(covariances[site.name], null_dim)
            out[f"{site.name}/N"] = basis
            for name in site.modules:
                weight = modules[name].weight
                require("rank", p.rank, p.rank <= weight.shape[0], f"at most {weight.shape[0]}, the output width of {name}")
                out[f"{name}/B0"], out[f"{name}/A0"] = null_factors(weight, basis.to(weight.device), p.rank, s)
        return out, {site.name: site.modules for site in sites}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        tensors, sites = self.run_statistics(ctx, INIT_FILE, lambda: self.build_init(model, ctx, targets),
                                             "null_space_build_seconds", "null_space_reused")
        bases = {m: tensors[f"{site}/N"] for site, modules in sites.items() for m in modules}
        model = super().prepare(model, ctx)  # plain peft LoRA layers (LoRA.prepare), factors set below
        for name, layer in lora_layers(model).items():
            if f"{name}/A0" not in tensors:
                raise RuntimeError(f"LoRA-Null has no null-space factors for adapted module {name}")
            set_residual_init(layer, tensors[f"{name}/B0"], tensors[f"{name}/A0"])
            layer.lora_A["default"].weight.requires_grad_(not self.params.freeze_a)
            self.null_basis[name] = bases[name].to(ctx.device)
        self.remember_init(model, Path(ctx.run_dir), save_adapter=not self.params.freeze_a)
        return model

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """The converted update on the true base (ResidualLoRA's rank-2r LoRA); with `freeze_a`, D = s (B - B0) A0 as
        a plain rank-r LoRA (B - B0, A0, same alpha). Returns its bytes."""
        if not self.params.freeze_a:
            return super().export(model, out_dir)
        self.check_exportable()
        layers = lora_layers(model)
        trained = {n: m.lora_B["default"].weight.detach().clone() for n, m in layers.items()}
        try:
            with torch.no_grad():
                for name, layer in layers.items():
                    b = layer.lora_B["default"].weight
                    b.copy_(trained[name] - self.init_factors[name][0].to(b.device, b.dtype))
            save_peft(model, out_dir)
        finally:
            with torch.no_grad():
                for name, layer in layers.items():
                    layer.lora_B["default"].weight.copy_(trained[name])
        return adapter_bytes(out_dir)
