"""Integrated Gradients for ``/explanations`` without captum (which Lantern does not require)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


def integrated_gradients(
    forward: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    target: int | Sequence[int] = 0,
    n_steps: int = 50,
    baseline: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attributions of ``forward(inputs)[:, target]`` to each input element.

    Same method as captum's ``IntegratedGradients.attribute`` default (Gauss-Legendre points
    along the straight path from a zero baseline), one forward/backward per step.
    """
    inputs = inputs.detach()
    if baseline is None:
        baseline = torch.zeros_like(inputs)
    rows = torch.arange(inputs.shape[0], device=inputs.device)
    targets = torch.as_tensor(target, device=inputs.device).expand(inputs.shape[0])
    points, weights = np.polynomial.legendre.leggauss(n_steps)
    total = torch.zeros_like(inputs)
    delta = inputs - baseline
    with torch.inference_mode(False), torch.enable_grad():
        for point, weight in zip(points, weights, strict=True):
            alpha = float(point + 1) / 2  # map [-1, 1] onto the path [0, 1]
            scaled = (baseline + alpha * delta).clone().requires_grad_(True)
            selected = forward(scaled)[rows, targets].sum()
            (grad,) = torch.autograd.grad(selected, scaled)
            total += float(weight) / 2 * grad
    return total * delta
