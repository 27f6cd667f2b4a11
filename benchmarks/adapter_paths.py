"""The torch.optim adapters' two ways to evaluate: a closure per candidate vs vmap(functional_call).

One ``step`` of each adapter class on an MLP classifier: the closure path (``closure()`` once
per bacterium), the vmapped fast path ``step(loss_fn=...)`` eager, with ``chunk_size=CHUNK``,
and compiled (its compile time and break-even steps), with page faults a step; on Linux the
eager paths again once glibc keeps the memory it frees (``mallopt``, as jemalloc does).

    python benchmarks/adapter_paths.py [--quick] [--device cuda]
"""

from __future__ import annotations

import ctypes
import resource

import torch
from common import median_ms, parse, table, write
from problems import mlp
from torch import nn

from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO

CHUNK = 16


def bench(cls, widths, samples, population, repeats, device) -> dict:
    model, x, y = mlp(widths, samples, device)
    row = {"class": cls.__name__, "population": population,
           "params": sum(p.numel() for p in model.parameters())}
    for path, settings in (("closure", {}), ("fast_eager", {}),
                           ("fast_chunked", {"chunk_size": CHUNK})):
        opt, step = stepper(cls, path, model, x, y, population_size=population, **settings)
        row[f"{path}_ms"] = median_ms(step, repeats, device, warmup=1 if path == "closure" else 2)
        if path == "closure":
            evals_per_step = opt.num_evals / (repeats + 1)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # memory taken back from
        for _ in range(5):  # the system, per step
            step()
        row[f"{path}_faults"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 5

    torch.compiler.reset()
    _, compiled_step = stepper(cls, "fast", model, x, y, population_size=population, compile=True)
    first_ms = median_ms(compiled_step, 1, device, warmup=0)  # the first step compiles
    row["fast_compiled_ms"] = median_ms(compiled_step, repeats, device)
    row["compile_s"] = (first_ms - row["fast_compiled_ms"]) / 1e3
    gain = row["fast_eager_ms"] - row["fast_compiled_ms"]
    row["break_even_steps"] = (1e3 * row["compile_s"] / gain) if gain > 0 else None
    row["evals_per_step"] = evals_per_step
    row["closure_over_fast"] = row["closure_ms"] / row["fast_eager_ms"]
    for path in ("closure", "fast_eager", "fast_compiled"):
        row[f"{path}_evals_per_s"] = evals_per_step / (row[f"{path}_ms"] / 1e3)
    return row


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse rather than return it; False where it cannot."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    trim_threshold, mmap_threshold = -1, -3  # mallopt's M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
    return bool(libc.mallopt(mmap_threshold, 1 << 30) and libc.mallopt(trim_threshold, 1 << 30))


def stepper(cls, path: str, model, x, y, **settings):
    """A ``cls`` optimizer of ``model`` (``seed=0``) and one ``opt.step`` on the closure path or
    a fast one (``fast...``); the hybrid's closure runs backward, as its gradients need."""
    opt = cls(model.parameters() if path == "closure" else model.named_parameters(), seed=0,
              **settings)
    criterion = nn.CrossEntropyLoss()

    def closure():
        opt.zero_grad()
        loss = criterion(model(x), y)
        if isinstance(opt, HybridBFO):
            loss.backward()
        return loss.item()

    def loss_fn(params):
        return criterion(torch.func.functional_call(model, params, (x,)), y)

    return opt, (lambda: opt.step(closure)) if path == "closure" else (
        lambda: opt.step(loss_fn=loss_fn))


def main() -> None:
    args = parse(__doc__, cold=True)
    widths, samples = ((16, 32, 4), 128) if args.quick else ((64, 128, 10), 256)
    population, repeats = (16, 3) if args.quick else (64, 10)
    classes = [BFO] if args.quick else [BFO, AdaptiveBFO, HybridBFO]
    rows = [bench(c, widths, samples, population, repeats, args.device) for c in classes]
    kept = args.device == "cpu" and keep_freed_memory()
    for row, c in zip(rows, classes) if kept else ():  # the eager paths, fresh optimizers
        model, x, y = mlp(widths, samples, args.device)
        for path in ("closure", "fast_eager"):
            _, step = stepper(c, path, model, x, y, population_size=population)
            row[f"{path}_kept_ms"] = median_ms(step, repeats, args.device, warmup=1)
    md = [f"# Adapter paths: closure vs vmapped fast path ({args.device})", "",
          f"MLP {'-'.join(map(str, widths))} (tanh) on {samples} samples, cross-entropy, "
          f"population {population}, default swim length. Memory kept: the eager paths again "
          "once glibc keeps the memory it frees (`mallopt`, as jemalloc and tcmalloc do).", ""]
    md += table("class | params | evals/step | closure ms | fast eager ms | fast compiled ms | "
                "closure / fast | compile s | break-even steps | page faults a step (closure, "
                f"fast) | fast eager, chunk_size={CHUNK} ms | page faults a step | memory kept: "
                "closure ms | fast eager ms | closure / fast", [
                    [r["class"], r["params"], f"{r['evals_per_step']:.0f}",
                     f"{r['closure_ms']:.1f}", f"{r['fast_eager_ms']:.2f}",
                     f"{r['fast_compiled_ms']:.2f}", f"{r['closure_over_fast']:.2f}x",
                     f"{r['compile_s']:.1f}", "never" if r["break_even_steps"] is None
                     else f"{r['break_even_steps']:.0f}",
                     f"{r['closure_faults']:,.0f}, {r['fast_eager_faults']:,.0f}",
                     f"{r['fast_chunked_ms']:.2f}", f"{r['fast_chunked_faults']:,.0f}"]
                    + ([f"{r['closure_kept_ms']:.1f}", f"{r['fast_eager_kept_ms']:.2f}",
                        f"{r['closure_kept_ms'] / r['fast_eager_kept_ms']:.2f}x"] if kept
                       else ["-"] * 3) for r in rows])
    write(args, "adapter_paths", {"model": list(widths), "samples": samples, "rows": rows}, md)


if __name__ == "__main__":
    main()
