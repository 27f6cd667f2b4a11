"""Progress of a run: its figures as a dict, shown by the user's callable, tqdm or lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Progress = bool | Callable[[dict[str, float]], None]


def progress_info(state: Any, steps: int, evals: int, best: float, mean: float,
                  started: float) -> dict:
    """What a progress report says after ``steps`` updates of this run."""
    return {"step": int(state.step), "updates": steps, "num_evals": evals, "best_loss": best,
            "mean_loss": mean, "seconds": time.perf_counter() - started}


def reporter(progress: Progress, total: int | None = None,
             unit: str = "evals") -> Callable[[dict], None] | None:
    """What reports progress: None, the user's callable, a tqdm bar, or printed lines."""
    if progress is False or progress is None:
        return None
    if callable(progress):
        return progress
    if progress is not True:
        raise TypeError(f"Invalid progress: {progress!r}; expected a bool or a callable(dict).")
    try:
        from tqdm import tqdm
    except ImportError:  # lines instead: tqdm is optional
        return print_line
    bar = tqdm(total=total, unit=f" {unit}", dynamic_ncols=True)

    def show(info: dict) -> None:
        bar.n = info["num_evals"] if unit == "evals" else info["updates"]
        bar.set_postfix(best=f"{info['best_loss']:.6g}", refresh=False)
        if "stopped" in info:
            bar.close()
            print_line(info)
        else:
            bar.refresh()

    return show


def print_line(info: dict) -> None:
    if "stopped" in info:
        print(f"stopped by {info['stopped']} after {info['updates']} updates ({info['num_evals']} "
              f"evaluations, {info['seconds']:.1f}s): best {info['best_loss']:.6g}", flush=True)
    else:
        print(f"step {info['step']:6d}  evals {info['num_evals']:9d}  best "
              f"{info['best_loss']:.6g}  mean {info['mean_loss']:.6g}  {info['seconds']:.1f}s",
              flush=True)
