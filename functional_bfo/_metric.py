"""A tumble metric a swarm learns from its own successful tumbles (docs/variants.md).

Tumbles are ``phi = A u`` (``u`` uniform on the sphere, ``A A^T = cov``); after each update
``cov`` moves toward the successful tumbles (rank-mu, as CMA-ES), or for a lone bacterium
toward its evolution path (the (1+1)-CMA-ES). Float64, in units of ``width``, no host sync.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._bounds import LeafBounds, box_relative

MAX_METRIC_SIZE = 2000  # parameters: the metric costs n^2 memory and n^3 time per update


class TumbleMetric(NamedTuple):
    """A learned tumble metric over the ``n`` flattened parameters."""

    cov: Tensor  # (n, n) float64, trace n: the shape of the tumble distribution
    factor: Tensor  # (n, n) its lower Cholesky factor A
    width: Tensor  # (n,) float64: the unit of each coordinate (its box width, or 1)
    path: Tensor  # (n,) float64: a lone bacterium's evolution path (a swarm's stays 0)


def isotropic(width: Tensor) -> TumbleMetric:
    """The metric of plain BFO tumbles, the identity, in units of ``width``."""
    eye = torch.eye(len(width), dtype=torch.float64, device=width.device)
    return TumbleMetric(eye, eye.clone(), width, torch.zeros_like(width))  # no shared storage


def widths(box: LeafBounds | None, size: int, device: torch.device) -> Tensor:
    """Each coordinate's box width (1 where open), float64, shape (n,)."""
    return box_relative(torch.ones(size, dtype=torch.float64, device=device), box)


def shape_directions(metric: TumbleMetric, direction: Tensor) -> Tensor:
    """Unit tumbles ``u * width`` (rows ``(P, n)``) reshaped to ``(A u) * width``."""
    shaped = ((direction.to(torch.float64) / metric.width) @ metric.factor.T) * metric.width
    return shaped.to(direction.dtype)


def condition(metric: TumbleMetric) -> float:
    """The metric's condition number (inf where rounding left it indefinite)."""
    low, high = torch.linalg.eigvalsh(metric.cov)[[0, -1]]
    return float(high / low) if low > 0 else float("inf")


def learn(metric: TumbleMetric, moves: Tensor, success: Tensor, rate: float,
          known: Tensor) -> TumbleMetric:
    """``metric`` moved toward the rows of ``moves`` (m, n) where ``success``.

    Each move is rescaled to Mahalanobis length ``sqrt(n)`` (unselected tumbles leave ``cov``
    unchanged on average); the rate ``rate * successes / (n^2 + 12)`` follows CMA-ES's ``1/n^2``.
    ``known`` resets a lone bacterium's path. No success, or an indefinite ``cov``, keeps ``cov``.
    """
    n = moves.shape[1]
    count = success.sum().to(torch.float64)
    u = moves / metric.width
    whitened = torch.linalg.solve_triangular(metric.factor, u.T, upper=False).T
    v = u * (n**0.5 / whitened.norm(dim=1, keepdim=True).clamp_min(1e-300))
    v = torch.where(success[:, None], v, 0.0)
    path = metric.path
    if len(moves) == 1:  # a lone bacterium: its successes add up along a valley
        cc = 2 / (n + 2)
        path = torch.where(known[0], path, 0.0)
        path = torch.where(success[0], (1 - cc) * path + (cc * (2 - cc)) ** 0.5 * v[0], path)
        v = torch.where(success[:, None], path, 0.0)
    c = (rate * count / (n * n + 12)).clamp(max=0.5)
    cov = (1 - c) * metric.cov + c * (v.T @ v) / count.clamp_min(1)
    cov = 0.5 * (cov + cov.T)
    cov = cov * (n / torch.trace(cov))
    factor, info = torch.linalg.cholesky_ex(cov)
    keep = (count == 0) | (info != 0)
    return TumbleMetric(torch.where(keep, metric.cov, cov),
                        torch.where(keep, metric.factor, factor), metric.width, path)
