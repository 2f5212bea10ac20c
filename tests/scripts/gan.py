"""A DCGAN-like loop: two models that both hold a ``main`` Sequential (so both have a
``main.3``), two Adam optimizers and three ``backward()`` calls per iteration (real, fake,
generator), with a BCELoss module.

Prints ``step N loss X`` with X = errD + errG per iteration, and ``done G steps K``.
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
torch.manual_seed(999)
NZ, NX = 8, 16


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(NZ, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, NX), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(NX, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.BatchNorm1d(32),
                                  nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


netG, netD = Generator(), Discriminator()
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real_data = torch.randn(256, NX).tanh()
g_steps = 0
for step in range(args.steps):
    real = real_data[(step * 16) % 256:(step * 16) % 256 + 16]
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(16))
    errD_real.backward()
    fake = netG(torch.randn(16, NZ))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(16))
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(16))
    errG.backward()
    optimizerG.step()
    g_steps += 1
    print(f"step {step} loss {errD_real.item() + errD_fake.item() + errG.item()!r}", flush=True)
print(f"done G steps {g_steps}", flush=True)
