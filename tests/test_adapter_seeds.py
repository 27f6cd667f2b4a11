"""The integration guide's loops (shared/seeds/002) run with the import line changed, and
lines docs/adapters.md's migration table names, each marked "migration table".

Each test body is the guide's snippet; the names it assumes (model, data, criterion, ...) are
defined around it. Snippets that need a package we do not install skip when it is absent.
"""

import math

import pytest
import torch
import torch.nn as nn

from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO


@pytest.fixture
def problem():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    data, target = torch.randn(64, 8), torch.randn(64, 1)
    return model, data, target, nn.MSELoss()


def test_data_parallel_loop(problem):
    model, data, target, criterion = problem
    if torch.cuda.is_available():  # DataParallel runs on GPU 0 when there is one
        model, data, target = model.cuda(), data.cuda(), target.cuda()
    # Wrap model in DataParallel
    model = nn.DataParallel(model)
    optimizer = BFO(model.parameters(), population_size=50)

    # Training remains the same
    def closure():
        output = model(data)
        loss = criterion(output, target)
        return loss.item()

    optimizer.step(closure)
    assert optimizer.best_fitness <= criterion(model(data), target).item() + 1e-6


def test_gradient_accumulation_loop(problem):
    model, _, _, criterion = problem
    batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
    data_iter = iter(batches * 1000)

    accumulation_steps = 4
    optimizer = BFO(model.parameters())

    def accumulated_closure():
        total_loss = 0

        for i in range(accumulation_steps):
            # Get mini-batch
            data, target = next(data_iter)

            with torch.no_grad():
                output = model(data)
                loss = criterion(output, target) / accumulation_steps
                total_loss += loss.item()

        return total_loss

    losses = []
    for step in range(8):
        # Step every accumulation_steps
        if step % accumulation_steps == 0:
            loss = optimizer.step(accumulated_closure)
            losses.append(loss)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_monitoring_subclass_and_metrics_tracker(problem, monkeypatch):
    """The TensorBoard subclass (with a stand-in writer) and the MetricsTracker."""
    model, data, target, criterion = problem

    class Writer:  # SummaryWriter's two methods the snippet uses
        def __init__(self):
            self.scalars, self.histograms = [], []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, float(value), step))

        def add_histogram(self, tag, values, step):
            self.histograms.append((tag, values.shape, step))

    writer = Writer()

    class MonitoredBFO(BFO):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.step_count = 0

        def step(self, closure):
            # Regular step
            loss = super().step(closure)

            # Log metrics
            writer.add_scalar('Loss/train', loss, self.step_count)
            writer.add_scalar('BFO/best_fitness', self.best_fitness, self.step_count)
            writer.add_scalar('BFO/population_diversity',
                              self._compute_diversity(), self.step_count)

            # Log population distribution
            if self.step_count % 100 == 0:
                writer.add_histogram('BFO/population',
                                     self.population.flatten(), self.step_count)

            self.step_count += 1
            return loss

    optimizer = MonitoredBFO(model.parameters())

    def closure():
        return criterion(model(data), target).item()

    class MetricsTracker:
        def __init__(self):
            self.metrics = {
                'losses': [],
                'diversities': [],
                'step_sizes': [],
                'convergence_rate': []
            }

        def update(self, optimizer, loss):
            self.metrics['losses'].append(loss)
            self.metrics['diversities'].append(optimizer._compute_diversity())
            self.metrics['step_sizes'].append(optimizer.param_groups[0]['lr'])  # migration table

            # Calculate convergence rate
            if len(self.metrics['losses']) > 10:
                recent = self.metrics['losses'][-10:]
                rate = (recent[0] - recent[-1]) / (recent[0] + 1e-8)
                self.metrics['convergence_rate'].append(rate)

    for _ in range(3):
        optimizer.step(closure)
    n_params = sum(p.numel() for p in model.parameters())
    assert len(writer.scalars) == 9 and writer.histograms[0][1] == (50 * n_params,)

    # The tracker reads the step-size ceiling, which the adaptive variants have.
    optimizer = AdaptiveBFO(model.parameters())
    tracker = MetricsTracker()
    for step in range(12):
        loss = optimizer.step(closure)
        tracker.update(optimizer, loss)
    assert len(tracker.metrics['convergence_rate']) == 2
    assert tracker.metrics['losses'][-1] <= tracker.metrics['losses'][0]


