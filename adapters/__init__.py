"""The stateful world: torch.optim-style BFO optimizers (coming with the adapters issue)."""
