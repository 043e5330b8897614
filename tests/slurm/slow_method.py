"""A method whose steps take a fixed wall time: time-limit tests need training that lasts as long
as planned whatever the machine's speed."""

import time

from baselines.lora import LoRA


class SlowLoRA(LoRA):
    """LoRA that sleeps `step_sleep_s` after every optimizer step."""

    def __init__(self, step_sleep_s: float = 0.1, **kw):
        super().__init__(**kw)
        self.step_sleep_s = step_sleep_s

    def after_step(self, model, ctx):
        super().after_step(model, ctx)
        time.sleep(self.step_sleep_s)
