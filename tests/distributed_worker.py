"""One rank of a multi-process test: ``python distributed_worker.py SCENARIO RANK WORLD DIR``.

Joins a gloo group through a file in DIR, runs the scenario, and saves what it saw to
``DIR/rank{RANK}.pt`` (tensors and plain values). ``tests/test_distributed.py`` launches the
ranks as separate processes, each under a hard timeout.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import optree
import torch
import torch.distributed as dist

import functional_bfo as fb

STEPS = 8
TIMEOUTS = {"stuck": 2}  # seconds the process group waits (else 20)
X = torch.linspace(-1.0, 1.0, 5)


def loss(params, x):
    return ((params["w"] - x) ** 2).sum() + torch.sin(3 * params["w"]).sum()


def optimizers(evaluator_of):
    """(name, optimizer, initial params) of every variant, with the given evaluator."""
    return [
        ("bfo", fb.bfo(population_size=7, swim_length=2, chemotaxis_steps=3,
                       evaluator=evaluator_of(False))),
        ("adaptive_bfo", fb.adaptive_bfo(population_size=7, min_population_size=2,
                                         chemotaxis_steps=2, stagnation_steps=1,
                                         evaluator=evaluator_of(False))),
        ("hybrid_bfo", fb.hybrid_bfo(population_size=7, grad_mask=True, chemotaxis_steps=3,
                                     evaluator=evaluator_of(True))),
    ]


def run_variants(evaluator_of, steps=STEPS, compiled=False):
    out = {}
    for name, opt in optimizers(evaluator_of):
        update = opt.update
        if compiled:  # Inductor lowers bfo's all_gather (the one hybrid's gradients take
            # too); the others are traced whole, collectives inside, by Dynamo and AOTAutograd.
            backend = "inductor" if name == "bfo" else "aot_eager"
            update = torch.compile(opt.update, fullgraph=True, backend=backend)
        state = opt.init({"w": torch.zeros(5)}, key=fb.random.key(3))
        for _ in range(steps):
            state = update(state, loss, X)
        out[name] = optree.tree_leaves(state)
    if compiled:
        return out
    result = fb.black_box(loss, {"w": torch.zeros(5)}, (-2.0, 2.0), X, max_evals=300,
                          key=fb.random.key(4), evaluator=evaluator_of(False))
    out["black_box"] = [result.loss, *optree.tree_leaves(result.params), result.num_evals,
                        result.restarts]
    return out


def sharded(grads):
    return fb.distributed.sharded(grads=grads)


def scenario_variants(rank, world, folder):
    return run_variants(sharded)


def scenario_data_parallel(rank, world, folder):
    torch.manual_seed(0)
    data = torch.randn(23, 5)  # every rank makes the same data and takes its own rows
    shard = data.tensor_split(world)[rank]

    def mean_loss(params, x):
        return ((x - params["w"]) ** 2).sum(dim=1).mean()

    evaluate = fb.distributed.data_parallel(weight=len(shard))
    population = {"w": torch.randn(6, 5, generator=torch.Generator().manual_seed(1))}
    losses = evaluate(mean_loss, population, shard)
    with_grads = fb.distributed.data_parallel(weight=len(shard), grads=True)
    _, grads = with_grads(mean_loss, population, shard)
    opt = fb.bfo(population_size=6, evaluator=evaluate)
    state = opt.init({"w": torch.zeros(5)}, key=fb.random.key(0))
    for _ in range(4):
        state = opt.update(state, mean_loss, shard)
    return {"losses": losses, "grads": grads["w"], "state": optree.tree_leaves(state)}


def rank_1_fault(rank, fault):
    """Updates whose loss calls ``fault()`` on rank 1's third call; what each rank saw."""
    calls = [0]

    def faulty(params, x):
        calls[0] += 1
        if rank == 1 and calls[0] == 3:
            fault()
        return loss(params, x)

    opt = fb.bfo(population_size=6, evaluator=fb.distributed.sharded())
    state = opt.init({"w": torch.zeros(5)}, key=fb.random.key(0))
    began = time.monotonic()
    try:
        for _ in range(STEPS):
            state = opt.update(state, faulty, X)
    except BaseException as e:
        return {"error": type(e).__name__, "message": str(e) + "".join(
            getattr(e, "__notes__", [])), "seconds": time.monotonic() - began}
    return {"error": None}


