"""Budgets and convergence rules, shared by :func:`functional_bfo.run` and the adapters."""

from __future__ import annotations

import dataclasses
import math

from ._checks import check_float, check_int


@dataclasses.dataclass
class Stopping:
    """The stopping rules of a run (as :func:`functional_bfo.run`'s arguments) and its progress.

    ``budget_name`` names the budget in ``reason`` and errors (the adapters' ``"max_fe"``).
    """

    maximize: bool = False
    budget: int | None = None
    max_steps: int | None = None
    target_loss: float | None = None
    patience: int | None = None
    min_delta: float = 0.0
    budget_name: str = "max_evals"
    best_cost: float = math.inf  # the best loss so far, as a cost (lower is better)
    stalled: int = 0  # updates since the best last improved by more than min_delta
    steps: int = 0  # updates recorded
    per_update: float | None = None  # the most the next update can cost, in evaluations
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.budget is not None:  # numpy and 0-d tensor numbers as Python's
            self.budget = check_int(self.budget_name, self.budget, 1)
        if self.max_steps is not None:
            self.max_steps = check_int("max_steps", self.max_steps, 0)
            if self.max_steps == 0:
                self.reason = "max_steps"
        if self.target_loss is not None:
            self.target_loss = check_float("target_loss", self.target_loss, -math.inf)
        if self.patience is not None:
            self.patience = check_int("patience", self.patience, 1)
        self.min_delta = check_float("min_delta", self.min_delta, 0.0)

    def cost(self, loss: float) -> float:
        """``loss`` as a cost: lower is better, NaN is the worst."""
        return math.inf if math.isnan(loss) else (-loss if self.maximize else loss)

    def record(self, evals: int, best_loss: float, per_update: float) -> str | None:
        """The reason to stop after an update (or None)."""
        cost = self.cost(best_loss)
        self.steps += 1
        self.per_update = per_update
        self.stalled = 0 if self.best_cost - cost > self.min_delta else self.stalled + 1
        self.best_cost = min(self.best_cost, cost)
        return self.check(evals, cost)

    def check(self, evals: int, cost: float | None = None) -> str | None:
        """The reason to stop now (or None): after an update, or when a run resumes."""
        cost, self.reason = self.best_cost if cost is None else cost, None
        if self.target_loss is not None and cost <= self.cost(self.target_loss):
            self.reason = "target_loss"
        elif self.patience is not None and self.stalled >= self.patience:
            self.reason = "patience"
        elif self.max_steps is not None and self.steps >= self.max_steps:
            self.reason = "max_steps"
        elif self.budget is not None and evals + (self.per_update or 0) > self.budget:
            self.reason = self.budget_name
        return self.reason
