"""The torch.optim adapters' two ways to evaluate: a closure per candidate vs vmap(functional_call).

For each adapter class, one ``step`` on an MLP classifier: the closure path (the candidate
written into the model, ``closure()`` called once per bacterium, as any ``torch.optim``
loop does), the vmapped fast path ``step(loss_fn=...)`` eager, and compiled
(``compile=True``) with its compile time and the number of steps after which compiling
pays off.

    python benchmarks/adapter_paths.py [--quick] [--device cuda]
"""

from __future__ import annotations

import time

import torch
from common import compile_cold, machine, median_ms, parser, sync, write
from torch import nn

from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO


def problem(widths: tuple[int, ...], samples: int, device: str):
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers[:-1]).to(device)
    x = torch.randn(samples, widths[0], device=device)
    y = torch.randint(0, widths[-1], (samples,), device=device)
    return model, x, y


def bench(cls, widths, samples, population, repeats, device) -> dict:
    model, x, y = problem(widths, samples, device)
    criterion = nn.CrossEntropyLoss()
    row = {"class": cls.__name__, "population": population,
           "params": sum(p.numel() for p in model.parameters())}

    opt = cls(model.parameters(), population_size=population, seed=0)

    def closure():
        opt.zero_grad()
        loss = criterion(model(x), y)
        if cls is HybridBFO:
            loss.backward()
        return loss.item()

    row["closure_ms"] = median_ms(lambda: opt.step(closure), repeats, device, warmup=1)
    evals_per_step = opt.num_evals / (repeats + 1)

    def loss_fn(params):
        return criterion(torch.func.functional_call(model, params, (x,)), y)

    opt = cls(model.named_parameters(), population_size=population, seed=0)
    row["fast_eager_ms"] = median_ms(lambda: opt.step(loss_fn=loss_fn), repeats, device)

    torch.compiler.reset()
    opt = cls(model.named_parameters(), population_size=population, seed=0, compile=True)
    sync(device)
    start = time.perf_counter()
    opt.step(loss_fn=loss_fn)
    sync(device)
    first = time.perf_counter() - start
    row["fast_compiled_ms"] = median_ms(lambda: opt.step(loss_fn=loss_fn), repeats, device)
    row["compile_s"] = first - row["fast_compiled_ms"] / 1e3
    gain = row["fast_eager_ms"] - row["fast_compiled_ms"]
    row["break_even_steps"] = (1e3 * row["compile_s"] / gain) if gain > 0 else None
    row["evals_per_step"] = evals_per_step
    row["closure_over_fast"] = row["closure_ms"] / row["fast_eager_ms"]
    for path in ("closure", "fast_eager", "fast_compiled"):
        row[f"{path}_evals_per_s"] = evals_per_step / (row[f"{path}_ms"] / 1e3)
    return row


def main() -> None:
    compile_cold()
    args = parser(__doc__).parse_args()
    widths, samples = ((16, 32, 4), 128) if args.quick else ((64, 128, 10), 256)
    population = 16 if args.quick else 64
    repeats = 3 if args.quick else 10
    classes = [BFO] if args.quick else [BFO, AdaptiveBFO, HybridBFO]
    rows = [bench(c, widths, samples, population, repeats, args.device) for c in classes]
    result = {"machine": machine(args.device), "quick": args.quick, "model": list(widths),
              "samples": samples, "rows": rows}
    md = [f"# Adapter paths: closure vs vmapped fast path ({'quick' if args.quick else 'full'})",
          "", f"MLP {'-'.join(map(str, widths))} (tanh) on {samples} samples, cross-entropy, "
          f"population {population}, default swim length. Machine: {result['machine']}", "",
          "| class | params | evals/step | closure ms | fast eager ms | fast compiled ms | "
          "closure / fast | compile s | break-even steps |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        even = "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f}"
        md.append(f"| {r['class']} | {r['params']} | {r['evals_per_step']:.0f} | "
                  f"{r['closure_ms']:.1f} | {r['fast_eager_ms']:.2f} | "
                  f"{r['fast_compiled_ms']:.2f} | {r['closure_over_fast']:.0f}x | "
                  f"{r['compile_s']:.1f} | {even} |")
    write(args, "adapter_paths", result, md)


if __name__ == "__main__":
    main()
