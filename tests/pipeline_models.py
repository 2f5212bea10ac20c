"""Models and a training loop shared by the pipeline applier's tests and bench/pipeline.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import torch

import torch.nn.functional as F
from torch import nn

from advisor.apply.target import Target as ApplyTarget

ROOT = Path(__file__).resolve().parents[1]


def load_gpt() -> Any:
    """examples/gpt.py as a module (examples/ is not a package)."""
    name = "advisor_example_gpt"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "gpt.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def Target(model: nn.Module, optimizer: torch.optim.Optimizer) -> ApplyTarget:
    """What ``apply_pipeline`` reads, as the agent's capture would hold it: the model and its optimizer."""
    return ApplyTarget.of(model, [optimizer])


def train_gpt(
    steps: int,
    at_boundary: Callable[[int, Target], None] | None = None,
    *,
    layers: int = 4,
    hidden: int = 32,
    batch: int = 8,
    device: str = "cpu",
    seed: int = 0,
) -> list[float]:
    """The loop of examples/gpt.py; ``at_boundary(step, target)`` runs before each step."""
    gpt = load_gpt()
    torch.manual_seed(seed)
    cfg = gpt.GPTConfig(vocab=64, seq=16, layers=layers, hidden=hidden, heads=4)
    model = gpt.GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    target = Target(model, optimizer)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        if at_boundary is not None:
            at_boundary(step, target)
        x, y = gpt.synthetic_batch(gen, cfg, batch)
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, cfg.vocab), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_chain(model: nn.Module, steps: int, at_boundary: Callable[[int, Target], None] | None = None,
                *, batch: int = 8, width: int = 16, seed: int = 0) -> list[float]:
    """A regression loop over any model mapping (batch, width) to (batch, width)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = Target(model, optimizer)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        if at_boundary is not None:
            at_boundary(step, target)
        x = torch.randn(batch, width, generator=gen)
        loss = F.mse_loss(model(x), x.flip(1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


class MLPChain(nn.Module):
    """Blocks in a ModuleList called by a loop: ``residual`` breaks the chain (x = x + block(x)),
    ``mix`` puts a batch-coupling module in block 2, ``norm`` a module of the caller's in block 1."""

    def __init__(self, width: int = 16, blocks: int = 4, residual: bool = False, norm: nn.Module | None = None,
                 mix: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(blocks))
        if norm is not None:
            self.blocks[1].append(norm)
        if mix:
            self.blocks[2].append(Center())
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            y = block(x)
            x = x + y if self.residual else y
        return x


class Center(nn.Module):
    """Subtracts the batch mean: couples the samples, as no micro-batched block may."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)
