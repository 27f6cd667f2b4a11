"""Every GPU measurement in one command: updates against the population, a peer, adapters, glue.

The three variants' updates on a shifted 30-D Rastrigin (swim length 4) at P = 256 to 65,536,
eager, compiled and with CUDA graphs, chained as a user runs them, against the floor (N_s + 1
vmapped evaluations of as many populations, run the same way), with GPU times, kernels and peak
memory; EvoX's compiled PSO (``pip install evox``); the adapters (``adapter_paths.bench``);
Lightning (bf16-mixed) and Transformers (fp16, a ``GradScaler``) steps. Rows run in order of
importance until ``--budget`` seconds have passed, the rest listed as skipped.

    python benchmarks/gpu.py [--quick] [--budget 480] [--only TEXT]
"""

from __future__ import annotations

import collections
import tempfile
import time
import traceback
import warnings

import optree
import torch
from common import compiled, median_ms, paired_ms, parse, peak_mb, profiled, table, timed, write
from peers import evox_pso
from problems import CYCLE, SWIM, cycle, evaluation, rastrigin_problem, started

import functional_bfo as fb

DEVICE = "cuda"
MODES = {"eager": "eager", "compiled": "compiled", "graphs": "reduce-overhead"}  # for compiled()


def update_row(variant: str, population: int, mode: str, repeats: int) -> dict:
    """One update of ``variant`` at ``population`` in ``mode`` against its floor."""
    problem = rastrigin_problem(30, DEVICE)
    loss = problem[1]
    opt, state = started(variant, population, problem)
    one = evaluation(variant, loss)
    candidates = fb.as_params(state, state.population)
    # Five different populations: of one population five times, inductor computes one.
    points = [optree.tree_map(lambda x, k=k: x + k / 64, candidates) for k in range(SWIM + 1)]
    torch.compiler.reset()
    evaluations = compiled(lambda ps: [one(p) for p in ps], MODES[mode])
    # CYCLE updates chained as a training loop runs them, each cycle's end copied in every mode.
    update = compiled(opt.update, MODES[mode])
    current: list = []  # each cycle's end
    chained = cycle(update, optree.tree_map(torch.clone, state), loss, clone=True, current=current)

    def floor():
        if mode == "graphs":  # its outputs are not read: the next replay may overwrite them
            torch.compiler.cudagraph_mark_step_begin()
        evaluations(points)

    _, compile_s = timed(lambda: (floor(), chained()), DEVICE)  # graphs record in 2nd calls
    floor_ms, ms, ratio = paired_ms(floor, chained, repeats, DEVICE, CYCLE)
    row = {"variant": variant, "population": population, "mode": mode, "ms": ms,
           "floor_ms": floor_ms, "over_floor": ratio, "compile_s": compile_s,
           "evals_per_s": population * (SWIM + 1) / (ms / 1e3)}
    if mode == "compiled":  # what the GPU itself spends, launches and guards left out
        row["gpu_us"], row["kernels"], row["longest"] = gpu_time(chained, CYCLE)
        row["floor_gpu_us"] = gpu_time(floor, 1)[0]
    if mode != "graphs":  # a graph's memory is its pool, held between replays
        held = sum(x.numel() * x.element_size() for x in optree.tree_leaves(candidates))
        row["peak_mb"] = peak_mb(lambda: update(state, loss), DEVICE)
        row["floor_peak_mb"] = held / 2**20 + peak_mb(lambda: one(candidates), DEVICE)
    row["best_loss"] = float(current[0].best_loss)
    return row


