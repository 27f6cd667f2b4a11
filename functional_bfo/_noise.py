"""The random numbers of one update: one Threefry draw per bacterium, cut into uses."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import random
from ._base import Key


class Noise(NamedTuple):
    """The random numbers of one update, per bacterium."""

    direction: Tensor  # (P, n) standard normals, for the tumble
    place: Tensor  # (P, n) standard normals, for dispersal
    levy_u: Tensor  # (P,) normals for Mantegna's step length
    levy_v: Tensor  # (P,)
    coin: Tensor  # (P,) uniforms for the dispersal decision


def bacterium_noise(key: Key, step: Tensor, size: int, n: int, dtype) -> Noise:
    """Every random number of one update, from one Threefry call for the whole population.

    Bacterium ``i`` at step ``s`` draws row ``i`` of ``normal_rows(key, s, size, 2n + 3)``
    (``n`` the number of parameters): ``z[:n]`` is its tumble, ``z[n:2n]`` its dispersal
    place, ``z[2n], z[2n+1]`` its Lévy normals and ``ndtr(z[2n+2])`` its dispersal coin.
    A row depends only on ``(key, s, i)``: nothing depends on how the population is chunked
    or sharded.
    """
    z = random.normal_rows(key, step, size, 2 * n + 3, dtype)
    return Noise(
        direction=z[:, :n],
        place=z[:, n : 2 * n],
        levy_u=z[:, 2 * n],
        levy_v=z[:, 2 * n + 1],
        coin=torch.special.ndtr(z[:, 2 * n + 2]),
    )
