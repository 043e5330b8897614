"""A toy method, added the way every method is (docs/baselines.md, "Adding a method"). Scaled LoRA: LoRA whose update
is multiplied by a fixed `output_scale`. tests/experiments/test_toy_method.py runs it from a config in a Hydra
search-path folder; tests/test_new_method.py adds it to a copy of the repository as `baselines/scaled_lora.py`."""

from dataclasses import dataclass
from pathlib import Path

from baselines.lora import LoRA, LoRAParams
from experiments.methods import require


@dataclass(kw_only=True)
class ScaledLoRAParams(LoRAParams):
    """LoRA's, plus a fixed factor on the update."""

    output_scale: float

    def __post_init__(self) -> None:
        super().__post_init__()
        require("output_scale", self.output_scale, self.output_scale > 0, "a number > 0")


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

    def export(self, model, out_dir: Path) -> int:
        """LoRA's export and the params (`output_scale`), which `load_export` needs."""
        stored = super().export(model, out_dir)
        self.write_params(out_dir)
        return stored

    @classmethod
    def load_export(cls, model, export_dir: Path):
        """LoRA's export on `model`, at the trained update's scale."""
        model = super().load_export(model, export_dir)
        cls(cls.read_params(export_dir)).scale(model, 1.0)
        return model