def gpu_time(fn, calls: int) -> tuple[float, float, list]:
    """Per call of ``calls`` in ``fn``: GPU time in us (its kernels' durations summed), the
    kernels launched, and the five longest kernels (name, us) by torch.profiler."""
    timed(fn, DEVICE)  # a first call, finished
    kernels = [e for e in profiled(fn, DEVICE) if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: collections.Counter = collections.Counter()
    for e in kernels:
        by_name[e.name[:48]] += e.time_range.elapsed_us() / calls
    return sum(by_name.values()), len(kernels) / calls, by_name.most_common(5)


def evox_row(population: int, repeats: int) -> dict:
    """EvoX's PSO step on the same function, compiled as EvoX documents it."""
    torch.compiler.reset()
    algorithm, workflow = evox_pso(population, 30, 0.5, DEVICE)
    step = torch.compile(workflow.step)
    _, compile_s = timed(step, DEVICE)

    ms = median_ms(lambda: [step() for _ in range(CYCLE)], repeats, DEVICE) / CYCLE
    return {"variant": "evox PSO", "population": population, "mode": "compiled", "ms": ms,
            "evals_per_s": population / (ms / 1e3), "compile_s": compile_s,
            "best_loss": float(algorithm.global_best_fit)}


def glue_rows(steps: int) -> list[dict]:
    """ms per training step through Lightning (bf16-mixed) and Transformers (fp16 + scaler)."""
    import lightning as L
    import transformers

    from functional_bfo.adapters import HybridBFO
    from functional_bfo.adapters.lightning import BFOCallback
    from functional_bfo.adapters.transformers import BFOTrainer

    torch.manual_seed(0)
    x = torch.randn(64 * steps, 32)
    y = x[:, :4].sum(1, keepdim=True)
    net = lambda: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),  # noqa: E731
                                      torch.nn.Linear(64, 1))

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return HybridBFO(self.parameters(), population_size=16, seed=0, module=self)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    rows = []
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder:
        warnings.simplefilter("ignore")
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
        module = Module()
        trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=1,
                            logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            enable_model_summary=False, callbacks=[BFOCallback()])
        _, seconds = timed(lambda: trainer.fit(module, loader), DEVICE)
        rows.append({"glue": "Lightning, bf16-mixed", "steps": steps,
                     "ms_per_step": 1e3 * seconds / steps,
                     "loss": float(trainer.callback_metrics["train_loss"])})
        model = Tiny().to(DEVICE)
        args = transformers.TrainingArguments(
            output_dir=folder, per_device_train_batch_size=64, max_steps=steps, fp16=True,
            save_strategy="no", report_to=[], seed=0, remove_unused_columns=False,
            disable_tqdm=True, logging_steps=steps)
        optimizer = HybridBFO(model.parameters(), population_size=16, seed=0, module=model)
        rows_of_data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
        hf = BFOTrainer(model=model, args=args, train_dataset=rows_of_data,
                        optimizers=(optimizer, None))
        _, seconds = timed(hf.train, DEVICE)
        rows.append({"glue": "Transformers, fp16 + GradScaler", "steps": steps,
                     "ms_per_step": 1e3 * seconds / steps,
                     "loss": [e["loss"] for e in hf.state.log_history if "loss" in e][-1],
                     "scaler": hf.accelerator.scaler is not None})
    return rows


def plan(quick: bool, only: str = "") -> list[tuple[str, tuple]]:
    """Every row, the targets' first; with ``only``, the rows whose name holds it."""
    big, small, others = 4096 if quick else 65536, 256, ("adaptive_bfo", "hybrid_bfo")

    def updates(variants, population):
        return [("update", (v, population, m)) for v in variants for m in MODES]

    rows = updates(["bfo"], big) + [("evox", (big,)), ("evox", (small,))] + updates(
        ["bfo"], small) + updates(others, big) + [("glue", ())]
    if not quick:
        rows += [("adapters", ())] + updates(others, small) + updates(["bfo"], 4096)
    return [(kind, what) for kind, what in rows if only in f"{kind} {what}"]


