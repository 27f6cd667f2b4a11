"""Draw docs/benchmarks.md's figures from the recorded results.

Reads ``benchmarks/results/*.json`` as the benchmark scripts wrote them and draws the plots
into ``docs/figures/bench_*.png``. The page itself shows each script's current table
(``benchmarks/results/<name>.md``) under the command that makes it, and is edited by hand
when a record changes. Needs matplotlib (``pip install -e ".[bench]"``).

    python benchmarks/report.py
"""

from __future__ import annotations

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"

def load(stem: str) -> dict | None:
    path = RESULTS / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def plot_convergence(speed: dict, filename: str) -> str:
    fig, (by_evals, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for name, history in speed["histories"].items():
        if not history:
            continue
        evals, best, seconds = zip(*history)
        by_evals.plot(evals, best, label=name)
        by_time.plot(seconds, best, label=name)
    for ax, xlabel in ((by_evals, "evaluations"), (by_time, "seconds (spread pro rata)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("best loss")
        ax.set_yscale("log")
    by_time.set_xscale("log")
    by_evals.legend(fontsize=7)
    fig.suptitle(f"Shifted Rastrigin, D={speed['dim']}, population {speed['population']}, "
                 f"{speed['machine'].get('gpu', 'CPU')}")
    fig.tight_layout()
    fig.savefig(FIGURES / filename, dpi=110)
    plt.close(fig)
    return filename


def plot_quality(quality: dict, dim: int = 10, filename: str | None = None) -> str:
    names = list(dict.fromkeys(key.split("|")[1] for key in quality["curves"]))
    labels = list(dict.fromkeys(key.split("|")[0] for key in quality["curves"]))
    cols = 4
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.25 * rows), squeeze=False)
    budget = quality["budget_per_dim"] * dim
    evals = [f * budget for f in quality["fractions"]]
    for ax, name in zip(axes.flat, names):
        for label in labels:
            curve = quality["curves"].get(f"{label}|{name}|{dim}")
            if curve:
                ax.plot(evals, curve, label=label, linewidth=1.2)
        ax.set(xscale="log", yscale="log", title=name, xlabel="evaluations")
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    axes.flat[0].set_ylabel("median best error")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"Median best-so-far error, D = {dim}, {quality['seeds']} seeds")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    filename = filename or f"bench_quality_d{dim}.png"
    fig.savefig(FIGURES / filename, dpi=100)
    plt.close(fig)
    return filename


def plot_wins(quality: dict, name: str) -> str:
    """Which optimizer has the best median in each (function, D) cell of a quality run."""
    cells = quality["cells"]
    functions = list(dict.fromkeys(key.split("|")[0] for key in cells))
    dims = quality["dims"]
    labels = [label for label in dict.fromkeys(
        label for cell in cells.values() for label in cell) if "black-box" not in label]
    colours = {label: plt.cm.tab10(i) for i, label in enumerate(labels)}
    fig, ax = plt.subplots(figsize=(2.2 + 1.3 * len(dims), 0.9 + 0.3 * len(functions)))
    for row, function in enumerate(functions):
        for col, dim in enumerate(dims):
            cell = {k: v["median"] for k, v in cells[f"{function}|{dim}"].items()
                    if k in colours}
            if not cell:
                continue
            best = min(cell.values())
            winners = [k for k, v in cell.items() if v == best]  # ties share the cell
            for i, winner in enumerate(winners):
                ax.add_patch(plt.Rectangle((col + i / len(winners), row), 1 / len(winners), 1,
                                           color=colours[winner]))
            ax.text(col + 0.5, row + 0.5, f"{best:.0e}", ha="center", va="center", fontsize=6)
    ax.set(xlim=(0, len(dims)), ylim=(len(functions), 0), xticks=[c + 0.5 for c in
           range(len(dims))], xticklabels=[f"D = {d}" for d in dims],
           yticks=[r + 0.5 for r in range(len(functions))], yticklabels=functions)
    ax.tick_params(labelsize=7)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
              labels=list(colours), fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Best median error per cell (colour: who has it)", fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURES / name, dpi=110)
    plt.close(fig)
    return name


