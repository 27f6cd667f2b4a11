"""Chemotaxis: tumble directions (Gaussian or Lévy–Mantegna) and the swim along them.

A tumble picks a unit direction uniformly on the sphere (a normalized Gaussian; Passino
draws each coordinate in [-1, 1], which favours the cube's diagonals). The swim walks the
ray ``theta + k * C * phi`` for ``k = 1 .. N_s + 1`` and stops at the first step that does
not improve on the previous one. Every point of the ray is evaluated in ``N_s + 1`` batched
calls, so no evaluation is repeated and the count per update is fixed; points past the stop
still count towards the best ever seen.
"""

from __future__ import annotations

import math

import optree
import torch
from torch import Tensor

from ._base import Params
from ._bounds import LeafBounds, project
from ._tree import sq_norms

TUMBLES = ("gaussian", "levy")
LEVY_MAX_LENGTH = 1e3  # Mantegna's ratio has no finite variance; cap it so f16 stays finite


def mantegna_sigma(beta: Tensor) -> Tensor:
    """Scale of Mantegna's numerator normal for stability index ``beta`` (Mantegna 1994)."""
    log_ratio = torch.lgamma(1 + beta) - torch.lgamma((1 + beta) / 2)
    rest = torch.sin(math.pi * beta / 2) / (beta * 2 ** ((beta - 1) / 2))
    return (torch.exp(log_ratio) * rest) ** (1 / beta)


def tumble_directions(z: Params, u: Tensor, v: Tensor, kind: str, levy_beta: Tensor):
    """Unit directions and step-length multipliers of the whole population.

    ``z`` is a population pytree of standard normals: normalizing each bacterium's draw over
    all leaves gives a direction uniform on the sphere. The multiplier is 1 for Gaussian
    tumbles, else Mantegna's ``sigma |u| / |v|^(1/beta)`` from the normals ``u``, ``v`` (P,).
    """
    inv_norm = torch.rsqrt(sq_norms(z, u.dtype))
    direction = optree.tree_map(lambda x: x * inv_norm.reshape(-1, *([1] * (x.dim() - 1))), z)
    if kind == "gaussian":
        return direction, torch.ones_like(u)
    beta = levy_beta.to(u.dtype)
    length = mantegna_sigma(beta) * u.abs() / v.abs() ** (1 / beta)
    return direction, length.clamp(max=LEVY_MAX_LENGTH)


def ray_point(
    population: Params,
    direction: Params,
    distance: Tensor,
    bounds: list[LeafBounds | None],
    mode: str,
) -> Params:
    """``project(theta + distance * phi)`` per bacterium; ``distance`` has shape (P,)."""
    leaves, spec = optree.tree_flatten(population)
    out = []
    for x, d, b in zip(leaves, spec.flatten_up_to(direction), bounds):
        step = distance.reshape((-1,) + (1,) * (x.dim() - 1)) * d
        out.append(project(x.to(d.dtype) + step, b, mode).to(x.dtype))
    return optree.tree_unflatten(spec, out)


def swim_stop(costs: Tensor, last: Tensor) -> Tensor:
    """Index along the ray where each bacterium ends.

    That is its first step no better than the one before, else the last. ``costs`` is
    (P, N_s + 1); ``last`` is the cost at the starting point (+inf when unknown), shape (P,).
    """
    previous = torch.cat([last.unsqueeze(1), costs[:, :-1]], dim=1)
    improving = (costs < previous)[:, :-1].to(torch.int64)
    return improving.cumprod(dim=1).sum(dim=1)