def markdown(result: dict) -> list[str]:
    m, updates = result["machine"], result["updates"]
    floor = ("5 vmapped evaluations of 5 populations in one function (with CUDA graphs, "
             "copying them in)" if result.get("floor") else "one population's vmapped "
             "evaluation 5 times in one function (compiled, inductor computes it once)")
    md = [f"# GPU: updates against the population, EvoX's PSO, adapters and glue "
          f"({'quick' if result['quick'] else 'full'} run)", "",
          f"Commit `{result['commit']}`, torch {m['torch']}, {m.get('gpu')}; "
          f"{result['seconds']:.0f} s.", "",
          "Shifted 30-D Rastrigin, swim length 4. ms per update over chained updates; the "
          f"floor is {floor}, run the same way; update / floor: the median of per-repeat "
          "ratios. Peak MB: one update above what was held (graphs: n/a). Compile s: the "
          "first calls in this process, whose later rows reuse kernels already built.", ""]
    md += table("variant | P | mode | ms / update | evaluations/s | floor ms | update / floor "
                "| peak MB | floor peak MB | compile s", [
                    [r["variant"], r["population"], r["mode"], f"{r['ms']:.3f}",
                     f"{r['evals_per_s']:,.0f}", f"{r['floor_ms']:.3f}", f"{r['over_floor']:.2f}",
                     f"{r['peak_mb']:.1f}" if "peak_mb" in r else "n/a",
                     f"{r['floor_peak_mb']:.1f}" if "peak_mb" in r else "n/a",
                     f"{r['compile_s']:.0f}"] for r in updates])
    if timed := [r for r in updates if "gpu_us" in r]:
        md += ["", "GPU time (compiled rows): the kernels' durations an update runs (launches "
               "and guards left out) against the floor's; kernels launched per update; the "
               "longest, us per update.", ""]
        md += table("variant | P | update GPU us | floor GPU us | ratio | kernels | longest", [
            [r["variant"], r["population"], f"{r['gpu_us']:.1f}", f"{r['floor_gpu_us']:.1f}",
             f"{r['gpu_us'] / r['floor_gpu_us']:.2f}", f"{r['kernels']:.0f}",
             "; ".join(f"`{name}` {us:.1f}" for name, us in r["longest"])] for r in timed])
    if result["peer"]:
        md += ["", "EvoX's PSO (one evaluation per particle per step), `workflow.step` compiled "
               "as EvoX documents it (with CUDA graphs its module-held state is overwritten by "
               "the next replay, and torch raises):", ""]
        md += table("peer | P | ms / step | evaluations/s | compile s", [
            [r["variant"], r["population"], f"{r['ms']:.3f}", f"{r['evals_per_s']:,.0f}",
             f"{r['compile_s']:.0f}"] for r in result["peer"]])
    if result["adapters"]:
        md += ["", "Adapters on an MLP 64-128-10 (256 samples, P = 64), ms per `step`:", ""]
        md += table("class | closure | fast eager | fast compiled | compile s", [
            [r["class"], f"{r['closure_ms']:.1f}", f"{r['fast_eager_ms']:.2f}",
             f"{r['fast_compiled_ms']:.2f}", f"{r['compile_s']:.0f}"]
            for r in result["adapters"]])
    if result["glue"]:
        md += ["", "Glue, `HybridBFO` (P = 16) on an MLP 32-64-1, batches of 64: ms per step of "
               "the whole `fit` / `train`, the framework's start-up included:", ""]
        md += table("glue | steps | ms / step | last loss", [
            [r["glue"], r["steps"], f"{r['ms_per_step']:.1f}", f"{r['loss']:.4f}"]
            for r in result["glue"]])
    if result["skipped"] or result["failed"]:
        md += ["", f"Skipped (past the budget): {result['skipped'] or 'none'}. "
               f"Failed: {result['failed'] or 'none'}."]
    return md


def main() -> None:
    args = parse(__doc__, ("--budget", {"type": float, "default": 480.0}), ("--only", {
        "default": "", "help": "the rows whose name holds this, e.g. \"'hybrid_bfo', 65536\""}),
        cpu=True)
    args.device = DEVICE
    if not torch.cuda.is_available():
        raise SystemExit("gpu.py needs a CUDA device.")
    repeats = 5 if args.quick else 15
    start = time.perf_counter()
    result: dict = {"floor": "5 populations", "updates": [], "peer": [], "adapters": [],
                    "glue": [], "skipped": [], "failed": []}
    for kind, what in plan(args.quick, args.only):
        if time.perf_counter() - start > args.budget:
            result["skipped"].append(f"{kind} {what}")
            continue
        try:
            if kind == "update":
                result["updates"].append(update_row(*what, repeats))
            elif kind == "evox":
                result["peer"].append(evox_row(*what, repeats))
            elif kind == "glue":
                result["glue"] = glue_rows(10 if args.quick else 30)
            else:
                from adapter_paths import BFO, AdaptiveBFO, HybridBFO, bench
                result["adapters"] = [bench(c, (64, 128, 10), 256, 64, 10, DEVICE)
                                      for c in (BFO, AdaptiveBFO, HybridBFO)]
        except Exception as e:  # a row that fails is reported, the others still run
            traceback.print_exc()
            result["failed"].append(f"{kind} {what}: {type(e).__name__}: {e}"[:300])
        print(f"[{time.perf_counter() - start:5.0f} s] {kind} {what}", flush=True)
    result["seconds"] = time.perf_counter() - start
    write(args, "gpu_only" if args.only else "gpu", result, markdown)


if __name__ == "__main__":
    main()
