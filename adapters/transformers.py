"""Hugging Face Transformers glue: a ``Trainer`` that steps functional_bfo's optimizers.

.. code-block:: python

    trainer = BFOTrainer(model=model, args=TrainingArguments(..., learning_rate=0.05),
                         train_dataset=data)            # HybridBFO by default
    trainer = BFOTrainer(..., optimizers=(AdaptiveBFO(model.parameters(), module=model),
                                          None))        # or any of ours
    trainer.train()

The Trainer calls ``optimizer.step()`` without a closure once per
``gradient_accumulation_steps`` batches. ``BFOTrainer.training_step`` does what the
Trainer's does (the loss and its backward at the parameters as they stand: the logs, the
gradient clipping and norm, and a ``GradScaler``'s bookkeeping see them) and hands the
optimizer a closure that scores a candidate on every batch of that window (their mean
loss), so all candidates of a step see the same data.
"""

from __future__ import annotations

import logging
from typing import Any, cast

try:
    import transformers
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("functional_bfo.adapters.transformers needs Transformers: pip install "
                      "'functional-bfo[transformers]'.") from e

import torch
import torch.distributed as dist

import functional_bfo as fb

from .optimizers import HybridBFO, SwarmOptimizer

__all__ = ["BFOTrainer"]

logger = logging.getLogger("functional_bfo.adapters")


class BFOTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose optimizer is HybridBFO, or any functional_bfo one.

    The rest is the Trainer's: the data loaders, ``gradient_accumulation_steps`` (a step's
    candidates are all scored on the window's batches), the learning-rate scheduler (it
    drives ``lr``, the optimizer's largest step: ``learning_rate`` is that step, so set it
    to a step size such as 0.05, not an Adam rate), ``bf16``, logging, checkpoints and
    ``resume_from_checkpoint`` (the optimizer's ``state_dict``).

    The default optimizer is ``HybridBFO(model.parameters(), lr=args.learning_rate,
    seed=args.seed, module=model)``: parameters that take gradients follow them, the others
    move by BFO. Launched on several processes (torchrun), it takes
    ``evaluator=fb.distributed.data_parallel(weight=per_device_train_batch_size)``, so the
    ranks, each with its own batches, rank the candidates alike and stay identical. Pass
    ``optimizers=(opt, None)`` for another.
    """

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's ``train``, each run starting from an empty window."""
        self._window: list[dict[str, Any]] = []
        if self.optimizer is not None:
            _swarm(self.optimizer).set_closure(None)  # a failed run's leftover
        return super().train(*args, **kwargs)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """HybridBFO over the model, unless ``optimizers=`` gave one of ours."""
        model = self.model if model is None else model
        if self.optimizer is None:
            if self.args.learning_rate < 1e-3:
                logger.warning("BFOTrainer: learning_rate=%g is the optimizer's largest step; "
                               "a value an Adam run would use makes BFO crawl. Set it to a "
                               "step size such as 0.05.", self.args.learning_rate)
            evaluator = None
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                evaluator = fb.distributed.data_parallel(
                    weight=self.args.per_device_train_batch_size)
            self.optimizer = HybridBFO(model.parameters(), lr=self.args.learning_rate,  # type: ignore[union-attr]
                                       seed=self.args.seed, module=model, evaluator=evaluator)
        _swarm(self.optimizer)
        return self.optimizer

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        """Queue this batch for the next step's candidates; the loss where the model stands."""
        opt = _swarm(self.optimizer)
        model.train()
        inputs = self._prepare_inputs(inputs)
        if not opt.closure_pending:  # the previous step used the last window up
            self._window = []
        self._window.append(dict(inputs))  # compute_loss may pop the labels from its dict

        window = self._window

        def closure() -> torch.Tensor:  # every candidate scored on the same window: its mean
            opt.zero_grad()
            total = torch.zeros(())
            for batch in window:
                with self.compute_loss_context_manager():
                    loss = cast(torch.Tensor, self.compute_loss(model, dict(batch))) / len(window)
                if opt.uses_grads:  # HybridBFO reads the accumulated gradient
                    self.accelerator.backward(loss)
                total = total.to(loss.device) + loss.detach().float()
            return total

        opt.set_closure(closure)
        with self.compute_loss_context_manager():
            loss = cast(torch.Tensor, self.compute_loss(model, dict(inputs)))
        steps = getattr(self, "current_gradient_accumulation_steps",
                        self.args.gradient_accumulation_steps)
        if loss.requires_grad:  # as the Trainer's own step (clipping, norms, a GradScaler):
            self.accelerator.backward(loss / steps)  # the window's mean loss's gradient
        return loss.detach() / steps


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