def test_production_save_and_load(problem, tmp_path):
    model, data, target, criterion = problem
    optimizer = HybridBFO(model.parameters(), population_size=20, gradient_weight=0.5)

    def closure():
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        return loss.item()

    for _ in range(3):
        optimizer.step(closure)

    # Save trained model with BFO metadata
    def save_bfo_model(model, optimizer, path):
        torch.save({
            'model_state_dict': model.state_dict(),
            'optimizer_state_dict': optimizer.state_dict(),
            'optimizer_config': {
                'population_size': optimizer.defaults['population_size'],
                'best_fitness': optimizer.best_fitness,
                'best_params': optimizer.best_params
            }
        }, path)

    # Load for inference
    def load_bfo_model(model_class, path):
        checkpoint = torch.load(path)
        model = model_class()
        model.load_state_dict(checkpoint['model_state_dict'])
        model.eval()
        return model, checkpoint['optimizer_config']

    path = tmp_path / "model.pth"
    save_bfo_model(model, optimizer, path)

    def MyModel():
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    loaded, config = load_bfo_model(MyModel, path)
    assert config['population_size'] == 20
    with torch.no_grad():
        assert criterion(loaded(data), target).item() == pytest.approx(config['best_fitness'])


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning",
                            "ignore::UserWarning")  # Lightning's own, not ours
def test_lightning_module_manual_optimization():
    pl = pytest.importorskip("pytorch_lightning")

    class LitModel(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False  # the guide passes this to pl.Trainer (Lightning 1)
            self.losses = []
            self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            self.criterion = nn.MSELoss()

        def forward(self, x):
            return self.model(x)

        def configure_optimizers(self):
            # Use HybridBFO for gradient compatibility
            optimizer = HybridBFO(
                self.parameters(),
                population_size=20,
                gradient_weight=0.5
            )
            return optimizer

        def training_step(self, batch, batch_idx):
            x, y = batch

            # Custom closure for BFO
            def closure():
                self.zero_grad()
                y_hat = self(x)
                loss = self.criterion(y_hat, y)
                self.manual_backward(loss)
                return loss.item()

            # Manual optimization
            opt = self.optimizers()
            loss_val = opt.step(closure)

            # Logging
            self.log('train_loss', loss_val)
            self.losses.append(loss_val)
            # The guide returns {'loss': loss_val}; Lightning 2 wants a tensor or nothing
            # there in manual optimization, whatever the optimizer, so this returns nothing.

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    module = LitModel()
    trainer.fit(module, loader)
    assert len(module.losses) == 2 and all(math.isfinite(x) for x in module.losses)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the AMP loop needs CUDA")
def test_mixed_precision_loop_without_unscale(problem):
    """The AMP loop minus ``scaler.unscale_``, which GradScaler allows once per step while
    BFO calls the closure once per candidate (see docs/adapters.md)."""
    from torch.amp import GradScaler, autocast

    model, data, target, criterion = problem
    model, data, target = model.cuda(), data.cuda(), target.cuda()
    optimizer = HybridBFO(model.parameters())
    scaler = GradScaler("cuda")

    def amp_closure():
        optimizer.zero_grad()
        with autocast("cuda"):
            output = model(data)
            loss = criterion(output, target)
        scaler.scale(loss).backward()  # BFO only needs the gradient's direction
        return loss.item()

    first = optimizer.step(amp_closure)
    for _ in range(3):
        loss = optimizer.step(amp_closure)
    assert loss <= first
