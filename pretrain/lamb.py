"""LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") in plain PyTorch.

Adam moments with bias correction, decoupled weight decay, and a per-tensor trust ratio
||w|| / ||update|| that scales the step of every layer to its weight norm. Written with foreach ops so
it runs on CPU and GPU alike; DeepSpeed wraps it as a client optimizer (per-tensor fp16 master copies
at ZeRO stage 0, which LAMB needs: flat ZeRO partitions would mix layers in one trust ratio).
"""
from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, max_trust_ratio: float = 10.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      max_trust_ratio=max_trust_ratio))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
            step = self.state[params[0]]["step"]
            grads = [p.grad for p in params]
            exp_avg = [self.state[p]["exp_avg"] for p in params]
            exp_avg_sq = [self.state[p]["exp_avg_sq"] for p in params]
            torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
            # update = m_hat / (sqrt(v_hat) + eps) + wd * w
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, (1 - beta2 ** step) ** 0.5)
            torch._foreach_add_(denom, group["eps"])
            updates = torch._foreach_div(exp_avg, denom)
            torch._foreach_div_(updates, 1 - beta1 ** step)
            if group["weight_decay"]:
                torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            weight_norms = torch._foreach_norm(params)
            update_norms = torch._foreach_norm(updates)
            for p, update, w_norm, u_norm in zip(params, updates, weight_norms, update_norms):
                # A zero weight or update norm (fresh biases, LayerNorm) falls back to a ratio of 1.
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                trust = trust.clamp(max=group["max_trust_ratio"])
                p.add_(update * trust, alpha=-group["lr"])
        return loss
