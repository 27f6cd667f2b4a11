"""Hugging Face Transformers glue: a ``Trainer`` that steps functional_bfo's optimizers.

.. code-block:: python

    trainer = BFOTrainer(model=model, args=TrainingArguments(..., learning_rate=0.05),
                         train_dataset=data)            # HybridBFO by default
    trainer = BFOTrainer(..., optimizers=(AdaptiveBFO(model.parameters(), module=model),
                                          None))        # or any of ours
    trainer.train()

The Trainer calls ``optimizer.step()`` without a closure once per
``gradient_accumulation_steps`` batches. ``BFOTrainer.training_step`` hands the optimizer a
closure that scores a candidate on every batch of that window (their mean loss), so all
candidates of a step see the same data; it returns the loss of the parameters as they
stand, for the Trainer's logs.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    import transformers
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("functional_bfo.adapters.transformers needs Transformers: pip install "
                      "'functional-bfo[transformers]'.") from e

import torch

from ._base import SwarmOptimizer
from .optimizers import HybridBFO

__all__ = ["BFOTrainer"]

logger = logging.getLogger("functional_bfo.adapters")


class BFOTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose optimizer is HybridBFO, or any functional_bfo one.

    Everything else is the Trainer's: the data loaders, ``gradient_accumulation_steps``
    (a step's candidates are all scored on the window's batches), the learning-rate
    scheduler (it drives ``lr``, the optimizer's largest step: ``learning_rate`` is that
    step, so set it to a step size such as 0.05, not an Adam rate), ``bf16``, logging,
    checkpoints and ``resume_from_checkpoint`` (the optimizer's ``state_dict``).

    The default optimizer is ``HybridBFO(model.parameters(), lr=args.learning_rate,
    seed=args.seed, module=model)``: parameters that take gradients follow them, the others
    move by BFO. Pass ``optimizers=(opt, None)`` for another.
    """

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """HybridBFO over the model, unless ``optimizers=`` gave one of ours."""
        model = self.model if model is None else model
        if self.optimizer is None:
            if self.args.learning_rate < 1e-3:
                logger.warning("BFOTrainer: learning_rate=%g is the optimizer's largest step; "
                               "a value an Adam run would use makes BFO crawl. Set it to a "
                               "step size such as 0.05.", self.args.learning_rate)
            self.optimizer = HybridBFO(model.parameters(), lr=self.args.learning_rate,
                                       seed=self.args.seed, module=model)
        _swarm(self.optimizer)
        return self.optimizer

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        """Queue this batch for the next step's candidates; the loss where the model stands."""
        opt = _swarm(self.optimizer)
        model.train()
        inputs = self._prepare_inputs(inputs)
        if not opt.closure_pending:  # the previous step used the last window up
            self._window: list[dict[str, Any]] = []
        self._window.append(inputs)
        window = list(self._window)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            total = torch.zeros((), dtype=torch.float64)
            for batch in window:
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(model, batch)
                if opt.uses_grads:
                    self.accelerator.backward(loss)
                total = total + loss.detach().to(total)
            return total / len(window)

        opt.set_closure(closure)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach() / self.args.gradient_accumulation_steps


def _swarm(optimizer: Any) -> SwarmOptimizer:
    """The functional_bfo optimizer inside Accelerate's wrapper, or a clear error."""
    inner = optimizer
    while not isinstance(inner, SwarmOptimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if not isinstance(inner, SwarmOptimizer):
        raise TypeError(f"BFOTrainer steps functional_bfo's optimizers (BFO, AdaptiveBFO, "
                        f"HybridBFO); got {type(inner).__name__}. Use transformers.Trainer "
                        "for it.")
    return inner
