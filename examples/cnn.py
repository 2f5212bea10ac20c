"""A small ResNet (BasicBlock stages, BatchNorm, ReLU) on synthetic 3x32x32 images.

A plain training script: argparse, a model, SGD with momentum, a loop. It prints
one line per optimizer step, ``step N loss X`` with X the repr of the Python
float, so two runs can be compared exactly.

    python examples/cnn.py                                    # fast on CPU
    python examples/cnn.py --width 64 --blocks 2 --batch 256 --device cuda   # ResNet-18-like

The network is CIFAR-style: a 3x3 stem, three stages of ``--blocks`` BasicBlocks
with ``width``, ``2*width`` and ``4*width`` channels (stride 2 between stages),
global average pooling and a linear classifier over 10 classes. The labels are
a fixed function of the images (the sign of a random projection, bucketed), so
the loss can fall.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 10


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 2, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        stages = []
        cin = width
        for i, cout in enumerate([width, 2 * width, 4 * width]):
            layers = [BasicBlock(cin if j == 0 else cout, cout, 2 if (i > 0 and j == 0) else 1)
                      for j in range(blocks)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def synthetic_batch(gen: torch.Generator, projection: torch.Tensor, batch: int):
    images = torch.randn(batch, 3, 32, 32, generator=gen)
    # A fixed, learnable labelling: bucket a random projection of the mean colour image.
    score = images.mean(dim=(2, 3)) @ projection
    labels = torch.bucketize(score, torch.linspace(-1.5, 1.5, NUM_CLASSES - 1))
    return images, labels


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--blocks", type=int, default=2, help="BasicBlocks per stage")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 means autocast on CUDA; parameters stay fp32")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)

    model = ResNet(args.width, args.blocks).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(args.seed)
    projection = torch.randn(3, generator=gen) * 8.0

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                if args.dtype == "bfloat16" else contextlib.nullcontext())

    model.train()
    for step in range(args.steps):
        images, labels = synthetic_batch(gen, projection, args.batch)
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast:
            loss = F.cross_entropy(model(images).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
