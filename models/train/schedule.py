"""Learning-rate schedules as a multiplier of the peak rate, a pure function of the step (so resume needs no state).

- ``cosine``: linear warmup to 1, then half a cosine down to ``min_lr_ratio`` at the last step.
- ``wsd`` (warmup-stable-decay): warmup, hold 1, then decay linearly to ``min_lr_ratio`` over the final
  ``decay_fraction`` of the steps; a run can be extended from any stable-phase checkpoint.
- ``constant``: warmup, then 1.
"""

from __future__ import annotations

import math

from deltamatch.models.train.config import ScheduleSection


def lr_multiplier(step: int, total: int, config: ScheduleSection) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based) of ``total``."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    floor = config.min_lr_ratio
    if config.kind == "constant":
        return 1.0
    if config.kind == "cosine":
        span = max(1, total - 1 - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_steps = round(config.decay_fraction * total)
    decay_start = total - decay_steps
    if step < decay_start or decay_steps == 0:
        return 1.0
    progress = (step - decay_start + 1) / decay_steps
    return 1.0 - (1.0 - floor) * progress
