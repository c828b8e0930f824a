"""pretrain.engine: what DeepSpeed's own failures become."""
import pytest
import torch

from common.errors import ConfigError
from pretrain import engine


def _fails_like_deepspeed_jit(**_):
    # What DeepSpeed 0.19.8's FusedAdamBuilder raises while parsing TORCH_CUDA_ARCH_LIST=9.0a.
    raise ValueError("invalid literal for int() with base 10: '0a'")


def test_a_suffixed_arch_list_is_named_with_its_fix(monkeypatch):
    import deepspeed
    monkeypatch.setattr(deepspeed, "initialize", _fails_like_deepspeed_jit)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    with pytest.raises(ConfigError, match=r"TORCH_CUDA_ARCH_LIST='8.0;9.0a'.*'9.0a'.*TORCH_CUDA_ARCH_LIST=9.0"):
        engine.initialize(torch.nn.Linear(2, 2), {})


@pytest.mark.parametrize("archs", [None, "8.0;9.0+PTX"])
def test_other_value_errors_pass_through(monkeypatch, archs):
    import deepspeed
    monkeypatch.setattr(deepspeed, "initialize", _fails_like_deepspeed_jit)
    if archs is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", archs)
    with pytest.raises(ValueError, match="invalid literal") as raised:
        engine.initialize(torch.nn.Linear(2, 2), {})
    assert not isinstance(raised.value, ConfigError)
