"""Lightning glue: the best's loss in the logs, swarm telemetry, and a clear word on precision.

Lightning's ordinary code drives the optimizers: return one from ``configure_optimizers``,
and add :class:`BFOCallback` to the trainer for swarm telemetry and epoch means of the best.

.. code-block:: python

    class Model(L.LightningModule):
        def training_step(self, batch, batch_idx):
            loss = ...
            self.log("train_loss", loss)      # logged for the best params, not a candidate
            return loss

        def configure_optimizers(self):
            return HybridBFO(self.parameters())

    L.Trainer(callbacks=[BFOCallback()]).fit(Model(), loader)

Automatic optimization calls ``optimizer.step(closure)`` once per batch; the closure (the
``training_step`` and ``backward``) then runs once per candidate, and once more at the best
parameters, not a candidate, so a step's last ``self.log`` call is the best's. With
``on_epoch=True`` every call counts in the mean: the callback drops those made while
candidates are scored, so the logs hold only the best's.
"""

from __future__ import annotations

import functools
from typing import Any

try:
    import lightning as L
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("functional_bfo.adapters.lightning needs Lightning: pip install "
                      "'functional-bfo[lightning]'.") from e

from ._candidates import evaluating_candidates
from .optimizers import SwarmOptimizer

__all__ = ["BFOCallback"]

PRECISION_MSG = (
    "Lightning's precision={precision!r} steps the optimizer through a GradScaler, which "
    "calls optimizer.step() without a closure; {name} evaluates candidates through the "
    "closure, so it cannot step there. Use precision='bf16-mixed' (no scaler) or "
    "'32-true'. HybridBFO uses only the gradient's direction, so it needs no loss scaling."
)

ACCUMULATION_MSG = (
    "Lightning's accumulate_grad_batches={k} steps the optimizer once every {k} batches, "
    "with a closure over the last batch only: {name}'s candidates would be ranked on one "
    "batch of {k}, the others dropped. Use accumulate_grad_batches=1 with a larger batch, "
    "a closure over the whole window (docs/integrations.md, \"Gradient accumulation\"), or "
    "BFOTrainer's gradient_accumulation_steps."
)


class BFOCallback(L.Callback):
    """Logs what a swarm did each step, and keeps candidates out of ``self.log``.

    After every training batch it logs, per param group ``g`` of every functional_bfo
    optimizer, ``bfo/best_loss``, ``bfo/diversity`` and ``bfo/step_length_mean`` (suffixed
    ``_g{g}`` after the first group) and ``bfo/num_evals``, each suffixed ``_o{i}`` first
    when there are several such optimizers. While it is attached, ``LightningModule.log``
    and ``log_dict`` calls made while candidates are scored are dropped. It refuses a
    precision plugin that steps through a GradScaler, and gradient accumulation.

    Args:
        log_every_n_steps: log the telemetry every this many steps (default: the
            trainer's ``log_every_n_steps``).
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        if log_every_n_steps is not None and (
                not isinstance(log_every_n_steps, int) or log_every_n_steps < 1):
            raise ValueError(f"Invalid log_every_n_steps: {log_every_n_steps!r}; expected a "
                             "positive int or None.")
        self.log_every_n_steps = log_every_n_steps

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Route the module's ``log`` and ``log_dict`` past candidate evaluations."""
        for name in ("log", "log_dict"):
            setattr(pl_module, name, _skipping_candidates(getattr(type(pl_module), name),
                                                         pl_module))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Give the module its own ``log`` and ``log_dict`` back."""
        for name in ("log", "log_dict"):
            pl_module.__dict__.pop(name, None)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a GradScaler precision or gradient accumulation: no closure, or a partial one."""
        optimizers = _swarm_optimizers(trainer)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if optimizers and scaler is not None:
            raise ValueError(PRECISION_MSG.format(precision=trainer.precision,
                                                  name=type(optimizers[0]).__name__))
        if optimizers and trainer.accumulate_grad_batches > 1:
            raise ValueError(ACCUMULATION_MSG.format(k=trainer.accumulate_grad_batches,
                                                     name=type(optimizers[0]).__name__))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log each swarm's best loss, diversity, step length and evaluations."""
        every = self.log_every_n_steps or trainer.log_every_n_steps  # type: ignore[attr-defined]
        if trainer.global_step % every:
            return
        optimizers = _swarm_optimizers(trainer)
        for i, opt in enumerate(optimizers):
            which = f"_o{i}" if len(optimizers) > 1 else ""  # each optimizer its own columns
            for g in opt.stepped_groups:
                m = opt.metrics(g)
                suffix = which + (f"_g{g}" if g else "")
                pl_module.log_dict({f"bfo/best_loss{suffix}": m["best_loss"],
                                    f"bfo/diversity{suffix}": m["diversity"],
                                    f"bfo/step_length_mean{suffix}": m["step_length_mean"]},
                                   on_step=True, on_epoch=False)
            pl_module.log(f"bfo/num_evals{which}", float(opt.num_evals), on_step=True,
                          on_epoch=False)


def _swarm_optimizers(trainer: L.Trainer) -> list[SwarmOptimizer]:
    found = []
    for opt in trainer.optimizers:
        opt = getattr(opt, "optimizer", opt)  # LightningOptimizer wraps it
        if isinstance(opt, SwarmOptimizer):
            found.append(opt)
    return found


def _skipping_candidates(method: Any, module: L.LightningModule) -> Any:
    @functools.wraps(method)
    def log(*args: Any, **kwargs: Any) -> None:
        if not evaluating_candidates():
            method(module, *args, **kwargs)
    return log
