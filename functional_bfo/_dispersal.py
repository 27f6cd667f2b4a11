"""Elimination–dispersal: each bacterium is moved to a random place with probability P_ed.

Inside a finite box the new place is uniform in the box (Passino 2002); on coordinates with
no finite box it is the anchor (the initial params, or the best params so far) plus
``init_scale`` times a standard normal. The same sampler builds the initial population.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from . import random
from ._base import Params
from ._bounds import LeafBounds, flat_box, open_box, project, sample_domain
from ._checks import check_params
from ._layout import layout, ravel, unravel
from ._tree import where


class Start(NamedTuple):
    """What every variant's ``init`` starts from."""

    first: Params  # the params, detached, copied and clipped into the box: bacterium 0
    population: Tensor  # (P, D): bacterium 0, then P - 1 samples of the search domain
    key: Tensor  # the run key (the init key's second half; the first made the population)
    dtype: torch.dtype  # the loss and step dtype: float64 if any leaf is, else float32
    box: LeafBounds  # the rows' box in that dtype (every side open without bounds)

    def state_fields(self, sign: float, hyperparams: dict, hyperparams_type: type) -> dict:
        """The fields every variant's state starts with, nothing evaluated yet.

        Raises:
            ValueError: a hyperparameter does not fit the state's dtype (it would be inf).
        """
        size, device = self.population_size, self.key.device
        largest = torch.finfo(self.dtype).max
        for name, value in hyperparams.items():
            if abs(value) > largest:
                raise ValueError(f"Invalid {name}: {value!r} overflows {self.dtype} (largest "
                                 f"{largest:.3g}), the dtype of the state for these params; "
                                 "pass a smaller value, or float64 params.")
        tensor = lambda v: torch.tensor(v, dtype=self.dtype, device=device)  # noqa: E731
        count = torch.zeros((), dtype=torch.int64, device=device)
        return dict(
            population=self.population,
            losses=torch.full((size,), torch.nan, dtype=self.dtype, device=device),
            health=torch.zeros(size, dtype=self.dtype, device=device),
            best_params=self.first,
            best_loss=tensor(sign * torch.inf),
            key=self.key,
            step=count,
            num_evals=count.clone(),
            box=self.box,
            hyperparams=hyperparams_type(**{k: tensor(v) for k, v in hyperparams.items()}),
        )

    @property
    def population_size(self) -> int:
        return self.population.shape[0]


def per_run(state: Any) -> Any:
    """``state`` with each field made from its key and params: the same values, batched.

    Under ``vmap(init)`` a field made of constants alone (a counter, a hyperparameter, the
    params when only keys are mapped) comes out expanded over the runs, with stride 0, and
    ``compile(vmap(update))`` compiled once for those strides and again for the next
    state's. Adding a zero drawn from the key and the population (a ``|`` for bools)
    batches it whatever is mapped; eagerly it costs a few ops, in ``init`` only.
    """
    zero = state.key[..., 0] * 0 + (state.population.sum((-2, -1)) * 0).to(torch.int64)

    def batched(x: Tensor) -> Tensor:
        return x | zero.bool() if x.dtype == torch.bool else x + zero.to(x.dtype)

    kept = ("population", "key", "best_params")  # the population: from params and key
    shape = layout(state.best_params)  # views of one row, as every update leaves them
    return state._replace(best_params=unravel(shape, batched(ravel(shape, state.best_params))),
                          **{name: optree.tree_map(batched, getattr(state, name))
                             for name in state._fields if name not in kept})


def initial_population(params: Params, key: Tensor, size: int, bounds: Any, init_scale: float
                       ) -> Start:
    """Validate ``params`` and ``key`` and build the initial population around the params.

    The population is one ``(P, D)`` matrix (see ``_layout``), bacterium 0 the params.
    """
    leaves, _ = check_params(params)
    random.check_key(key)
    try:
        return _initial_rows(params, key, size, bounds, init_scale)
    except RuntimeError as e:  # the allocator's own words, with the size that asked for it
        message = str(e)
        if "out of memory" in message or "allocate" in message:
            per = sum(x.numel() * x.element_size() for x in leaves)
            e.add_note(f"functional_bfo: population_size={size} bacteria of {per:,} bytes "
                       f"each need {size * per / 2**30:.3g} GiB for the population alone (and "
                       "as much again per swim point evaluated); lower population_size.")
        raise


def _initial_rows(params, key, size, bounds, init_scale) -> Start:
    """``initial_population`` after validation."""
    shape = layout(params)
    device, dtype = optree.tree_leaves(params)[0].device, shape.dtype  # one, checked
    init_key, run_key = random.split(key.to(device))
    box = flat_box(bounds, shape, device)
    first = project(ravel(shape, params).detach(), box, "clip").clone()
    keys = random.fold_in(init_key, torch.arange(1, size, device=device))
    z = torch.func.vmap(lambda k: random.normal(k, (shape.size,), dtype))(keys)
    scale = torch.tensor(init_scale, dtype=dtype, device=device)
    rest = sample_domain(first, z, box, scale)
    return Start(unravel(shape, first), torch.cat([first.unsqueeze(0), rest]), run_key, dtype,
                 open_box(device, dtype) if box is None else box._replace(open=~box.finite))


def disperse(flag: Tensor, population: Tensor, known: Tensor, coins: Tensor, places: Tensor,
             elimination_prob: Tensor, init_scale: Tensor, anchor: Tensor,
             box: LeafBounds | None) -> tuple[Tensor, Tensor]:
    """Elimination–dispersal: the new ``(population, known)``.

    Where ``flag`` (0-d bool) holds, each bacterium whose coin falls below
    ``elimination_prob`` moves to its place (``sample_domain`` of the normals ``places``
    around ``anchor``, the best row) and no longer knows its loss.
    """
    dispersed = dispersal_mask(coins, elimination_prob, flag)
    fresh = sample_domain(anchor, places, box, init_scale)
    return where(dispersed, fresh, population), known & ~dispersed


def dispersal_mask(coins: Tensor, elimination_prob: Tensor, disperse: Tensor) -> Tensor:
    """Which bacteria are dispersed this step, shape (P,).

    Each whose uniform ``coin`` falls below ``elimination_prob``, and only when ``disperse``
    (a 0-d bool from the step counter) holds.
    """
    return disperse & (coins < elimination_prob)
