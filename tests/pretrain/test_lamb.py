"""LAMB (``pretrain.lamb``): each update is scaled to its layer's weight norm."""
import pytest
import torch

from pretrain.lamb import Lamb


def test_lamb_scales_each_update_to_its_layer_weight_norm():
    torch.manual_seed(0)
    big, small = torch.nn.Parameter(torch.randn(64, 64) * 10), torch.nn.Parameter(torch.randn(64) * 0.01)
    before = [big.detach().clone(), small.detach().clone()]
    optimizer = Lamb([big, small], lr=0.01, weight_decay=0.0)
    big.grad, small.grad = torch.randn(64, 64), torch.randn(64)
    optimizer.step()
    for param, old in zip((big, small), before):
        # First step: Adam's update is sign(grad) (norm sqrt(n)), rescaled to ||w||: the step is lr * ||w||.
        assert float((param.detach() - old).norm()) == pytest.approx(0.01 * float(old.norm()), rel=1e-3)
