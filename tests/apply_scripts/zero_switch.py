"""Two gloo ranks training a DDP model with AdamW, StepLR and gradient clipping, switched live to
a ZeRO stage (and optionally back) through the applier, as the executor would at a step boundary.

``scenario`` is ``name[:stage[:model]]`` (stage 1 by default; model ``mlp`` is examples/ddp.py's
residual MLP, else a small Sequential). Names: ``none`` (undisturbed), ``switch`` (the stage from
step 5 on), ``switch_revert`` (applied at step 5, reverted at step 12), ``revert_before_step``
(applied and reverted at the same boundary, as after a failed vote), ``restage`` (2 or 3 at
step 5, the other one at step 8 by ``set_reshard_after_forward``, that reverted at step 10, all
reverted at step 12), ``eval_revert`` (as ``switch_revert``, with an evaluation forward under
``no_grad`` just before the revert), ``joint_revert`` (as ``switch_revert``, with two blocks
checkpointed in the same joint plan), ``offload_joint`` and ``offload_joint_revert`` (the stage and
optimizer-state offload as one joint plan, kept, or reverted at step 12), ``blocks_joint`` and
``blocks_joint_revert`` (the same with one block offloaded and one checkpointed too), ``executor_fail_on_1`` (the real executor applies it at step 5 on both
ranks; on rank 1 the switch raises: both ranks must revert and train on). Each rank writes
``rank<r>.json``: losses, final parameters, and the bytes it holds after the switch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeContext  # noqa: E402
from recommendations import wire  # noqa: E402

from advisor.apply import registry  # noqa: E402
from advisor.apply.executor import Executor  # noqa: E402
from advisor.apply.remedies._fsdp_switch import reshard_after_forward_of  # noqa: E402
from advisor.apply.remedies.activation_checkpointing import is_checkpointed  # noqa: E402
from advisor.apply.remedies.joint_plan import apply_joint_plan  # noqa: E402
from advisor.apply.remedies.zero import apply_zero  # noqa: E402
from advisor.apply.target import Target  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402

STEPS = 20
AT_STEP = 5
REVERT_AT = 12
RESTAGE_AT = 8


def model_inputs(model: torch.nn.Module) -> int:
    return next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features


def example_mlp() -> torch.nn.Module:
    """examples/ddp.py's model (loaded from its file: examples/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_ddp", ROOT / "examples" / "ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MLP(16, 32, 3)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(local(v).numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def worker(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    scenario, _, rest = scenario.partition(":")
    stage_text, _, model_name = rest.partition(":")
    stage = int(stage_text or 1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        if model_name == "mlp":  # examples/ddp.py's residual MLP: LayerNorms, blocks in a ModuleList
            model = example_mlp()
        else:
            model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 32),
                                        torch.nn.Tanh(), torch.nn.Linear(32, 1))
        shapes = [list(p.shape) for p in model.parameters()]
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=0.01, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        target = Target(wrapped_models=[ddp], optimizers=[opt], lr_schedulers=[sched], wrappers=[ddp],
                        rank=rank, world_size=world)
        gen = torch.Generator().manual_seed(100 + rank)
        losses, handle, info = [], None, {}
        executor = None
        if scenario == "executor_fail_on_1":
            ctx = FakeContext([ddp], [opt], rank=rank, world_size=world, settings=AgentSettings(apply_agree_timeout_s=20))
            executor = Executor(ctx)
            if rank == 1:
                def failing(target, *, stage):  # fails half-way: after a real switch, before returning
                    apply_zero(target, stage=stage).revert()
                    raise RuntimeError("injected failure in the ZeRO switch on rank 1")
                registry.register("zero", failing, replace=True)
        for i in range(STEPS):
            if executor is not None:
                ctx.step = i
                if i == 1:
                    executor.submit({"type": "apply", "at_step": AT_STEP, "measure_steps": 2,
                                     "recommendation": wire(f"zero-{stage}", "zero", params={"stage": stage})})
                executor.on_boundary(i)
            if scenario in ("switch", "switch_revert", "revert_before_step", "restage", "eval_revert") and i == AT_STEP:
                handle = apply_zero(target, stage=stage)
                if stage == 1:
                    info["owners"] = handle.owners
                    info["owned_param_bytes"] = sum(p.numel() * p.element_size() for p in handle.owned(handle.rank))
                if scenario == "revert_before_step":
                    handle.revert()
            if scenario == "restage" and i == RESTAGE_AT:
                restage = apply_zero(target, stage=5 - stage)  # 3 -> 2 or 2 -> 3 on the sharded model
                info["reshard_after_restage"] = reshard_after_forward_of(model)
            if scenario == "restage" and i == RESTAGE_AT + 2:
                restage.revert()
                info["reshard_after_restage_revert"] = reshard_after_forward_of(model)
            if scenario == "eval_revert" and i == REVERT_AT:
                with torch.no_grad():  # an evaluation forward at the boundary: under ZeRO-2 it leaves
                    ddp(torch.randn(8, model_inputs(model), generator=torch.Generator().manual_seed(7)))  # gathered params
            if scenario == "joint_revert" and i == AT_STEP:  # checkpointing and the stage as one unit
                handle = apply_joint_plan(target, parts=[
                    {"remedy": "zero", "params": {"stage": stage}},
                    {"remedy": "activation_checkpointing", "params": {"modules": ["layers.0", "layers.2"]}}])
                info["order"] = list(handle.remedies)
                info["checkpointed_in_force"] = [is_checkpointed(b) for b in model.layers]
            if scenario in ("offload_joint", "offload_joint_revert") and i == AT_STEP:  # the stage and the state offload
                handle = apply_joint_plan(target, parts=[
                    {"remedy": "zero", "params": {"stage": stage}},
                    {"remedy": "optimizer_offload", "params": {"optimizers": None}}])
                info["order"] = list(handle.remedies)
            if scenario in ("blocks_joint", "blocks_joint_revert") and i == AT_STEP:  # every part kind at once
                handle = apply_joint_plan(target, parts=[
                    {"remedy": "optimizer_offload", "params": {"optimizers": None}},
                    {"remedy": "zero", "params": {"stage": stage}},
                    {"remedy": "activation_offload", "params": {"modules": ["layers.0"], "checkpoint": ["layers.1"],
                                                                "min_bytes": 0}}])
                info["order"] = list(handle.remedies)
            if scenario in ("switch_revert", "restage", "eval_revert", "joint_revert", "offload_joint_revert",
                            "blocks_joint_revert") and i == REVERT_AT:
                handle.revert()
                info["state_bytes_after_revert"] = state_bytes(opt)
                info["checkpointed_after_revert"] = [is_checkpointed(m) for m in model.modules()].count(True)
            x = torch.randn(8, 16, generator=gen)
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if executor is not None:
                executor.on_step_end(StepSample(index=i, rank=rank, time_s=0.1, deep=False))
            if scenario in ("blocks_joint", "blocks_joint_revert") and i == AT_STEP:  # after the step
                info["activation_offloaded_bytes"] = handle.handles[0].offloaded_bytes
            if scenario in ("offload_joint", "offload_joint_revert") and i == AT_STEP:  # after the step
                placement = handle.handles[-1].placements[0]
                held = [(p, k, v) for p, s in opt.state.items() for k, v in s.items() if torch.is_tensor(v) and v.dim()]
                info["held_by_offload"] = bool(held) and all(placement.host.get((p, k)) is v for p, k, v in held)
                info["state_types"] = sorted({type(v).__name__ for _, _, v in held})
                info["host_bytes"] = handle.handles[-1].host_bytes
            if scenario == "switch" and i == AT_STEP:
                info["state_bytes_after_switch"] = state_bytes(opt)
                if stage > 1:  # the gradients of this step are still there (zero_grad comes first)
                    info["param_bytes_after_switch"] = sum(local(p).numel() * p.element_size() for p in model.parameters())
                    info["grad_bytes_after_switch"] = sum(local(p.grad).numel() * p.grad.element_size()
                                                          for p in model.parameters() if p.grad is not None)
                    info["old_storage_bytes"] = sum(o.param.untyped_storage().nbytes() for o in handle.originals)
                    info["reshard_after_forward"] = reshard_after_forward_of(model)
        if executor is not None:
            executor.close()
            info["results"] = [r.to_dict() for r in executor.results]
        info["state_bytes_end"] = state_bytes(opt)
        info["full_state_bytes"] = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
        info["params"] = [full(p.detach()).reshape(-1).tolist() for p in model.parameters()]
        info["shapes"] = shapes
        info["sharded_at_end"] = any(isinstance(p, DTensor) for p in model.parameters())
        Path(out, f"rank{rank}.json").write_text(json.dumps({"losses": losses, **info}))
    finally:
        dist.destroy_process_group()
