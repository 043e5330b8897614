"""A method whose training step raises: used to test that failures are recorded."""

from baselines.lora import LoRA


class ExplodingLoRA(LoRA):
    """LoRA that raises at a given optimizer step."""

    def __init__(self, explode_at: int = 2, **kw):
        super().__init__(**kw)
        self.explode_at = explode_at

    def after_step(self, model, ctx):
        if ctx.step == self.explode_at:
            raise RuntimeError(f"boom at step {ctx.step}")
