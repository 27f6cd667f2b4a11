"""Fit a numpy simulator through ask/tell: the optimizer proposes, the simulator scores.

The model is the Lotka–Volterra predator–prey system, integrated with numpy (RK4); the
loss is its log-error against noisy observations of a population with unknown rates. No
torch code touches the simulation: ``opt.ask(state)`` hands out candidate rates,
the simulator scores them, ``opt.tell`` takes the losses back.

    python examples/ask_tell_simulator.py                      # fit, print progress
    python examples/ask_tell_simulator.py --crash-after 20     # dies between ask and tell
    python examples/ask_tell_simulator.py --resume             # goes on from the checkpoint
    torchrun --standalone --nproc-per-node=2 examples/ask_tell_simulator.py   # sharded

The state is saved after every ``ask`` (the candidates are a pure function of it), so a run
killed while its simulations run resumes where it stopped and ends exactly where an
uninterrupted run ends. Under torchrun every rank holds the same state, simulates its share
of the candidates, and the losses are summed across ranks (each rank fills only its
rows), so any number of processes prints the numbers one prints.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib

import numpy as np
import torch
import torch.distributed as dist

import functional_bfo as fb

TRUE_RATES = np.array([1.1, 0.4, 0.4, 0.1])  # prey growth, predation, predator death, gain
TIMES = np.linspace(0.0, 15.0, 61)


def simulate(rates: np.ndarray, start=(10.0, 5.0), substeps: int = 8) -> np.ndarray:
    """Prey and predators at ``TIMES`` for each row of ``rates`` (n, 4): (n, len(TIMES), 2)."""
    a, b, c, d = (rates[:, i:i + 1] for i in range(4))

    def slope(z):
        prey, pred = z[..., 0], z[..., 1]
        return np.stack([a[:, 0] * prey - b[:, 0] * prey * pred,
                         d[:, 0] * prey * pred - c[:, 0] * pred], axis=-1)

    z = np.tile(np.asarray(start, dtype=np.float64), (len(rates), 1))
    out = [z]
    h = (TIMES[1] - TIMES[0]) / substeps
    for _ in range(len(TIMES) - 1):
        for _ in range(substeps):
            k1 = slope(z)
            k2 = slope(z + h / 2 * k1)
            k3 = slope(z + h / 2 * k2)
            k4 = slope(z + h * k3)
            z = np.clip(z + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), 1e-9, 1e9)
        out.append(z)
    return np.stack(out, axis=1)


def observations() -> np.ndarray:
    noise = np.random.default_rng(0).lognormal(0.0, 0.05, size=(len(TIMES), 2))
    return simulate(TRUE_RATES[None])[0] * noise


def losses_of(rates: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Mean squared log-error of each candidate's trajectory (NaN where it blew up)."""
    with np.errstate(all="ignore"):
        return np.mean((np.log(simulate(rates)) - np.log(observed)) ** 2, axis=(1, 2))


def main(rounds: int = 100, checkpoint: str = "ask_tell_simulator.pt", resume: bool = False,
         crash_after: int | None = None) -> float:
    launched = "RANK" in os.environ  # by torchrun
    if launched:
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=2))
    rank, world = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)
    observed = observations()

    opt = fb.adaptive_bfo(population_size=24, bounds=(0.01, 2.0), step_size=0.1,
                          relative_steps=True)
    state = opt.init({"rates": torch.full((4,), 0.5, dtype=torch.float64)},
                     key=fb.random.key(0))
    path = pathlib.Path(checkpoint)
    if resume and path.exists():
        state = fb.load(path, like=state)
        if rank == 0:
            print(f"resumed at round {int(state.step)} ({int(state.num_evals)} evaluations)")

    while int(state.step) < rounds:
        asked = opt.ask(state)
        if rank == 0:
            fb.save(state, path)  # the round's candidates are a function of this state
        if launched:
            dist.barrier()  # saved before anyone starts its share
        if crash_after is not None and int(state.step) == crash_after:
            raise SystemExit(f"crashed while simulating round {crash_after}; run again with "
                             "--resume")
        needed = np.flatnonzero(asked.mask.numpy())[rank::world]
        rates = asked.params["rates"].numpy()
        losses = np.zeros(len(rates))
        losses[needed] = losses_of(rates[needed], observed)
        losses = torch.from_numpy(losses)
        if launched:
            dist.all_reduce(losses)  # each rank filled its rows, zeros elsewhere: exact
        state = opt.tell(state, asked, losses)
        if rank == 0 and (int(state.step) % 10 == 0 or int(state.step) == rounds):
            print(f"round {int(state.step):3d}  evaluations {int(state.num_evals):5d}  "
                  f"best loss {float(state.best_loss):.6f}  ({world} process"
                  f"{'es' if world > 1 else ''})")
    if rank == 0:
        fb.save(state, path)
        fitted = ", ".join(f"{v:.3f}" for v in state.best_params["rates"].tolist())
        print(f"fitted rates {fitted}  (true {', '.join(f'{v:.3f}' for v in TRUE_RATES)})")
    if launched:
        dist.barrier()
        dist.destroy_process_group()
    return float(state.best_loss)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=100, help="updates (ask/tell rounds)")
    cli.add_argument("--checkpoint", default="ask_tell_simulator.pt")
    cli.add_argument("--resume", action="store_true", help="go on from the checkpoint")
    cli.add_argument("--crash-after", type=int, help="die between ask and tell of this round")
    args = cli.parse_args()
    main(args.rounds, args.checkpoint, args.resume, args.crash_after)
