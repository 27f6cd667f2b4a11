"""The driver: run ``update`` until a budget or a rule says stop, deciding on the host."""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from typing import Any

import optree
import torch

from ._ask_tell import at_step
from ._base import LossFn, Optimizer
from ._checks import check_bool, check_int
from ._progress import Progress, progress_info, reporter
from ._state import save
from ._stopping import Stopping
from .distributed import refuse_disagreement
from .telemetry import disagreeing_ranks, materialize, metrics


def run(
    opt: Optimizer,
    state: Any,
    loss_fn: LossFn,
    *args: Any,
    max_evals: int | None = None,
    max_steps: int | None = None,
    target_loss: float | None = None,
    patience: int | None = None,
    min_delta: float = 0.0,
    progress: Progress = False,
    log_every: int = 10,
    compile: bool = False,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 100,
) -> Any:
    """Apply ``opt.update`` to ``state`` until a stopping rule fires; return the last state.

    Whether a lower or a higher loss is better comes from the optimizer (``maximize=`` of
    its factory). In eager, an update that ends no cycle skips the masked cycle events: the
    states of a loop of ``opt.update``, faster. A :func:`functional_bfo.black_box_search`
    state runs until its own budget is spent (``state.phase == "done"``, reason
    ``"max_evals"``) or another rule fires; it takes no ``max_evals`` or ``compile`` here,
    and non-finite losses do not stop it (its restarts look elsewhere).

    Args:
        opt: the optimizer that made ``state``.
        state: its state, e.g. ``opt.init(params, key=...)``.
        loss_fn: ``loss_fn(params, *args) -> 0-d tensor``.
        *args: data passed to every ``loss_fn`` call.
        max_evals: stop before an update could take ``state.num_evals`` past this (a fresh
            state's first update runs unless the budget is spent, to learn what an update
            costs; a resumed state's next one is counted from ``opt.ask``; with a varying
            active population the next update is assumed to use every slot).
        max_steps: stop after this many updates.
        target_loss: stop once the best loss reaches it (``<=``, or ``>=`` when maximizing),
            before any update if it already has.
        patience: stop after this many updates without the best improving by ``min_delta``.
        min_delta: the improvement that resets ``patience``.
        progress: True shows a ``tqdm`` bar of the evaluations (or updates, without
            ``max_evals``) and the best loss, or without tqdm prints a line every
            ``log_every`` updates, and a summary at the end; a callable gets them as dicts.
        log_every: updates between progress reports.
        compile: run ``torch.compile(opt.update, fullgraph=True)``; a failure to compile is
            raised, never hidden by falling back to eager.
        checkpoint: a path to save the state to (:func:`functional_bfo.save`, atomically)
            every ``checkpoint_every`` updates, when the run stops, and when it is
            interrupted; resume with ``functional_bfo.load(path, like=...)``.
        checkpoint_every: updates between checkpoints.

    Returns:
        The state after the last update.

    Raises:
        ValueError: no budget (``max_evals`` or ``max_steps``) is given, or one is invalid; a
            batched state; a checkpoint path whose folder does not exist.
        TypeError: a checkpoint that is not a path (a file object cannot be rewritten
            atomically), or a ``state`` that is not an optimizer's.
        BaseException: whatever ``loss_fn`` (or Ctrl-C) raised, with its type kept; its
            attribute ``last_good_state`` is the state after the last finished update (the
            ``state`` given if none finished), and a note says so.

    Warns:
        RuntimeWarning: every loss evaluated is non-finite (NaN or infinite); the run stops
            (reason ``"non_finite"``) rather than search blind. The first update took the
            evaluations past ``max_evals``.
    """
    search = hasattr(state, "phase")  # a black-box search: its budget is its own
    if search and (max_evals is not None or compile):
        raise ValueError("run drives a black_box_search state to the search's own budget, "
                         "round by round in eager: set max_evals in fb.black_box_search and "
                         "leave run's max_evals and compile out.")
    if max_evals is None and max_steps is None and not search:
        raise ValueError("run needs a budget: pass max_evals=... or max_steps=... "
                         "(target_loss and patience alone may never fire).")
    check_bool("compile", compile)
    log_every = check_int("log_every", log_every, 1)
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
    if checkpoint is not None:
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"Invalid checkpoint: {checkpoint!r}; expected a path (str or "
                            "os.PathLike), which run rewrites atomically as it goes. To write "
                            "a file object, call fb.save(state, f) on the state run returns.")
        folder = os.path.dirname(os.path.abspath(os.fspath(checkpoint)))
        if not os.path.isdir(folder):
            raise ValueError(f"Invalid checkpoint: {os.fspath(checkpoint)!r}; its folder "
                             f"{folder!r} does not exist. Create it first.")
    best_loss = getattr(state, "best_loss", None)
    if not isinstance(best_loss, torch.Tensor) or not hasattr(state, "num_evals"):
        raise TypeError(f"Expected the state returned by init/update, got {type(state).__name__}.")
    if best_loss.dim() != 0:
        raise ValueError(f"run drives one state, and this one is batched (best_loss of shape "
                         f"{tuple(best_loss.shape)}): loop over "
                         "torch.func.vmap(opt.update, in_dims=(0, None)) yourself, or run "
                         "each state of the batch.")
    report = reporter(progress, max_evals if max_evals is not None else max_steps,
                       "evals" if max_evals is not None else "updates")
    evals, best = _read(state)[:2]
    rules = Stopping(maximize=opt.maximize, budget=max_evals, max_steps=max_steps,
                     target_loss=target_loss, patience=patience, min_delta=min_delta)
    rules.best_cost = rules.cost(best)
    if (evals >= max_evals if max_evals is not None else search and state.phase == "done"):
        rules.reason = "max_evals"  # a finished run, resumed: nothing left
    elif not search:  # a run resumed at its target, or with less than its next update left
        if int(state.step) > 0 and opt.ask is not None:  # the next update's candidates
            rules.per_update = optree.tree_leaves(opt.ask(state).params)[0].shape[0]
        rules.check(evals)
    compiled = torch.compile(opt.update, fullgraph=True) if compile else None
    buffer, step = _slots(state), int(state.step)  # eager: each update as at_step picks it
    started, steps, saved_at = time.perf_counter(), 0, None  # saved_at: steps on disk
    try:
        while rules.reason is None:
            new = (compiled or at_step(opt, step + steps).update)(state, loss_fn, *args)
            log_now = report is not None and (steps % log_every == log_every - 1 or steps == 0)
            new_evals, best, mean, active = _read(new, with_mean=log_now and not search)
            state, steps = new, steps + 1  # only a finished update replaces the last good one
            if checkpoint is not None and steps % checkpoint_every == 0:
                save(state, checkpoint)
                saved_at = steps
            if max_evals is not None and new_evals > max_evals:  # only the first update can
                warnings.warn(
                    f"functional_bfo.run: one update costs {new_evals - evals} evaluations, "
                    f"more than max_evals={max_evals} left room for, so the run spent "
                    f"{new_evals}; raise max_evals or use a smaller population.",
                    RuntimeWarning, stacklevel=2)
            # The most the next update can cost: every slot active (adaptive populations grow).
            per_update, evals = (new_evals - evals) * buffer / active, new_evals
            if not math.isfinite(best) and not search:  # nothing finite was ever seen
                rules.reason = "non_finite"
                warnings.warn(
                    f"functional_bfo.run: every loss evaluated in {steps} update(s) "
                    f"({evals} evaluations) is NaN or infinite, so the search has nothing to "
                    "follow; check loss_fn, the starting params and the bounds.",
                    RuntimeWarning, stacklevel=2)
                break
            if rules.record(evals, best, per_update) is None and search and new.phase == "done":
                rules.reason = "max_evals"  # the search's own
            if rules.reason is None and report and log_now:
                report(progress_info(state, steps, evals, best, mean, started))
    except BaseException as e:
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            e.last_good_state = state  # type: ignore[attr-defined]
        where = ""
        if checkpoint is not None:
            where = f" and is saved to {os.fspath(checkpoint)}"
            try:
                if saved_at != steps:
                    save(state, checkpoint)
            except Exception as failed:  # the user's exception is the one to raise
                where = f"; saving it to {os.fspath(checkpoint)} failed ({failed!r})"
        e.add_note(f"functional_bfo.run: interrupted after {steps} finished update(s); the "
                   f"state after the last of them is this exception's .last_good_state{where}.")
        raise
    if checkpoint is not None and saved_at != steps:
        save(state, checkpoint)
    if report is not None:
        mean = _read(state, with_mean=not search)[2]
        report({**progress_info(state, steps, evals, best, mean, started), "stopped": rules.reason})
    return state


def _read(state: Any, with_mean: bool = False) -> tuple[int, float, float, int]:
    """num_evals, best_loss, mean finite loss (if asked), active bacteria: one transfer."""
    values = metrics(state) if with_mean else {"num_evals": state.num_evals,
                                                "best_loss": state.best_loss}
    if hasattr(state, "active_size"):
        values["active_size"] = state.active_size
    if (ranks := disagreeing_ranks(state)) is not None:
        values["disagreeing_ranks"] = ranks
    out = materialize(values)
    refuse_disagreement(int(out.get("disagreeing_ranks", 0)))
    active = int(out.get("active_size", _slots(state)))
    return int(out["num_evals"]), out["best_loss"], out.get("mean_loss", math.nan), max(active, 1)


def _slots(state: Any) -> int:
    """The bacteria a state holds (a black-box search's rounds: 1, it reports no losses)."""
    return state.losses.shape[-1] if hasattr(state, "losses") else 1
