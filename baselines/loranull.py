"""LoRA-Null (Tang et al., 2025, arXiv 2503.02659): the adapter is W0 restricted to the null space of the
retained inputs, its down-projection frozen (the paper's variant that preserves the most).

Per site (the tensor a group of adapted modules reads), with X_R the site's inputs on retained
calibration sequences (prompt + the base's own response, from the reference cache):

    C  = X_R^T X_R / n                              uncentered second moment of the retained inputs
    N  = the m eigenvectors of C with the SMALLEST eigenvalues   [d, m], m = null_dim (null = r)
per adapted module with weight W0:
    W0 N N^T = U S V^T                              (V = N Q, from the SVD of the small W0 N = U S Q^T)
    B0 = U_r sqrt(S_r / s),  A0 = sqrt(S_r / s) V_r^T,  W_res = W0 - s B0 A0
    h  = W_res x + s B A0 x,  B = B0 at init, A0 frozen, only B trains

As in the paper the initial product is subtracted from W0 (its residual weights are W0 - B0 A0), so
the model is the base at init. Every row of A0 lies in span(N), orthogonal to the top d - m retained
eigen-directions, so the update D = s (B - B0) A0 satisfies, on any retained input x,
||D x|| <= ||D||_2 ||N^T x||: it reads only the energy the retained inputs put in N (the m smallest
eigenvalues of C), whatever B learns. With m = r (the paper's construction) the adapter is exactly
W0 N N^T; with m > r it is the top r components of W0 inside the m-dimensional null space.

*Adaptation*: the paper's "pre-trained knowledge" activations come from a few samples of a QA set;
here they are the retained domains' calibration sequences, read through `experiments.activations`
(sites found by a probe pass, inputs over all non-padding tokens, a seeded subsample of
`max_tokens`), as O-LoRA and InfLoRA read them. With fewer sampled tokens than input dimensions the
second moment is singular and N is drawn from its exact null space.

Per-run statistics (N per site, B0 and A0 per module) are saved in the run folder
(`loranull_init.safetensors`) at the first prepare, so a resumed run rebuilds the very same W_res,
B0 and A0. Post-hoc scale is `baselines.common.ResidualLoRA`'s (W0 + alpha D against the true W0).
Export: since A = A0 throughout, D = s (B - B0) A0 is written as a plain rank-r LoRA (up-projection
B - B0, down-projection A0, the same alpha) that loads onto the unmodified base.
Knobs: null_dim, rank, train.steps / train.lr and the post-hoc scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from baselines.common import ResidualLoRA, adapter_bytes, lora_layers, set_residual_init, site_inputs
from baselines.lora import LoRAParams, save_peft
from experiments.methods import RunContext, SiteStatisticsParams, is_int, require

INIT_FILE = "loranull_init.safetensors"


def null_space_basis(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(d, dim) orthonormal eigenvectors of the uncentered second moment x^T x / n with the smallest eigenvalues,
    smallest first (float64 eigen-decomposition of the d x d moment, returned in float32)."""
    d = x.shape[1]
    if not 0 < dim <= d:
        raise ValueError(f"null-space dimension {dim} needs 0 < dim <= {d}")
    x64 = x.detach().double()
    moment = (x64.T @ x64) / max(x.shape[0], 1)
    _, vecs = torch.linalg.eigh(moment)  # eigenvalues ascending
    return vecs[:, :dim].float().contiguous()


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
class LoRANullParams(LoRAParams, SiteStatisticsParams):
    """LoRA's, plus the null-space dimension per site (`null_dim`, null = rank) and the calibration tokens
    per site (`max_tokens`)."""

    null_dim: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("null_dim", self.null_dim, self.null_dim is None or (is_int(self.null_dim) and self.null_dim >= self.rank),
                f"null (= rank) or an integer >= rank ({self.rank})")


class LoRANull(ResidualLoRA):
    """LoRA initialised from W0 on the retained inputs' null space; A frozen, only B trains."""

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
        sites, inputs = site_inputs(model, ctx, targets, p)
        modules = dict(model.named_modules())
        s = p.alpha / p.rank
        out = {}
        for site in sites:
            require("null_dim", null_dim, null_dim <= site.dim, f"at most {site.dim}, the input width of site {site.name}")
            basis = null_space_basis(inputs[site.name].to(ctx.device), null_dim)
            out[f"{site.name}/N"] = basis
            for name in site.modules:
                weight = modules[name].weight
                require("rank", p.rank, p.rank <= weight.shape[0], f"at most {weight.shape[0]}, the output width of {name}")
                out[f"{name}/B0"], out[f"{name}/A0"] = null_factors(weight, basis, p.rank, s)
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
            layer.lora_A["default"].weight.requires_grad_(False)
            self.null_basis[name] = bases[name].to(ctx.device)
        self.remember_init(model, Path(ctx.run_dir), save_adapter=False)
        return model

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """D = s (B - B0) A0 as a plain rank-r LoRA (B - B0, A0, same alpha) on the true base; returns its bytes."""
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
