"""Shifted (and, where defined, rotated) benchmark functions with their search boxes.

Each ``make(name, dim, seed)`` returns ``(loss_fn, bounds)`` where ``loss_fn(params)`` takes
``{"x": tensor(dim)}`` and has its global minimum 0 at a random shift inside the box.
"""

from __future__ import annotations

import math

import torch

BOXES = {"sphere": 5.0, "ellipsoid": 5.0, "rosenbrock": 2.0, "rastrigin": 5.12,
         "ackley": 32.0, "griewank": 600.0}


def _rotation(dim: int, generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def shift_of(name: str, dim: int, generator: torch.Generator) -> torch.Tensor:
    """Where the optimum of ``name`` sits: uniform in the middle 80% of half the box."""
    return (torch.rand(dim, generator=generator, dtype=torch.float64) * 1.6 - 0.8) * (
        BOXES[name] * 0.5)


def make(name: str, dim: int, seed: int, rotate: bool = False):
    """The shifted problem ``name`` in ``dim`` dimensions (shift and rotation from ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    box = BOXES[name]
    shift = shift_of(name, dim, generator)
    rot = _rotation(dim, generator) if rotate else torch.eye(dim, dtype=torch.float64)
    weights = 10 ** (6 * torch.arange(dim, dtype=torch.float64) / max(dim - 1, 1))

    def z_of(params):
        x = params["x"]
        return (x - shift.to(x.dtype)) @ rot.to(x.dtype).T

    def loss(params):
        z = z_of(params)
        if name == "sphere":
            return z.square().sum()
        if name == "ellipsoid":
            return (weights.to(z.dtype) * z.square()).sum()
        if name == "rosenbrock":
            y = z + 1.0
            return (100 * (y[1:] - y[:-1].square()).square() + (1 - y[:-1]).square()).sum()
        if name == "rastrigin":
            return 10 * dim + (z.square() - 10 * torch.cos(2 * math.pi * z)).sum()
        if name == "ackley":
            return (-20 * torch.exp(-0.2 * z.square().mean().sqrt())
                    - torch.exp(torch.cos(2 * math.pi * z).mean()) + 20 + math.e)
        if name == "griewank":
            i = torch.arange(1, dim + 1, dtype=z.dtype)
            return 1 + z.square().sum() / 4000 - torch.cos(z / i.sqrt()).prod()
        raise ValueError(f"unknown problem {name!r}")

    return loss, (-box, box)
