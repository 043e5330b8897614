"""A method whose steps take a fixed wall time: time-limit tests need training that lasts as long
as planned whatever the machine's speed."""

import time
from dataclasses import dataclass

from baselines.lora import LoRA, LoRAParams


@dataclass(kw_only=True)
class SlowParams(LoRAParams):
    step_sleep_s: float = 0.1


class SlowLoRA(LoRA):
    """LoRA that sleeps `step_sleep_s` after every optimizer step."""

    Params = SlowParams

    def after_step(self, model, ctx):
        super().after_step(model, ctx)
        time.sleep(self.params.step_sleep_s)
