"""AdaptiveBFO's vmapped fast path, with a torch.optim learning-rate scheduler.

``step(loss_fn=...)`` evaluates the whole population at once with
``torch.func.functional_call`` under ``vmap`` (no Python per candidate); built from
``named_parameters()``, the loss function receives ``{name: tensor}``. ``StepLR`` drives the
step-size ceiling through the ``lr`` alias. Stops early on a target loss.

    python examples/adapter_adaptive.py
"""

import argparse

import torch
from torch import nn

from functional_bfo.adapters import AdaptiveBFO


def main(steps: int = 150) -> float:
    torch.manual_seed(0)
    x = torch.linspace(-3, 3, 256).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn_like(x)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = AdaptiveBFO(model.named_parameters(), population_size=64, seed=0,
                            target_loss=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)

    def loss_fn(params):
        return nn.functional.mse_loss(torch.func.functional_call(model, params, (x,)), y)

    for step in range(steps):
        loss = optimizer.step(loss_fn=loss_fn)
        scheduler.step()
        if step % 25 == 0 or optimizer.should_stop:
            cap = optimizer.param_groups[0]["lr"]  # the scheduler's value
            print(f"step {step:3d}  mse {loss:.4f}  step-size cap {cap:.3f}"
                  f"  diversity {optimizer.metrics()['diversity']:.3f}")
        if optimizer.should_stop:
            print(f"stopped: {optimizer.stop_reason}")
            break
    return loss


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    main(parser.parse_args().steps)
