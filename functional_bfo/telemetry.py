"""Telemetry as tensors: ``metrics(state)`` stays on the device, ``materialize`` syncs once."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._tree import diversity

__all__ = ["materialize", "metrics"]


def disagreeing_ranks(state: Any) -> Tensor | None:
    """A state's mask of ranks found disagreeing (a search's: its swarms'); None: no state."""
    if hasattr(state, "disagreeing_ranks"):
        return state.disagreeing_ranks
    if hasattr(state, "swarm") and hasattr(state, "explorer"):
        return state.swarm.disagreeing_ranks | state.explorer.disagreeing_ranks
    return None


def metrics(state: Any) -> dict[str, Tensor]:
    """Summary statistics of an optimizer state, as 0-d tensors on the state's device.

    Keys: ``best_loss``, ``mean_loss``, ``median_loss``, ``worst_loss`` (over finite losses of the
    current population; NaN if none is finite), ``nonfinite_losses`` (count), ``diversity``
    (root-mean-square distance of the bacteria to their centroid), ``step``, ``num_evals``,
    ``step_length_mean``, ``step_length_min`` and ``step_length_max`` (the step sizes in use: per
    bacterium in the adaptive variants, named apart from the ``step_size*`` hyperparameters),
    ``active_size`` for the adaptive variants, and for hybrid_bfo ``grad_norm_mean``,
    ``grad_nonfinite``, ``grad_vanishing`` and ``grad_exploding``. ``disagreeing_ranks`` is
    0 unless a :mod:`functional_bfo.distributed` evaluation saw ranks score other
    candidates than rank 0 (a mask: :func:`functional_bfo.distributed.disagreeing` names them).

    A :func:`~functional_bfo.black_box_search` state reports its converging (or polishing)
    swarm's, with the search's ``best_loss``, ``step`` and ``num_evals``, and ``stage`` (an
    index into its phases), ``restarts``, ``failed_swarms``, ``explorer_updates`` and
    ``walker_sigma``.
    """
    if not hasattr(state, "losses") and hasattr(state, "swarm"):  # a black_box_search state
        return {**metrics(state.swarm), "disagreeing_ranks": disagreeing_ranks(state),
                "best_loss": state.best_loss, "step": state.step,
                "num_evals": state.num_evals, "stage": state.stage, "restarts": state.restarts,
                "failed_swarms": state.failed, "explorer_updates": state.explorer_updates,
                "walker_sigma": state.walker.sigma}
    if not hasattr(state, "losses"):
        raise TypeError(f"metrics takes the state of an optimizer (init/update), got "
                        f"{type(state).__name__}.")
    losses = state.losses
    finite = torch.isfinite(losses)
    count = finite.sum()
    nan_if_none = torch.where(count > 0, 0.0, torch.nan)  # NaN where no loss is finite
    high = torch.where(finite, losses, -torch.inf).max()
    low = torch.where(finite, losses, torch.inf).min()  # a best above it: a maximizing run's
    worst = torch.where(state.best_loss > low, low, high)
    out = {"best_loss": state.best_loss,
           "mean_loss": torch.where(finite, losses, 0).sum() / count.clamp_min(1) + nan_if_none,
           "median_loss": torch.where(finite, losses, torch.nan).nanmedian(),
           "worst_loss": worst + nan_if_none,
           "nonfinite_losses": (~finite).sum(),
           "diversity": diversity(state.population, losses.dtype), "step": state.step,
           "num_evals": state.num_evals, "disagreeing_ranks": state.disagreeing_ranks}
    if hasattr(state, "grad_norms"):  # gradient telemetry of hybrid_bfo
        known = torch.isfinite(state.grad_norms)
        out.update(grad_norm_mean=torch.where(known, state.grad_norms, 0).sum()
                   / known.sum().clamp_min(1),
                   grad_nonfinite=state.grad_nonfinite, grad_vanishing=state.grad_vanishing,
                   grad_exploding=state.grad_exploding)
    if hasattr(state, "active_size"):
        out["active_size"] = state.active_size
    steps = state.step_sizes if hasattr(state, "step_sizes") else state.hyperparams.step_size
    out.update(step_length_mean=steps.mean(), step_length_min=steps.min(),
               step_length_max=steps.max())
    return out


def materialize(values: dict[str, Tensor]) -> dict[str, float | int]:
    """The metrics as Python numbers, with exactly one device-to-host transfer.

    Counts (integer tensors such as ``step`` and ``num_evals``) come back as ints, the rest
    as floats.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> opt = fb.bfo(population_size=4)
        >>> state = opt.update(opt.init({"x": torch.ones(2)}, key=fb.random.key(0)),
        ...                    lambda p: p["x"].square().sum())
        >>> fb.materialize(fb.metrics(state))["num_evals"]
        20
    """
    if not values:
        return {}
    tensors = [torch.as_tensor(x) for x in values.values()]
    device = next((x.device for x in tensors if x.device.type != "cpu"), tensors[0].device)
    stacked = torch.stack([x.to(device, torch.float64).reshape(()) for x in tensors])  # to 2**53
    return {n: v if x.is_floating_point() else int(v)
            for n, x, v in zip(values, tensors, stacked.tolist())}
