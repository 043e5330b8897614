"""A toy method, added the way every method is: this module and one config file (conf/method/<name>.yaml; the
test writes it into a Hydra search-path folder). Scaled LoRA: LoRA whose update is multiplied by `output_scale`."""

from dataclasses import dataclass

from baselines.lora import LoRA, LoRAParams
from experiments.methods import require


@dataclass(kw_only=True)
class ScaledLoRAParams(LoRAParams):
    """LoRA's, plus a fixed factor on the update."""

    output_scale: float

    def __post_init__(self) -> None:
        super().__post_init__()
        require("output_scale", self.output_scale, self.output_scale > 0, "> 0")


class ScaledLoRA(LoRA):
    """LoRA with s = output_scale * alpha / r: its post-hoc scale multiplies on top."""

    Params = ScaledLoRAParams
    params: ScaledLoRAParams

    def prepare(self, model, ctx):
        model = super().prepare(model, ctx)
        self.scale(model, 1.0)
        return model

    def scale(self, model, alpha: float) -> None:
        super().scale(model, alpha * self.params.output_scale)