def scenario_failing(rank, world, folder):
    def raises():
        raise KeyError("rank 1's data loader ran dry")
    return rank_1_fault(rank, raises)


def scenario_killed(rank, world, folder):
    return rank_1_fault(rank, lambda: os.kill(os.getpid(), signal.SIGKILL))


def scenario_stuck(rank, world, folder):
    """Rank 1 hangs in its loss longer than the process group's timeout."""
    return rank_1_fault(rank, lambda: time.sleep(3 * TIMEOUTS["stuck"]))


def scenario_compiled(rank, world, folder):
    """The whole update compiled, collectives inside (fullgraph: no graph breaks)."""
    return run_variants(sharded, compiled=True)


def scenario_resume(rank, world, folder):
    """Continue the checkpoint in ``folder`` (if any) for 3 updates, then write it back."""
    opt = fb.adaptive_bfo(population_size=7, min_population_size=2, chemotaxis_steps=2,
                          stagnation_steps=1, evaluator=sharded(False))
    state = opt.init({"w": torch.zeros(5)}, key=fb.random.key(3))
    path = os.path.join(folder, "..", "checkpoint.pt")
    if os.path.exists(path):
        state = fb.load(path, like=state)
    for _ in range(3):
        state = opt.update(state, loss, X)
    dist.barrier()
    if rank == 0:
        fb.save(state, path)
    return {"state": optree.tree_leaves(state)}


def scenario_guide_ddp(rank, world, folder):
    """The integration guide's DDP loop, every rank broadcasting, with seed left to default."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from functional_bfo.adapters import BFO

    torch.manual_seed(rank)  # each rank's own default generator, as in a real launch
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 1)))
    data = torch.randn(16, 4, generator=torch.Generator().manual_seed(10 + rank))
    target = data.sum(dim=1, keepdim=True)
    optimizer = BFO(model.parameters(), population_size=6, swim_length=1)

    def closure():
        loss = torch.nn.functional.mse_loss(model(data), target)
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        loss /= world
        return loss.item()

    for _ in range(3):
        optimizer.step(closure)
        for param in model.parameters():
            dist.broadcast(param.data, src=0)
    return {"params": [p.detach().clone() for p in model.parameters()],
            "best": optimizer.best_fitness}


def scenario_adapters(rank, world, folder):
    """The shell with evaluator=: sharded (same data everywhere) and data-parallel (a DDP
    model, each rank its own batch, HybridBFO's backward averaged by DDP)."""
    from torch.func import functional_call
    from torch.nn.parallel import DistributedDataParallel as DDP

    from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO

    out = {}
    data = torch.randn(24, 4, generator=torch.Generator().manual_seed(5))
    target = data.sum(dim=1, keepdim=True)
    for cls in (BFO, AdaptiveBFO, HybridBFO):
        for path in ("closure", "fast"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                        torch.nn.Linear(8, 1))
            opt = cls(model.named_parameters(), population_size=5, swim_length=1, seed=1,
                      evaluator=fb.distributed.sharded())

            def closure(opt=opt, model=model):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(data), target)
                loss.backward()
                return loss

            def loss_fn(params, model=model):
                return torch.nn.functional.mse_loss(functional_call(model, params, (data,)),
                                                    target)

            for _ in range(3):
                opt.step(closure) if path == "closure" else opt.step(loss_fn=loss_fn)
            out[f"sharded-{cls.__name__}-{path}"] = [p.detach().clone()
                                                     for p in model.parameters()]
    shard = data.tensor_split(world)[rank]
    for cls in (BFO, HybridBFO):
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                        torch.nn.Linear(8, 1)))
        opt = cls(model.parameters(), population_size=5, swim_length=1, seed=1,
                  evaluator=fb.distributed.data_parallel(weight=len(shard)))

        def closure(opt=opt, model=model):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(shard), target.tensor_split(world)[rank])
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        out[f"data_parallel-{cls.__name__}"] = [p.detach().clone() for p in model.parameters()]
        out[f"data_parallel-{cls.__name__}-best"] = opt.best_fitness
    return out


