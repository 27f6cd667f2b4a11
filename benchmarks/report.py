"""Build docs/benchmarks.md and its figures from the recorded results (never by hand).

Reads ``benchmarks/results/*.json`` as the benchmark scripts wrote them, draws the plots
into ``docs/figures/bench_*.png`` and writes ``docs/benchmarks.md`` with every recorded
table. Needs matplotlib (``pip install -e ".[bench]"``).

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

SECTIONS = [  # (results stem, heading, what the numbers say)
    ("quality", "Quality vs peers at equal budgets",
     "`python benchmarks/quality.py`: median final error over 5 seeds at 2000 x D "
     "evaluations; bold is the best median of the row. Every optimizer sees the function "
     "plus a constant in [-1000, 1000], as a user's loss has a minimum that is not 0; the "
     "errors are f(x) - min f. The curves are the median best-so-far "
     "error at D = 10 (log-spaced fractions of the budget). `fb.adaptive_bfo black-box` is "
     "`fb.adaptive_bfo(8, bounds=box, relative_steps=True, swim_length=1, "
     "step_size_min=1e-12)`; `fb.black_box` is that swarm restarted when it stalls, every "
     "other swarm with a learned tumble metric (going on as a walker that recombines whole "
     "rounds of tumbles once the metric finds a valley), an exploring swarm of kicked "
     "bacteria once restarts stop finding better basins, and the last tenth of the budget spent "
     "refining the best point, first tried on the box's faces (docs/variants.md)."),
    ("quality_bbob", "Quality vs peers on COCO's BBOB suite",
     "`python benchmarks/quality.py --suite bbob`: the 24 noiseless BBOB functions of COCO "
     "(`pip install coco-experiment`; `cocoex.BareProblem`, instance seed + 1, box [-5, 5]) "
     "with the same optimizers, budgets, seeds and rules as the table above. The optimizers "
     "see COCO's own values f(x), whose minimum f(x*) lies between -1000 and 1000, as a user "
     "running COCO hands them over; the errors are f(x) - f(x*). It is the suite the "
     "black-box setup was not tuned on."),
    ("quality_at_zero", "Quality vs peers, the eight functions at minimum 0",
     "`python benchmarks/quality.py --at-zero`: the first table's runs handed f(x) - min f "
     "itself, as most benchmark tables do. `fb.black_box` and every peer that compares "
     "losses with each other only give the same errors up to the last bits the offset "
     "rounds away; an optimizer whose rules read the loss's size does better here than a "
     "user will."),
    ("quality_bbob_at_zero", "Quality vs peers on COCO's BBOB suite at minimum 0",
     "`python benchmarks/quality.py --suite bbob --at-zero`: the BBOB runs handed the errors "
     "f(x) - f(x*) themselves. IPOP-CMA-ES, pymetaheuristic's and mealpy's original BFO and "
     "our optimizers only compare losses and give the same errors; niapy's BFO and mealpy's "
     "ABFO move by a few percent."),
    ("coco", "COCO's runtime ECDFs (bbob)",
     "`python benchmarks/coco.py`: every problem of COCO's noiseless bbob suite (24 functions, "
     "its 15 standard instances) at 2000 x D evaluations, observed by `cocoex` into a COCO "
     "data set and drawn by `cocopp` as the field reports it: the share of (function, "
     "instance, target) triples reached against evaluations / D, for COCO's 51 targets "
     "10^[-8..2] on f - f_opt, beside COCO's best-2009 reference. `fb.black_box` sees COCO's "
     "own f(x) and starts from the centre of the box. The runs are split by function over "
     "two processes on two cores; the seconds column sums each run's own time."),
    ("speed", "Speed vs peers",
     "`python benchmarks/speed.py`: every optimizer on the same shifted Rastrigin in one run; "
     "ratios are to the fastest BFO peer of that run. Against EvoX's PSO on the same "
     "function in torch, compiled `fb.bfo` scores 2.2-3.2x its evaluations per second. "
     "Eager, at its default `swim_batch=1` (five evaluator calls an update, each paying "
     "`torch.func.vmap`'s own Python), it scores 0.94-0.97x EvoX's eager PSO in a loop of "
     "`update` and 1.02-1.06x under `fb.run` (which leaves out the cycle events where no "
     "cycle ends), the medians of seven runs of each in turn in three runs of the script "
     "(a single run of either moves by 10% on this machine). EvoX is handed a function of "
     "the whole population; given the same function through an evaluator that calls it on "
     "the population (docs/concepts.md), eager `fb.bfo` scores 1.41-1.47x. With the whole "
     "swim ray in one call (`swim_batch=5`, which holds five times the candidates and "
     "their activations at once) the per-candidate loss runs 1.5x the default's rate."),
    ("gpu_cuda", "On an NVIDIA H200: updates from P = 256 to 65,536, EvoX's PSO, glue",
     "`python benchmarks/gpu.py` (about 4 minutes on one GPU; EvoX installed beside): the "
     "current GPU figures, every mode side by side in one process. With CUDA graphs "
     "(`mode=\"reduce-overhead\"`) a compiled `fb.bfo` update at P = 65,536 takes 1.09x "
     "the time of its recorded floor (not five evaluations' worth, see below) and scores "
     "3.0x the evaluations per second of EvoX's compiled PSO; compiled without graphs it is "
     "bound by the host's launches (3.55x its floor, "
     "1.8x EvoX). The hybrid rows at P = 65,536 met one fused kernel at 503 us an update in "
     "this process; on a fresh machine of the same kind it took 46 us, and on another the "
     "update with graphs took 0.37 ms (2.0x). This run's floor evaluated one population "
     "five times, which inductor computes once (one 9 us kernel at P = 65,536): its update "
     "/ floor ratios measure launches and guards more than work. A profile of the same "
     "compiled bfo update counts 151 us of GPU time against 46 us for five evaluations "
     "(3.3x; benchmarks/NOTES.md); `gpu.py` now evaluates five different populations and "
     "reports both GPU times. These figures predate the centroid as a matrix "
     "product (benchmarks/NOTES.md: 0.84-0.85x the adaptive and hybrid update with graphs). "
     "The GPU sections after this one were recorded on an H100 with older code."),
    ("speed_cuda", "Speed vs peers on an NVIDIA H100 machine",
     "`python benchmarks/speed.py --device cuda`: our updates on the machine's H100, the "
     "peers (numpy libraries) on the same machine's 16 CPU threads, in one run."),
    ("update_overhead", "Update overhead vs the evaluation floor (CPU)",
     "`python benchmarks/update_overhead.py`: an update against the vmapped evaluations it "
     "performs, run the same way (targets: 2.0 eager, 1.3 compiled)."),
    ("update_overhead_baseline", "The update against the one before it (CPU)",
     "`python benchmarks/update_overhead.py --baseline ROOT`: this checkout's `update` "
     "against another checkout's, back to back in one process (the same random kernel). "
     "The last change keeps the box in the state (`state.box`, resolved once by `init`) "
     "instead of rebuilding it from the bounds in every update: an update in a box (the "
     "Rastrigin rows) takes 0.94-0.97x the time eagerly and 0.92-0.97x compiled; the "
     "unbounded MLP rows had no box to rebuild and move within this machine's noise "
     "(0.99-1.01x). Every run is the same bit for bit."),
    ("leaves", "An eager update by the number of leaves (CPU)",
     "`python benchmarks/leaves.py`: the same shifted sphere as params of 1 to 100 leaves. "
     "The population is one (P, D) matrix, so the update's own ops do not grow with the "
     "leaves; what still does is the loss's own per-leaf work (the floor) and the views "
     "that hand each row to it as params."),
    ("leaves_baseline", "An eager update by the number of leaves, against the pytree layout (CPU)",
     "`python benchmarks/leaves.py --baseline ROOT`, ROOT a checkout of the layout that kept "
     "each leaf of the population as its own tensor, side by side in one process. The "
     "library's evaluators are handed the population's rows, one tensor for `vmap` to batch "
     "instead of every leaf, which is why the Python calls grow less than the floor's."),
    ("leaves_baseline_quick_cuda",
     "An eager update by the number of leaves, against the pytree layout (NVIDIA H100)",
     "`python benchmarks/leaves.py --device cuda --baseline ROOT --quick`: on a GPU every "
     "op is a kernel launch, so an op saved is time saved. Run before the library's "
     "evaluators were handed the population's rows."),
    ("gpu_profile_cuda", "Where an eager update's time goes on an NVIDIA H200",
     "`python benchmarks/gpu_profile.py --device cuda`: per update, the ops dispatched, the "
     "kernels launched, the host syncs (none), the host's time before it waits for the GPU "
     "and the GPU's own kernel time. The GPU computes for 5% of an eager update at P = 256 "
     "(14% at 65,536); the rest is the host, with no sync: Python, and ops dispatched at "
     "7-10 us each (`fb.bfo`'s 216 ops alone are 1.6 of its 4.7 ms). So an op fewer is "
     "time saved, and CUDA graphs (the first GPU section) take the host out. The next "
     "section is the same run at 96f5aac, before the eager cuts "
     "of 0.2.0 (a ray built at once, one vmap call's pytree broadcast less, fewer masks), in "
     "the same session: 216 ops instead of 285 for `fb.bfo` at P = 256."),
    ("gpu_profile_cuda_96f5aac", "Where an eager update's time went, before the eager cuts",
     "`python benchmarks/gpu_profile.py --device cuda` at 96f5aac."),
    ("gpu_eager_h200_cuda", "Eager updates on an NVIDIA H200",
     "`python benchmarks/gpu.py --only eager` at 0a11d3f; the next section is the same rows at "
     "96f5aac, one after the other on the same machine. The host's speed moves by 25% "
     "between processes there (one small op took 7.3 and 9.8 us in two), so read the op "
     "counts of the profile above for what changed."),
    ("gpu_eager_h200_cuda_96f5aac", "Eager updates on an NVIDIA H200, before the eager cuts",
     "`python benchmarks/gpu.py --only eager` at 96f5aac."),
    ("gpu_eager_cuda", "Eager updates on an NVIDIA H100, one (P, D) matrix",
     "`python benchmarks/gpu.py --only eager`: a 30-D Rastrigin as one leaf, where the layout "
     "changes nothing: compare with the next section, the same rows before it, run on the "
     "same machine one after the other."),
    ("gpu_eager_cuda_9a1ff0b", "Eager updates on an NVIDIA H100, before the (P, D) matrix",
     "`python benchmarks/gpu.py --only eager` at the commit before the layout changed."),
    ("swim_batch", "Swim points per evaluation call (CPU)",
     "`python benchmarks/swim_batch.py`: `swim_batch=1` (the default) against the whole swim "
     "ray in one call; the trajectory is the same."),
    ("update_overhead_cuda_bfo", "Update overhead on an NVIDIA H100: fb.bfo",
     "`python benchmarks/update_overhead.py --device cuda --variants bfo`."),
    ("update_overhead_cuda_adaptive_hybrid",
     "Update overhead on an NVIDIA H100: fb.adaptive_bfo and fb.hybrid_bfo",
     "`python benchmarks/update_overhead.py --device cuda --variants adaptive_bfo,hybrid_bfo`."
     " The adaptive Rastrigin row compiled with inductor's disk cache warm from an earlier "
     "run on that machine (7 s; cold it took 51-62 s)."),
    ("scaling", "Scaling with population and parameters",
     "`python benchmarks/scaling.py`: eager updates; CPU peak memory is the peak resident set "
     "of one update in a fresh process, over what was resident before it."),
    ("scaling_cuda", "Scaling on an NVIDIA H100",
     "`python benchmarks/scaling.py --device cuda`: peak memory from the CUDA allocator."),
    ("adapter_paths", "The torch.optim adapters: closure vs fast path (CPU)",
     "`python benchmarks/adapter_paths.py`."),
    ("chunk_size", "Chunked evaluation against one call (CPU)",
     "`python benchmarks/chunk_size.py`: what `chunk_size` does to an eager update, by how "
     "large a candidate's activations are. Chunks win where a call's temporaries would be "
     "megabytes (glibc then keeps them instead of faulting them back in each call) and "
     "lose where they are small, so the default stays one call."),
    ("adapter_shells", "The shell's own cost against the one it replaced (CPU)",
     "`python benchmarks/adapter_paths.py --baseline ROOT`, ROOT a checkout of the previous "
     "shell: both step the same problem over the same core, in turn. \"per evaluation\" "
     "divides out the closure path's one extra evaluation (its call at the best "
     "parameters)."),
    ("adapter_paths_cuda", "The torch.optim adapters on an NVIDIA H100",
     "`python benchmarks/adapter_paths.py --device cuda`."),
    ("adaptive_vs_bfo", "AdaptiveBFO vs canonical BFO",
     "`python benchmarks/adaptive_vs_bfo.py`."),
    ("lone_metric", "A learned metric: the black box's walker, a lone bacterium and a swarm",
     "`python benchmarks/lone_metric.py`: down a rotated ellipsoid with `metric_rate=2`, as "
     "the black box goes on in a valley: its walker recombines a whole round of 16 tumbles "
     "around one mean (CMA-ES's update, docs/variants.md); a lone bacterium "
     "(`fb.adaptive_bfo(1, ...)`, which the black box ran before) follows its evolution path "
     "(the (1+1)-CMA-ES's); one that swims spends an evaluation a round on a swim that the "
     "four tumbles in five that fail waste; a swarm counts each success alone. A round "
     "costs about the same at any size, so per evaluation a lone bacterium's costs many "
     "times a swarm's or the walker's (the last column): on a loss this cheap that is the "
     "wall time; for an expensive loss the evaluations dominate."),
    ("black_box_speed", "fb.black_box against pycma's BIPOP-CMA-ES (CPU)",
     "`python benchmarks/black_box_speed.py`: evaluations per second, final error and the "
     "share of evaluations asked in rounds of a whole swarm, at equal budgets in one "
     "process. On the rotated ellipsoid a swarm finds the valley and goes on as the walker, "
     "16 candidates a round, as a swarm's (a lone bacterium's rounds of one before: 45% "
     "of the evaluations, 0.13x pycma's rate). The search's state is tensors only, so that "
     "`fb.save` takes it (writing its counters "
     "each round costs about 3% of the evaluations per second on these cheap losses), and "
     "each swarm reads its box from its state instead of rebuilding it every round (about "
     "7% more): 0.75x / 0.78x pycma's on the sphere / Rastrigin before both. A swarm's "
     "round leaves out the masked reproduction and dispersal where its step ends no cycle "
     "(the same runs): 0.84x / 0.90x / 1.08x pycma's on the sphere / Rastrigin / rotated "
     "ellipsoid before; 1.09-1.12x / 1.13-1.16x / 1.20-1.22x over three runs after."),
    ("eager_breakdown", "Where an eager update's time goes (CPU)",
     "`python benchmarks/eager_breakdown.py`: each part of an eager update timed alone on "
     "the inputs an update gives it, right after the update itself. The five evaluator "
     "calls are the largest part, and `vmap` is more than half of them: a loss written for "
     "a batch can be handed over without it (docs/concepts.md). The masked cycle events are "
     "what `fb.run` and the `torch.optim` shell leave out where no cycle ends. Parts are "
     "timed apart, so the same part can read a few hundredths apart between variants."),
    ("run_driver", "fb.run against a loop of opt.update (CPU)",
     "`python benchmarks/run_driver.py`: `fb.run` knows each update's step on the host, so "
     "where no reproduction cycle ends it calls the variant's update built without the "
     "masked cycle events (the same states, checked bit for bit in the table), which pays "
     "for `fb.run`'s own reading of the counters after each update."),
    ("distributed", "A population sharded across processes (CPU, gloo)",
     "`python benchmarks/distributed.py`: `fb.distributed.sharded()` on 1 and 2 processes "
     "of one thread each, against one process with 1 and 2 threads (docs/distributed.md)."),
]


def load(stem: str) -> dict | None:
    path = RESULTS / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(stem: str) -> list[str]:
    """The Markdown a script wrote, without its title line."""
    lines = (RESULTS / f"{stem}.md").read_text().splitlines()
    return [line for line in lines[1:]]


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


def compile_tradeoff(results: dict[str, dict]) -> list[str]:
    """Compile time against the time it saves per update, from the overhead runs' records."""
    lines = ["| device | problem | variant | mode | compile s | eager ms | compiled ms | speedup "
             "| break-even updates |", "|---|---|---|---|---|---|---|---|---|"]
    for data in results.values():
        device = data["machine"].get("gpu", "CPU")
        for r in data["updates"]:
            for mode in ("compiled", "reduce-overhead"):
                if f"{mode}_ms" not in r:
                    continue
                eager, fast, cost = r["eager_ms"], r[f"{mode}_ms"], r[f"{mode}_compile_s"]
                saved = eager - fast
                even = f"{cost * 1e3 / saved:,.0f}" if saved > 0 else "never (slower)"
                lines.append(f"| {device} | {r['problem']} | {r['variant']} | {mode} | "
                             f"{cost:.1f} | {eager:.2f} | {fast:.2f} | {eager / fast:.2f}x | "
                             f"{even} |")
    return lines


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
    out = ["# Benchmarks", "",
           "Generated by `python benchmarks/report.py` from `benchmarks/results/`; what was "
           "tried to move each number, with predictions, is in `benchmarks/NOTES.md`. CPU "
           "numbers come from a noisy 2-core machine: compare within a table.", ""]
    for stem, heading, text in SECTIONS:
        if not (RESULTS / f"{stem}.md").exists():
            continue
        out += [f"## {heading}", "", text, ""]
        drawn = figures.get(stem, [])
        for figure in drawn if isinstance(drawn, list) else [drawn]:
            out += [f"![{heading}](figures/{figure})", ""]
        out += table(stem) + [""]
    if overhead:
        out += ["## Compile trade-off", "",
                "From the same overhead runs: `torch.compile` time against the time it saves "
                "per update; break-even = compile s / (eager ms - compiled ms). Compile times "
                "on the CPU are cold (the benchmarks turn inductor's caches off), as a first "
                "run pays them; the GPU rows were recorded before that, in one process whose "
                "earlier variants had already compiled, so a cold compile there costs more. "
                "This is why the adapters default to `compile=False`: it pays off only for "
                "long runs of cheap losses.", ""]
        out += compile_tradeoff(overhead) + [""]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(out).rstrip() + "\n")
    print(f"wrote docs/benchmarks.md and {len(figures)} figures")


if __name__ == "__main__":
    main()
