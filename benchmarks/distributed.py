"""Sharding the population across processes: time per update against the process count.

``PROBLEM`` (160 evaluations an update) on N torchrun ranks for each process count N (gloo,
or NCCL with ``--device cuda``, one thread each) with ``fb.distributed.sharded()``: rank 0
times updates and one all-gather; the model t(N) = a / N + b + calls x t_gather(N) is fitted
(a: the evaluations, which split; b: what every rank repeats) and extrapolated. One process
with N threads, the first thing a CPU user tries, is timed too.

    python benchmarks/distributed.py [--quick] [--device cuda]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import median_ms, parse, table, write
from torch import nn

import functional_bfo as fb

PROBLEM = "MLP 64-128-10 on digits (1797 samples), fb.adaptive_bfo(32, swim_length=4)"


def setup(device: torch.device):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32, device=device) / 16.0
    y = torch.tensor(digits.target, device=device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 10)).to(device)
    params, loss_fn = fb.module_loss(model, nn.functional.cross_entropy)
    return params, loss_fn, x, y


def update_s(opt, problem, repeats: int, device: torch.device) -> float:
    """Median seconds of an update of ``opt`` on ``setup``'s problem, chained from ``init``."""
    params, loss_fn, x, y = problem
    state = [opt.init(params, key=fb.random.key(0).to(device))]

    def update():
        state[0] = opt.update(state[0], loss_fn, x, y)

    return median_ms(update, repeats, str(device), warmup=1) / 1e3


def rank_main(out: str, repeats: int) -> None:
    """One rank: time updates with the sharded evaluator, and the model's constants."""
    import datetime

    import torch.distributed as dist

    cuda = torch.cuda.is_available() and os.environ.get("BENCH_DEVICE") == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=5))
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    world = dist.get_world_size()
    population, swims = 32, 4
    opt = fb.adaptive_bfo(population, swim_length=swims, evaluator=fb.distributed.sharded())
    problem = setup(device)
    t_update = update_s(opt, problem, repeats, device)
    losses = torch.zeros(population, dtype=torch.float64, device=device)
    parts = [torch.empty(-(-population // world), dtype=torch.float64, device=device)
             for _ in range(world)]
    t_gather = median_ms(lambda: dist.all_gather(parts, losses[:parts[0].numel()]),
                         repeats * 10, str(device), warmup=1) / 1e3
    params, loss_fn, x, y = problem
    start = opt.init(params, key=fb.random.key(1).to(device))
    pop = fb.as_params(start, start.population)
    t_eval = median_ms(lambda: fb.evaluate.vmap()(loss_fn, pop, x, y), repeats, str(device),
                       warmup=1) / 1e3 * (swims + 1)  # the swim's swims + 1 calls of P candidates
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({
            "processes": world, "update_s": t_update, "gather_s": t_gather,
            "eval_one_process_s": t_eval, "calls": swims + 1,
            "bytes_sent": (swims + 1) * parts[0].numel() * 8}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    args = parse(__doc__)
    repeats, counts = (1, [2]) if args.quick else (15, [1, 2])
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in counts:
            out = os.path.join(folder, f"rank0_{n}.json")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "BENCH_DEVICE": device.type}
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={n}", __file__, "--rank-main", out, str(repeats)],
                           check=True, env=env, capture_output=True, timeout=900)
            rows.append(json.loads(Path(out).read_text()))
    # The model t(N) = a / N + b + calls * t_gather(N), a and b fitted to the measurements
    # by least squares (exact with two process counts; one gives a alone).
    points = [(1 / r["processes"], r["update_s"] - r["calls"] * r["gather_s"]) for r in rows]
    a, b = (statistics.linear_regression(*zip(*points)) if len(points) > 1
            else (points[0][1] * rows[0]["processes"], 0.0))
    base = rows[0]
    for r in rows:
        r["model_s"] = a / r["processes"] + b + r["calls"] * r["gather_s"]
        r["speedup"] = base["update_s"] / r["update_s"]
    gather = rows[-1]["gather_s"]  # the largest group's, for the extrapolation
    predicted = {n: a / n + b + base["calls"] * gather for n in (4, 8, 16)}
    threads = {}  # seconds per update in one process of N threads, no evaluator
    for n in counts if device.type == "cpu" and not args.quick else ():
        torch.set_num_threads(n)
        threads[n] = update_s(fb.adaptive_bfo(32, swim_length=4), setup(device), repeats, device)
    result = dict(problem=PROBLEM, rows=rows, shared_s=a, fixed_s=b, predicted_s=predicted,
                  one_process_threads_s=threads)
    md = [f"# Sharded population across processes ({args.device})", "", f"{PROBLEM}.", "",
          "Each rank: one thread, `fb.distributed.sharded()`; the median time per update on "
          "rank 0, and of one all-gather of the losses (5 per update). Model: t(N) = a / N + "
          f"b + 5 t_gather(N), fitted: a = {a * 1e3:.1f} ms (the work that splits: "
          f"evaluations), b = {b * 1e3:.1f} ms (what every rank repeats: the update's own "
          f"work). One process scores the 160 candidates of an update in "
          f"{base['eval_one_process_s'] * 1e3:.1f} ms.", ""]
    md += table("processes | ms per update | speedup | model ms | all-gather ms | bytes each "
                "rank contributes per update", [
                    [r["processes"], f"{r['update_s'] * 1e3:.1f}", f"{r['speedup']:.2f}x",
                     f"{r['model_s'] * 1e3:.1f}", f"{r['gather_s'] * 1e3:.3f}", r["bytes_sent"]]
                    for r in rows])
    md += ["", "The model's extrapolation (all-gather as measured at the largest N): " + ", ".join(
        f"N = {n}: {t * 1e3:.1f} ms" for n, t in predicted.items()) + "."]
    if threads:
        md += ["", "One process, no evaluator, N intra-op threads (torch.set_num_threads):", ""]
        md += table("threads | ms per update", [[n, f"{s * 1e3:.1f}"] for n, s in threads.items()])
    write(args, "distributed", result, md)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], int(sys.argv[3]))
    else:
        main()
