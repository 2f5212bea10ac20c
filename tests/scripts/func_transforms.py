"""A critic trained with a gradient penalty (``torch.autograd.grad(create_graph=True)``), a
Jacobian penalty from ``torch.func.jacrev`` and per-sample gradient norms from
``torch.func.vmap(torch.func.grad(...))`` in every step, over a chain of numbered blocks.

``torch.func``'s grad, vjp, jacrev and hessian refuse to run under saved-tensor hooks; under attach
this died at the first deep step ("don't yet support saved tensor hooks") until the probes' hooks
stepped aside for them (advisor/probes/saved_hooks.py). Prints ``step N loss X`` per step.
"""

import argparse

import torch
import torch.nn as nn
from torch.func import functional_call, grad, jacrev, vmap

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.9))
gen = torch.Generator().manual_seed(0)


def one(params, x):
    return functional_call(critic, params, (x.unsqueeze(0),)).sum()


for step in range(args.steps):
    real = torch.randn(16, 8, generator=gen)
    fake = torch.randn(16, 8, generator=gen) + 1
    eps = torch.rand(16, 1, generator=gen)
    mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
    penalty_grad, = torch.autograd.grad(critic(mix).sum(), mix, create_graph=True)
    gp = ((penalty_grad.norm(2, dim=1) - 1) ** 2).mean()
    jac = jacrev(lambda x: critic(x).sum())(real[:4])  # d critic / d input, through torch.func
    params = {k: v.detach() for k, v in critic.named_parameters()}
    per_sample = vmap(grad(one), in_dims=(None, 0))(params, real[:4])
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_sample.values()]).sum(0)
    loss = critic(fake).mean() - critic(real).mean() + 10 * gp + 0.1 * jac.pow(2).mean() + 0.0 * norms.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
