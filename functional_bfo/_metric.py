"""A tumble metric a swarm learns from its own successful tumbles.

Isotropic tumbles crawl along a narrow valley: on a rotated ellipsoid of condition 1e6 most
directions lead uphill, and the 1/5th rule shrinks every step to the valley's width. The
tumbles that do succeed point along the valley, so their spread estimates the metric to
tumble in (as the rank-mu update of CMA-ES estimates it from its best samples). The swarm
draws ``phi = A u`` (``u`` uniform on the sphere, ``A A^T = cov``) and, after each update,
moves ``cov`` toward the outer products of its successful tumbles, each normalized to the
Mahalanobis length it was drawn at, so that without selection ``cov`` does not drift.
A lone bacterium (a swarm of one) moves ``cov`` toward its evolution path instead, its
successful tumbles summed with decay, as the (1+1)-CMA-ES does (Igel, Suttorp & Hansen,
GECCO 2006): successive steps along a valley add up, so the valley's axis is learned in
about ``n`` successes rather than ``n^2`` (docs/variants.md has the numbers). In a
swarm the bacteria stand in different places and their steps do not add up.
Everything is in float64 and in units of ``width`` (box widths with relative steps), and
tensor-only (no host sync), so that an update learning a metric compiles and vmaps.
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
    """Each of ``size`` coordinates' box width (1 where the box is open), float64, shape (n,).

    ``box`` is a row's (float64), None where there is none.
    """
    return box_relative(torch.ones(size, dtype=torch.float64, device=device), box)


def shape_directions(metric: TumbleMetric, direction: Tensor) -> Tensor:
    """Unit tumbles ``u * width`` (rows ``(P, n)``) reshaped to ``(A u) * width``."""
    shaped = ((direction.to(torch.float64) / metric.width) @ metric.factor.T) * metric.width
    return shaped.to(direction.dtype)


def condition(metric: TumbleMetric) -> float:
    """The metric's condition number: 1 isotropic, large along a narrow valley.

    A smallest eigenvalue rounded to 0 or below reads as an infinite condition, not a
    negative one.
    """
    low, high = torch.linalg.eigvalsh(metric.cov)[[0, -1]]
    return float(high / low) if low > 0 else float("inf")


def learn(metric: TumbleMetric, moves: Tensor, success: Tensor, rate: float,
          known: Tensor) -> TumbleMetric:
    """``metric`` moved toward the successful tumbles: the rows of ``moves`` where ``success``.

    ``moves`` is (m, n); ``success`` and ``known`` (m,) bool, ``known`` where the bacterium
    stood where it stood before (a dispersed lone bacterium starts a new path). Each move is
    rescaled to Mahalanobis length ``sqrt(n)``, the expected length of a standard normal
    draw, so an unselected tumble leaves ``cov`` unchanged on average; a lone bacterium's
    path keeps that length, with the (1+1)-CMA-ES's cumulation ``2 / (n + 2)``. The
    learning rate ``rate * successes / (n^2 + 12)`` (at most 1/2) follows CMA-ES's
    ``1 / n^2`` scaling, because ``cov`` has ``n^2 / 2`` entries to estimate. No success,
    or a ``cov`` that rounding left indefinite, keeps ``cov``.
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
