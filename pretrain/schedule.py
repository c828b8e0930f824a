"""Learning-rate schedules as pure functions of the step (BERT: linear warm-up, then linear or polynomial decay)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleConfig:
    total_steps: int
    warmup_steps: int = 0            # or warmup_proportion of total_steps when that is set
    warmup_proportion: float | None = None
    decay: str = "linear"            # "linear" (BERT, AdamW) or "poly" (NVIDIA's LAMB recipe, power 0.5)
    power: float = 1.0
    min_lr_ratio: float = 0.0        # the floor, as a fraction of the peak

    def __post_init__(self):
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.decay not in ("linear", "poly"):
            raise ValueError(f"decay must be 'linear' or 'poly', got {self.decay!r}")
        if self.warmup_proportion is not None and not 0 <= self.warmup_proportion < 1:
            raise ValueError(f"warmup_proportion must be in [0, 1), got {self.warmup_proportion}")
        if self.resolved_warmup() > self.total_steps:
            raise ValueError("warm-up is longer than the run")

    def resolved_warmup(self) -> int:
        if self.warmup_proportion is not None:
            return int(self.warmup_proportion * self.total_steps)
        return self.warmup_steps


def lr_at(step: int, peak_lr: float, cfg: ScheduleConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    warmup = cfg.resolved_warmup()
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    remaining = max(0.0, 1.0 - (step - warmup) / max(1, cfg.total_steps - warmup))
    power = 1.0 if cfg.decay == "linear" else cfg.power
    floor = peak_lr * cfg.min_lr_ratio
    return floor + (peak_lr - floor) * remaining ** power
