"""A tumble metric a swarm learns from its own successful tumbles.

Isotropic tumbles crawl along a narrow valley: on a rotated ellipsoid of condition 1e6 most
directions lead uphill, and the 1/5th rule shrinks every step to the valley's width. The
tumbles that do succeed point along the valley, so their spread estimates the metric to
tumble in (as the rank-mu update of CMA-ES estimates it from its best samples). The swarm
draws ``phi = A u`` (``u`` uniform on the sphere, ``A A^T = cov``) and, after each update,
moves ``cov`` toward the outer products of its successful tumbles, each normalized to the
Mahalanobis length it was drawn at, so that without selection ``cov`` does not drift.
Everything is in units of box widths (the black-box setup's relative steps) and float64.
"""

from __future__ import annotations

from typing import NamedTuple

import optree
import torch
from torch import Tensor

from ._base import Params
from ._bounds import LeafBounds, box_relative
from ._tree import unflatten_like

MAX_METRIC_SIZE = 2000  # parameters: the metric costs n^2 memory and n^3 time per update


class TumbleMetric(NamedTuple):
    """A learned tumble metric over the ``n`` flattened parameters."""

    cov: Tensor  # (n, n) float64, trace n: the shape of the tumble distribution
    factor: Tensor  # (n, n) its lower Cholesky factor A


def isotropic(size: int, device: torch.device) -> TumbleMetric:
    """The metric of plain BFO tumbles: the identity."""
    eye = torch.eye(size, dtype=torch.float64, device=device)
    return TumbleMetric(eye, eye)


def widths(box: list[LeafBounds | None], params: Params) -> Tensor:
    """Each flattened coordinate's box width (1 where the box is open), float64, shape (n,)."""
    ones = optree.tree_map(
        lambda x: torch.ones((1, *x.shape), dtype=torch.float64, device=x.device), params)
    return flat_rows(box_relative(ones, box))[0]


def flat_rows(population: Params) -> Tensor:
    """A population pytree as one (P, n) float64 matrix, in optree's flatten order."""
    return torch.cat([x.reshape(x.shape[0], -1).to(torch.float64)
                      for x in optree.tree_leaves(population)], dim=1)


def shape_directions(metric: TumbleMetric, direction: Params, width: Tensor,
                     template: Params) -> Params:
    """Box-relative unit tumbles ``u * width`` (a population) reshaped to ``(A u) * width``."""
    shaped = ((flat_rows(direction) / width) @ metric.factor.T) * width
    return optree.tree_map(lambda s, d: s.to(d.dtype), unflatten_like(shaped, template),
                           direction)


def condition(metric: TumbleMetric) -> float:
    """The metric's condition number: 1 isotropic, large along a narrow valley.

    A smallest eigenvalue rounded to 0 or below reads as an infinite condition, not a
    negative one.
    """
    low, high = torch.linalg.eigvalsh(metric.cov)[[0, -1]]
    return float(high / low) if low > 0 else float("inf")


def learn(metric: TumbleMetric, moves: Tensor, width: Tensor, rate: float) -> TumbleMetric:
    """``metric`` moved toward the successful tumbles ``moves`` (rows of (m, n), m >= 0).

    Each move is rescaled to Mahalanobis length ``sqrt(n)``, the expected length of a
    standard normal draw, so an unselected tumble leaves ``cov`` unchanged on average; the
    learning rate ``rate * m / (n^2 + 12)`` (at most 1/2) follows CMA-ES's ``1 / n^2``
    scaling, because ``cov`` has ``n^2 / 2`` entries to estimate.
    """
    count, n = moves.shape
    if count == 0:
        return metric
    u = moves / width
    whitened = torch.linalg.solve_triangular(metric.factor, u.T, upper=False).T
    v = u * (n**0.5 / whitened.norm(dim=1, keepdim=True).clamp_min(1e-300))
    c = min(0.5, rate * count / (n * n + 12))
    cov = (1 - c) * metric.cov + c * (v.T @ v) / count
    cov = 0.5 * (cov + cov.T)
    cov = cov * (n / torch.trace(cov))
    factor, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0:  # lost definiteness to rounding: keep the last good metric
        return metric
    return TumbleMetric(cov, factor)
