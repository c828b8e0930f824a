import pytest

from pretrain.schedule import ScheduleConfig, lr_at


def test_linear_warmup_then_linear_decay():
    cfg = ScheduleConfig(total_steps=100, warmup_steps=10)
    lrs = [lr_at(s, 1e-3, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # never rises after warm-up
    assert lr_at(55, 1e-3, cfg) == pytest.approx(1e-3 * 0.5)
    assert lr_at(100, 1e-3, cfg) == 0.0


def test_polynomial_decay_with_warmup_proportion_and_floor():
    cfg = ScheduleConfig(total_steps=1000, warmup_proportion=0.2843, decay="poly", power=0.5, min_lr_ratio=0.1)
    assert cfg.resolved_warmup() == 284
    half = 284 + (1000 - 284) // 2
    assert lr_at(half, 6e-3, cfg) == pytest.approx(6e-4 + (6e-3 - 6e-4) * 0.5 ** 0.5)
    assert lr_at(1000, 6e-3, cfg) == pytest.approx(6e-4)


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="decay"):
        ScheduleConfig(total_steps=10, decay="cosine")
    with pytest.raises(ValueError, match="longer than the run"):
        ScheduleConfig(total_steps=10, warmup_steps=20)
