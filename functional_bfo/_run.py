"""The driver: run ``update`` until a budget or a convergence test says stop.

It lives outside ``update`` because stopping needs host-side decisions: it reads the
state's counters and best loss once per update (one small device-to-host copy), never
inside the compiled step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ._base import LossFn, Optimizer
from ._checks import check_bool, check_float, check_int
from .telemetry import materialize, metrics

Progress = bool | Callable[[dict[str, float]], None]


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
    maximize: bool = False,
    progress: Progress = False,
    log_every: int = 10,
    compile: bool = False,
) -> Any:
    """Apply ``opt.update`` to ``state`` until a stopping rule fires; return the last state.

    Args:
        opt: the optimizer that made ``state``.
        state: its state, e.g. ``opt.init(params, key=...)``.
        loss_fn: ``loss_fn(params, *args) -> 0-d tensor``.
        *args: data passed to every ``loss_fn`` call.
        max_evals: stop before an update could take ``state.num_evals`` past this (the
            first update always runs, to learn how many evaluations one update costs; with a
            varying active population the next update is assumed to use every slot).
        max_steps: stop after this many updates.
        target_loss: stop once the best loss reaches it (``<=``, or ``>=`` when maximizing).
        patience: stop after this many updates without the best improving by ``min_delta``.
        min_delta: the improvement that resets ``patience``.
        maximize: set as for the optimizer; only ``target_loss`` and ``patience`` use it.
        progress: True prints a line every ``log_every`` updates and a summary; a callable
            receives the same numbers as a dict instead.
        log_every: updates between progress reports.
        compile: run ``torch.compile(opt.update, fullgraph=True)``; a failure to compile is
            raised, never hidden by falling back to eager.

    Raises:
        ValueError: no budget (``max_evals`` or ``max_steps``) is given, or one is invalid.
    """
    if max_evals is None and max_steps is None:
        raise ValueError("run needs a budget: pass max_evals=... or max_steps=... "
                         "(target_loss and patience alone may never fire).")
    if max_evals is not None:
        check_int("max_evals", max_evals, 1)
    if max_steps is not None:
        check_int("max_steps", max_steps, 0)
    if patience is not None:
        check_int("patience", patience, 1)
    check_float("min_delta", min_delta, 0.0)
    check_bool("maximize", maximize)
    check_bool("compile", compile)
    if target_loss is not None:
        check_float("target_loss", target_loss, -math.inf)
    check_int("log_every", log_every, 1)
    report = _reporter(progress)
    update = torch.compile(opt.update, fullgraph=True) if compile else opt.update

    sign = -1.0 if maximize else 1.0
    evals, best = _read(state)[:2]
    buffer = state.losses.shape[-1]
    best_cost, per_update, steps, stalled = sign * best, None, 0, 0
    started, reason = time.perf_counter(), "max_steps"
    while True:
        if max_steps is not None and steps >= max_steps:
            reason = "max_steps"
            break
        if max_evals is not None and per_update is not None and evals + per_update > max_evals:
            reason = "max_evals"
            break
        state = update(state, loss_fn, *args)
        steps += 1
        log_now = report is not None and (steps % log_every == 0 or steps == 1)
        new_evals, best, mean, active = _read(state, with_mean=log_now)
        # The most the next update can cost: every slot active (adaptive populations grow).
        per_update, evals = (new_evals - evals) * buffer / active, new_evals
        stalled = 0 if best_cost - sign * best > min_delta else stalled + 1
        best_cost = min(best_cost, sign * best)
        if target_loss is not None and sign * best <= sign * target_loss:
            reason = "target_loss"
            break
        if patience is not None and stalled >= patience:
            reason = "patience"
            break
        if log_now:
            report(_info(state, steps, evals, best, mean, started))
    if report is not None:
        info = _info(state, steps, evals, best, _read(state, with_mean=True)[2], started)
        report({**info, "stopped": reason})
    return state


def _read(state: Any, with_mean: bool = False) -> tuple[int, float, float, int]:
    """num_evals, best_loss, mean finite loss (if asked), active bacteria: one transfer."""
    values = metrics(state) if with_mean else {"num_evals": state.num_evals,
                                                "best_loss": state.best_loss}
    if hasattr(state, "active_size"):
        values["active_size"] = state.active_size
    out = materialize(values)
    active = int(out.get("active_size", state.losses.shape[-1]))
    return (int(out["num_evals"]), out["best_loss"], out.get("mean_loss", math.nan),
            max(active, 1))


def _info(state: Any, steps: int, evals: int, best: float, mean: float, started: float) -> dict:
    return {"step": int(state.step), "updates": steps, "num_evals": evals, "best_loss": best,
            "mean_loss": mean, "seconds": time.perf_counter() - started}


def _reporter(progress: Progress) -> Callable[[dict], None] | None:
    if progress is False or progress is None:
        return None
    if callable(progress):
        return progress
    if progress is True:
        return _print_line
    raise TypeError(f"Invalid progress: {progress!r}; expected a bool or a callable(dict).")


def _print_line(info: dict) -> None:
    if "stopped" in info:
        print(f"stopped by {info['stopped']} after {info['updates']} updates "
              f"({info['num_evals']} evaluations, {info['seconds']:.1f}s): "
              f"best {info['best_loss']:.6g}", flush=True)
        return
    print(f"step {info['step']:6d}  evals {info['num_evals']:9d}  "
          f"best {info['best_loss']:.6g}  mean {info['mean_loss']:.6g}  "
          f"{info['seconds']:.1f}s", flush=True)