def plot_scaling(scaling: dict) -> str:
    fig, (by_pop, by_dim) = plt.subplots(1, 2, figsize=(11, 4))
    rows = scaling["rows"]
    for variant in sorted({r["variant"] for r in rows}):
        pop = [r for r in rows if r["variant"] == variant and r["dim"] == 30]
        dim = [r for r in rows if r["variant"] == variant and r["population"] == 64]
        by_pop.plot([r["population"] for r in pop], [r["evals_per_s"] for r in pop], "o-",
                    label=variant)
        by_dim.plot([r["dim"] for r in dim], [r["ms"] for r in dim], "o-", label=variant)
    by_pop.set(xscale="log", yscale="log", xlabel="population (D = 30)",
               ylabel="evaluations / s")
    by_dim.set(xscale="log", yscale="log", xlabel="parameters (P = 64)",
               ylabel="ms per update")
    by_pop.legend()
    fig.tight_layout()
    name = "bench_scaling.png"
    fig.savefig(FIGURES / name, dpi=110)
    plt.close(fig)
    return name


def plot_overhead(results: dict[str, dict]) -> str:
    labels, values = [], []
    for stem, data in results.items():
        where = "H100" if "cuda" in stem else "CPU"
        for r in data["updates"]:
            for mode in ("eager", "compiled", "reduce-overhead"):
                if f"{mode}_ms" in r:
                    labels.append(f"{where} {r['problem']} {r['variant']} {mode}")
                    values.append(r.get(f"{mode}_over_own_floor", r[f"{mode}_over_floor"]))
            if "eager_ray_ms" in r:  # swim_batch = N_s + 1, against both floors
                labels.append(f"{where} {r['problem']} {r['variant']} eager ray")
                values.append(r["eager_ray_over_floor"])
                labels.append(f"{where} {r['problem']} {r['variant']} eager ray / 1-call floor")
                values.append(r["eager_ray_over_one_call_floor"])
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(labels) + 1))
    ax.barh(range(len(labels)), values)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for target in (1.3, 2.0):
        ax.axvline(target, color="k", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("update / floor (same mode); dotted: targets 1.3 and 2.0")
    fig.tight_layout()
    name = "bench_overhead.png"
    fig.savefig(FIGURES / name, dpi=110)
    plt.close(fig)
    return name


OVERHEAD_STEMS = ["update_overhead", "update_overhead_cuda_bfo",
                  "update_overhead_cuda_adaptive_hybrid"]


def main() -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    figures = {}
    if (speed := load("speed")) is not None:
        figures["speed"] = plot_convergence(speed, "bench_convergence_rastrigin.png")
    if (speed := load("speed_cuda")) is not None:
        figures["speed_cuda"] = plot_convergence(speed, "bench_convergence_rastrigin_cuda.png")
    if (quality := load("quality")) is not None:
        figures["quality"] = [plot_quality(quality), plot_wins(quality, "bench_wins.png")]
    if (quality := load("quality_bbob")) is not None:
        figures["quality_bbob"] = [plot_quality(quality, filename="bench_quality_bbob_d10.png"),
                                   plot_wins(quality, "bench_wins_bbob.png")]
    if (coco := load("coco")) is not None:  # drawn by cocopp, copied there by coco.py
        figures["coco"] = [pathlib.Path(link).name for link in coco["figures"].values()]
    if (scaling := load("scaling")) is not None:
        figures["scaling"] = plot_scaling(scaling)
    overhead = {s: d for s in OVERHEAD_STEMS if (d := load(s)) is not None}
    if overhead:
        figures["update_overhead"] = plot_overhead(
            {s: d for s, d in overhead.items() if s in ("update_overhead",
                                                        "update_overhead_cuda_bfo")})
    print(f"drew {len(figures)} figures into {FIGURES}")


if __name__ == "__main__":
    main()
