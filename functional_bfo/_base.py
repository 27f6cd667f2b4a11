"""The optimizer contract: a NamedTuple of two pure functions, as optax's GradientTransformation."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from torch import Tensor

PyTree = Any
"""Any optree pytree: nested dicts, lists, tuples and NamedTuples with tensor leaves."""
Params = PyTree
"""The user's parameters: a pytree whose every leaf is a floating tensor."""
Key = Tensor
"""A random key: an int64 tensor of shape (2,), see ``functional_bfo.random``."""


class LossFn(Protocol):
    """``loss_fn(params, *args) -> Tensor``: one floating scalar for one set of parameters."""

    def __call__(self, params: Params, *args: Any) -> Tensor: ...


class InitFn(Protocol):
    """``init(params, *, key) -> state``: the state around ``params``, the first bacterium.

    It evaluates no loss. Pure: the same params and key give the same state.
    """

    def __call__(self, params: Params, *, key: Key) -> Any: ...


class UpdateFn(Protocol):
    """``update(state, loss_fn, *args) -> state``: one chemotactic step of the population.

    Pure: never mutates ``state``, reads no global state, makes no host sync; ``args`` are
    passed unchanged to every ``loss_fn`` call.
    """

    def __call__(self, state: Any, loss_fn: LossFn, *args: Any) -> Any: ...


class AskFn(Protocol):
    """``ask(state) -> Ask``: the next update's candidates, for the caller to evaluate.

    Pure and deterministic: asking twice gives the same candidates.
    """

    def __call__(self, state: Any) -> Any: ...


class TellFn(Protocol):
    """``tell(state, asked, losses) -> state``: the update, with the caller's losses.

    ``losses`` (a tensor, numpy array or list) holds one loss per row of ``asked.params``.
    ``check`` reads ``asked.tag`` on the host to refuse an ``Ask`` of another state or
    round; compiled or under ``vmap`` pass ``check=False``. ``hybrid_bfo``'s also takes
    ``grads=``, the gradient at each row.
    """

    def __call__(self, state: Any, asked: Any, losses: Any, *, check: bool = True) -> Any: ...


class Optimizer(NamedTuple):
    """Pure functions built by a factory such as :func:`functional_bfo.bfo`.

    ``update(state, loss_fn)`` is ``tell(state, ask(state), losses)`` with the losses of
    ``loss_fn``, evaluated a few swim points at a time. ``maximize`` says which way the
    losses in its states are better; drivers such as :func:`functional_bfo.run` read it, so
    it is set once, in the factory. ``twin`` is the same optimizer without the cycle events
    that fire every ``period`` updates, for a driver that knows the step on the host.
    """

    init: InitFn
    update: UpdateFn
    maximize: bool = False
    ask: AskFn | None = None
    tell: TellFn | None = None
    twin: Optimizer | None = None  # where no cycle ends: bitwise the same, fewer ops
    period: int = 0  # a cycle ends at every step > 0 that this divides
