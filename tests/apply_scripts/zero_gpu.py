"""ZeRO-2/3 switched live on NCCL ranks (one per visible GPU, at most 2), for tests/test_zero_gpu.py.

Each rank trains examples/ddp.py's residual MLP under DDP with AdamW for ``STEPS`` steps; in the
``switch`` scenario the FSDP2 switch happens at step ``AT_STEP``. One rank alone cannot take
``apply_zero`` (ZeRO needs a data-parallel degree above 1), so with one GPU the switch goes
through ``shard_ddp`` itself, the same code on a 1-rank mesh.

The ``joint`` scenario switches the same stage as part of a joint plan (issue 33): at stage 2 with
the optimizer-state offload after it (the state shard on the host between steps), at stage 3 with
two blocks checkpointed before it; in the order ``apply/remedies/joint_plan.py`` applies them.

Before the switch each rank measures what the predictor calibrates on: parameter, gradient and
optimizer-state bytes from the objects and the peak of a DDP step from
``torch.cuda.max_memory_allocated``; after it, the peak of the next steps. It writes
``rank<r>.json``: losses, those figures, and the stage's predicted peak (``zero_model``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from advisor.apply.remedies._fsdp_switch import blocks_of, shard_ddp  # noqa: E402
from advisor.apply.remedies.activation_checkpointing import apply_activation_checkpointing  # noqa: E402
from advisor.apply.remedies.joint_plan import apply_joint_plan  # noqa: E402
from advisor.apply.remedies.optimizer_offload import apply_optimizer_offload  # noqa: E402
from advisor.apply.remedies.zero import apply_zero  # noqa: E402
from advisor.apply.target import Target  # noqa: E402
from advisor.recommend.remedies.zero_model import Measured, stage_cost  # noqa: E402

STEPS = 12
AT_STEP = 5


def example_mlp(hidden: int, layers: int) -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_ddp", ROOT / "examples" / "ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MLP(64, hidden, layers)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def worker(rank: int, world: int, port: int, scenario: str, stage: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the same fp32 kernels in both runs
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    try:
        torch.manual_seed(0)
        model = example_mlp(1024, 4).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        gen = torch.Generator(device=device).manual_seed(100 + rank)
        losses, info = [], {}
        handle = None
        for i in range(STEPS):
            if scenario in ("switch", "joint") and i == AT_STEP:
                p_bytes = nbytes(model.parameters())
                info["measured"] = dict(
                    world=world, peak_bytes=info.pop("ddp_peak"), parameter_bytes=p_bytes, gradient_bytes=p_bytes,
                    optimizer_state_bytes=nbytes(v for s in opt.state.values() for v in s.values()
                                                 if isinstance(v, torch.Tensor)),
                    largest_parameter_bytes=max(p.numel() * p.element_size() for p in model.parameters()),
                    largest_unit_bytes=max(nbytes(b.parameters()) for b in blocks_of(model)),
                    step_time_s=None, optimizer_s=0.0, busbw=None, comm_s=None, exposed_s=None,
                    grad_bytes_reduced=None)
                group = dist.group.WORLD
                target = Target(wrapped_models=[ddp], optimizers=[opt], wrappers=[ddp])
                ckpt = {"modules": ["layers.0", "layers.2"]}
                if scenario == "joint" and world > 1:
                    extra = ({"remedy": "optimizer_offload", "params": {"optimizers": None}} if stage == 2
                             else {"remedy": "activation_checkpointing", "params": ckpt})
                    handle = apply_joint_plan(target, parts=[{"remedy": "zero", "params": {"stage": stage}}, extra])
                elif world > 1:
                    handle = apply_zero(target, stage=stage)
                else:  # one rank: the plan's order by hand, the stage through shard_ddp
                    parts = [apply_activation_checkpointing(model, **ckpt)] if scenario == "joint" and stage == 3 else []
                    parts.append(shard_ddp(ddp, opt, group, stage=stage))
                    if scenario == "joint" and stage == 2:
                        parts.append(apply_optimizer_offload(target))
                    handle = parts[-1]
                for part in parts if world == 1 else [handle]:
                    getattr(part, "commit", lambda: None)()
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            if i == AT_STEP - 1:
                torch.cuda.reset_peak_memory_stats(device)
            x = torch.randn(32, 64, device=device, generator=gen)
            loss = ddp(x).square().mean()
            if i == AT_STEP + 1:  # what the forward saved for backward, with the model states
                info["allocated_after_forward"] = torch.cuda.memory_allocated(device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if i == AT_STEP - 1:
                info["ddp_peak"] = torch.cuda.max_memory_allocated(device)
            if i == AT_STEP:  # between steps: where the state is, what the device holds
                held = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()]
                info["state_devices"] = sorted({getattr(v, "to_local", lambda: v)().device.type for v in held})
                torch.cuda.synchronize(device)
                info["allocated_between"] = torch.cuda.memory_allocated(device)
        if scenario in ("switch", "joint"):
            info["switched_peak"] = torch.cuda.max_memory_allocated(device)
            info["predicted_peak"] = stage_cost(Measured(**info["measured"]), stage).peak_bytes
        Path(out, f"rank{rank}.json").write_text(json.dumps({"losses": losses, **info}))
    finally:
        dist.barrier()
        dist.destroy_process_group()