def scenario_replicas(rank, world, folder):
    """Same key: the replicas agree. A key per rank: every rank says they drifted."""
    from functional_bfo.adapters import BFO

    out = {}
    opt = fb.bfo(population_size=6, evaluator=sharded(False))
    for name, key in (("same", fb.random.key(0)), ("own", fb.random.key(rank))):
        state = opt.update(opt.init({"w": torch.zeros(5)}, key=key), loss, X)
        try:
            fb.distributed.check_replicas(state)
            out[name] = None
        except RuntimeError as e:
            out[name] = str(e)
    w = torch.nn.Parameter(torch.zeros(5))
    shell = BFO([w], population_size=6, seed=rank)
    shell.step(lambda: float(loss({"w": w.detach()}, X)))
    try:
        fb.distributed.check_replicas(shell.state_dict()["state"])
        out["shell"] = None
    except RuntimeError as e:
        out["shell"] = str(e)
    return out


def scenario_disagreeing(rank, world, folder):
    """A key per rank: the candidates differ, and every reader says which ranks (the state
    records it in the losses' own collective); the same key: nothing is recorded."""
    from functional_bfo.adapters import HybridBFO

    def caught(fn):
        try:
            fn()
        except RuntimeError as e:
            return str(e)
        return None

    out = {}
    evaluators = {"sharded": lambda grads: fb.distributed.sharded(grads=grads),
                  "data_parallel": lambda grads: fb.distributed.data_parallel(grads=grads)}
    for how, evaluator_of in evaluators.items():
        for name, opt in optimizers(evaluator_of):
            for which, key in (("same", fb.random.key(0)), ("own", fb.random.key(rank))):
                state = opt.update(opt.init({"w": torch.zeros(5)}, key=key), loss, X)
                out[f"{how}-{name}-{which}-mask"] = int(fb.metrics(state)["disagreeing_ranks"])
                out[f"{how}-{name}-{which}-check"] = caught(
                    lambda s=state: fb.distributed.check_agreement(s))
                start = opt.init({"w": torch.zeros(5)}, key=key)
                out[f"{how}-{name}-{which}-run"] = caught(
                    lambda o=opt, s=start: fb.run(o, s, loss, X, max_steps=3))
    w = torch.nn.Parameter(torch.zeros(5))
    shell = HybridBFO([w], population_size=6, seed=rank, evaluator=fb.distributed.sharded())
    out["shell"] = caught(lambda: shell.step(loss_fn=lambda p: loss({"w": p[0]}, X)))
    out["shell_kept"] = torch.equal(w.detach(), torch.zeros(5))  # the step changed nothing
    for how, evaluator_of in evaluators.items():  # one key, then rank 1 alone edits its params
        v = torch.nn.Parameter(torch.zeros(5))
        shell = HybridBFO([v], population_size=6, seed=0, evaluator=evaluator_of(True))
        shell.step(loss_fn=lambda p: loss({"w": p[0]}, X))
        if rank == 1:
            with torch.no_grad():
                v.add_(1.0)
        out[f"shell_edited-{how}"] = caught(
            lambda s=shell: s.step(loss_fn=lambda p: loss({"w": p[0]}, X)))
    return out


def scenario_under_vmap(rank, world, folder):
    opt = fb.bfo(population_size=4, evaluator=sharded(False))
    keys = torch.stack([fb.random.key(0), fb.random.key(1)])
    init = torch.func.vmap(lambda k: opt.init({"w": torch.zeros(5)}, key=k))
    try:
        states = init(keys)
        torch.func.vmap(lambda s: opt.update(s, loss, X))(states)
    except BaseException as e:
        return {"error": type(e).__name__, "message": str(e) + "".join(
            getattr(e, "__notes__", []))}
    return {"error": None}


def main() -> None:
    scenario, rank, world, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUTS.get(scenario, 20)))
    result = globals()[f"scenario_{scenario}"](rank, world, folder)
    torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    if scenario not in ("failing", "killed", "stuck"):  # the other ranks are gone there
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
