"""A method whose training step raises: used to test that failures are recorded."""

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
