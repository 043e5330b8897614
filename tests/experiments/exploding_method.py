"""Methods whose training goes wrong at a given step: used to test that failures are recorded."""

from dataclasses import dataclass

from baselines.lora import LoRA, LoRAParams


@dataclass(kw_only=True)
class ExplodingParams(LoRAParams):
    explode_at: int = 2


class ExplodingLoRA(LoRA):
    """LoRA that raises at a given optimizer step."""

    Params = ExplodingParams

    def after_step(self, model, ctx):
        if ctx.step == self.params.explode_at:
            raise RuntimeError(f"boom at step {ctx.step}")


class NanLossLoRA(LoRA):
    """LoRA whose loss becomes nan at a given optimizer step."""

    Params = ExplodingParams

    def extra_loss(self, model, batch, ctx):
        if ctx.step != self.params.explode_at:
            return None
        return next(p for p in model.parameters() if p.requires_grad).sum() * float("nan")
