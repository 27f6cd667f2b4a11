"""fastai glue: ``learn.fit`` and ``learn.fit_one_cycle`` with functional_bfo's optimizers.

.. code-block:: python

    learn = Learner(dls, model, loss_func=..., metrics=...,
                    opt_func=bfo_opt(HybridBFO, population_size=16), cbs=BFOCallback())
    learn.fit_one_cycle(3, lr_max=0.05)

fastai calls ``opt.step()`` without a closure after its own forward and backward;
:class:`BFOCallback` hands the optimizer a closure over the same batch first, so every
candidate of a step is scored on it. ``lr`` is the optimizer's largest step, so fastai's
learning-rate schedules drive it; their momentum schedule drives HybridBFO's ``momentum``
and is skipped for the classes that have none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

try:
    from fastai.callback.core import Callback
    from fastai.optimizer import OptimWrapper
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("functional_bfo.adapters.fastai needs fastai: see the README for "
                      "installing it without torchvision.") from e

import torch

from .optimizers import HybridBFO, SwarmOptimizer

__all__ = ["BFOCallback", "bfo_opt"]


class BFOOptimWrapper(OptimWrapper):
    """fastai's wrapper of a torch optimizer, for hyperparameters ours do not have.

    ``fit_one_cycle`` schedules a momentum (``mom``) that BFO and AdaptiveBFO do not have:
    its values are kept for fastai's records (``hypers``) and drive nothing. Any other
    hyperparameter ours lack (``wd``: weight decay means nothing to BFO) is refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.undriven: dict[str, list[Any]] = {}  # scheduled values with nothing to drive

    def _set_hyper(self, k: str, v: Any) -> None:
        if k in self.bwd_map:
            super()._set_hyper(k, v)
        elif k == "mom":
            self.undriven[k] = list(v)
        else:
            raise ValueError(f"fastai set {k}={list(v)}, which {type(self.opt).__name__} does "
                             f"not have (its settings: {sorted(self.bwd_map)}); leave it "
                             "unset (wd=None) for functional_bfo's optimizers.")

    def clear_state(self) -> None:
        """Keep the swarms, which fastai's freeze and unfreeze would restart from zero."""

    @property
    def hypers(self) -> list[dict[str, Any]]:
        """Each group's hyperparameters under fastai's names, the undriven ones too."""
        return [{**group, **{k: v[i] for k, v in self.undriven.items()}}
                for i, group in enumerate(super().hypers)]


def bfo_opt(cls: type[SwarmOptimizer] = HybridBFO, **kwargs: Any) -> Callable[..., Any]:
    """The ``opt_func`` fastai takes, for one of our optimizers (``cls`` with ``kwargs``).

    fastai passes the model's parameter groups and ``lr``, the optimizer's largest step.

    Examples:
        >>> from functional_bfo.adapters import BFO
        >>> from functional_bfo.adapters.fastai import bfo_opt
        >>> opt_func = bfo_opt(BFO, population_size=20)
    """
    if not (isinstance(cls, type) and issubclass(cls, SwarmOptimizer)):
        got = cls.__name__ if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise TypeError(f"bfo_opt takes BFO, AdaptiveBFO or HybridBFO; got {got}. Call it to "
                        "make the Learner's opt_func: opt_func=bfo_opt(HybridBFO, "
                        "population_size=...).")

    def opt_func(params: Any, lr: float = 0.1, **hypers: Any) -> BFOOptimWrapper:
        return BFOOptimWrapper(params, opt=functools.partial(cls, lr=lr, **kwargs))

    return opt_func


class BFOCallback(Callback):
    """Hands the optimizer a closure over the current batch before fastai's ``opt.step()``.

    The closure runs the model and ``loss_func`` on ``learn.xb`` / ``learn.yb`` (and
    ``backward`` for HybridBFO), so all candidates of a step see that batch.
    """

    def before_fit(self) -> None:
        """Refuse fastai's GradientAccumulation: its step's closure sees the last batch only."""
        from fastai.callback.training import GradientAccumulation

        if any(isinstance(cb, GradientAccumulation) for cb in self.learn.cbs):
            raise ValueError(
                "fastai's GradientAccumulation steps the optimizer once a window, with the "
                "closure of its last batch only: the candidates would be ranked on one batch "
                "of the window, the others dropped. Use a larger batch, or a closure over the "
                "whole window (docs/integrations.md, \"Gradient accumulation\").")

    def after_loss(self) -> None:
        """Set the closure for this batch's step (training batches only)."""
        if not self.training:
            return
        learn, opt = self.learn, _swarm(self.learn.opt)
        xb, yb = learn.xb, learn.yb

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = learn.loss_func(learn.model(*xb), *yb)
            if opt.uses_grads:
                loss.backward()
            return loss.detach()

        opt.set_closure(closure)


def _swarm(optimizer: Any) -> SwarmOptimizer:
    inner = getattr(optimizer, "opt", optimizer)
    if not isinstance(inner, SwarmOptimizer):
        raise TypeError(f"BFOCallback steps functional_bfo's optimizers; the Learner's is "
                        f"{type(inner).__name__}. Pass opt_func=bfo_opt(...).")
    return inner
