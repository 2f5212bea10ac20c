"""The bottleneck rules on hand-built profiles with exact figures: each fires on its evidence,
stays silent without it, and predicts the stated figure."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from advisor.recommend.advise import advise
from advisor.recommend.profile import ModuleProfile, Profile, RankPhases, profile_from_records
from advisor.recommend.rules import run
from advisor.records.events import DataLoaderSettings, DeviceSpec, Oom
from advisor.records.samples import CollectiveStat, OpStat, StepSample

GIB = 2**30
H100 = DeviceSpec(type="cuda", name="H100", memory_bandwidth=3.0e12,
                  peak_flops={"fp32": 60e12, "tf32": 480e12, "bf16": 960e12})
CPU = DeviceSpec(type="cpu")
# Each rule with its remedies' proposals, as advise() runs it.
communication_rule, compute_rule, fragmentation_rule, host_overhead_rule, input_rule, straggler_rule = (
    partial(run, name) for name in ("communication", "compute", "fragmentation", "host_overhead", "input", "straggler"))


def mm(step: int, *, flops: float, bytes: float, time_s: float, dtype: str = "float32",
       name: str = "aten.mm") -> OpStat:
    return OpStat(step=step, name=name, phase="forward", dtype=dtype, count=1, flops=int(flops),
                  bytes=int(bytes), time_s=time_s)


# --- compute ------------------------------------------------------------------------------------
def compute_profile(**kw) -> Profile:
    # One matmul per step: 48 TFLOP in 1 s is 80% of the 60 TFLOP/s fp32 roof (intensity 4800,
    # far above the ridge of 20), on two deep steps; the step takes 1.25 s.
    ops = tuple(mm(s, flops=48e12, bytes=1e10, time_s=1.0) for s in (2, 3))
    return Profile(peak_bytes=0, step_time_s=1.25, ops=ops, device=H100, **kw)


def test_compute_fires_and_predicts_each_precision_from_the_roofline() -> None:
    finding = compute_rule(compute_profile())
    assert finding is not None and finding.bottleneck == "compute"
    assert finding.severity == pytest.approx(0.8)
    by_id = {r.id: r for r in finding.recommendations}
    # tf32: roof 60 -> 480 TFLOP/s, bytes kept: t' = 1 s x 60/480 = 0.125 s, saves 0.875 s
    assert by_id["tf32-matmul"].predicted.step_time_s == pytest.approx(1.25 - 0.875)
    # bf16: roof 960 TFLOP/s (intensity doubles, still compute-bound): t' = 1/16 s, saves 0.9375 s
    assert by_id["autocast-bf16"].predicted.step_time_s == pytest.approx(1.25 - 0.9375)
    assert {r.apply_class for r in finding.recommendations} == {"live-opt-in"}


def test_compute_prediction_is_capped_by_the_memory_roof() -> None:
    # Intensity 100 FLOP/byte: fp32 roof 60 TFLOP/s (ridge 20); tf32 roof min(480, 100 x 3) = 300
    ops = tuple(mm(s, flops=48e12, bytes=48e10, time_s=1.0) for s in (2, 3))
    finding = compute_rule(Profile(peak_bytes=0, step_time_s=1.25, ops=ops, device=H100))
    tf32 = next(r for r in finding.recommendations if r.remedy == "tf32_matmul")
    assert tf32.predicted.step_time_s == pytest.approx(1.25 - (1 - 60 / 300))


@pytest.mark.parametrize("change", [
    {"device": replace(H100, type="cpu")},  # no tensor cores to move to
    {"device": replace(H100, peak_flops={"fp32": 60e12, "tf32": 90e12})},  # "tensor cores" under 2x fp32
    {"step_time_s": 4.0},  # matmuls 25% of the step: not dominant
])
def test_compute_silent_without_its_evidence(change) -> None:
    base = {"peak_bytes": 0, "step_time_s": 1.25, "device": H100,
            "ops": tuple(mm(s, flops=48e12, bytes=1e10, time_s=1.0) for s in (2, 3))}
    assert compute_rule(Profile(**{**base, **change})) is None


def test_compute_silent_far_below_the_roof_and_on_bf16_ops() -> None:
    slow = tuple(mm(s, flops=12e12, bytes=1e10, time_s=1.0) for s in (2, 3))  # 20 of 60 TFLOP/s
    assert compute_rule(Profile(peak_bytes=0, step_time_s=1.25, ops=slow, device=H100)) is None
    bf16 = tuple(mm(s, flops=48e12, bytes=1e10, time_s=1.0, dtype="bfloat16") for s in (2, 3))
    assert compute_rule(Profile(peak_bytes=0, step_time_s=1.25, ops=bf16, device=H100)) is None


# --- host overhead ------------------------------------------------------------------------------
def blocks() -> tuple[ModuleProfile, ...]:
    mods = [ModuleProfile(name="", type="GPT", depth=0), ModuleProfile(name="head", type="Linear", depth=1)]
    for i in range(3):
        mods += [ModuleProfile(name=f"blocks.{i}", type="Block", depth=2),
                 ModuleProfile(name=f"blocks.{i}.mlp", type="Linear", depth=3)]
    mods.append(ModuleProfile(name="blocks", type="ModuleList", depth=1))
    return tuple(mods)


DEEP = {0: (0.11, 0.01), 1: (0.11, 0.01), 2: (0.5, 0.1), 3: (0.5, 0.1)}  # index -> (time_s, data_s)


def test_host_overhead_fires_on_a_small_op_share_and_compiles_the_repeated_blocks() -> None:
    # Deep steps 2 and 3 take 0.5 s (0.1 s of it data wait) and their ops 0.1 s: 25% coverage.
    ops = tuple(mm(s, flops=1e6, bytes=1e6, time_s=0.1) for s in (2, 3))
    profile = Profile(peak_bytes=0, step_time_s=0.11, phases={"data_s": 0.01}, ops=ops, modules=blocks(),
                      device=CPU, step_times=DEEP)
    finding = host_overhead_rule(profile)
    assert finding is not None and finding.bottleneck == "launch_overhead"
    (rec,) = finding.recommendations  # CPU: no CUDA graphs
    assert rec.params == {"modules": ["blocks.0", "blocks.1", "blocks.2"]}
    # an ordinary step: 0.11 - 0.01 data = 0.1 s, 75% of it host gap = 0.075 s; compile recovers
    # half of it (assumed; the apply measures)
    assert rec.predicted.step_time_s == pytest.approx(0.11 - 0.0375)
    assert rec.apply_class == "live-equivalent"
    assert finding.severity == pytest.approx(0.075 / 0.11)


def test_host_overhead_on_cuda_adds_cuda_graphs_as_a_restart() -> None:
    ops = (mm(2, flops=1e6, bytes=1e6, time_s=0.02),)  # of a 0.1 s deep step: the GPU idles 80%
    finding = host_overhead_rule(Profile(peak_bytes=0, step_time_s=0.1, ops=ops, device=H100,
                                         step_times={2: (0.1, 0.0)}))
    graphs = next(r for r in finding.recommendations if r.remedy == "cuda_graphs")
    assert graphs.apply_class == "restart" and not graphs.live
    assert graphs.predicted.step_time_s == pytest.approx(0.1 - 0.9 * 0.08)
    assert any(p.startswith("change: ") for p in graphs.prerequisites)


def test_host_overhead_silent_when_the_ops_fill_the_step() -> None:
    ops = tuple(mm(s, flops=1e6, bytes=1e6, time_s=0.3) for s in (2, 3))  # 75% of the deep steps
    assert host_overhead_rule(Profile(peak_bytes=0, step_time_s=0.1, ops=ops, step_times=DEEP)) is None
    assert host_overhead_rule(Profile(peak_bytes=0, step_time_s=0.1, step_times=DEEP)) is None  # no ops
    # ops compared with light steps would look like 300% of the step; with no deep step known: silent
    assert host_overhead_rule(Profile(peak_bytes=0, step_time_s=0.1, ops=ops)) is None


# --- communication ------------------------------------------------------------------------------
def coll(step: int, op: str, nbytes: int, time_s: float, exposed_s: float, count: int = 1) -> CollectiveStat:
    return CollectiveStat(step=step, op=op, group_size=2, bytes=nbytes, count=count, time_s=time_s,
                          exposed_s=exposed_s)


def comm_profile(**kw) -> Profile:
    # Step 0 (DDP start-up broadcast) is ignored. Steps 1-2: 4 all-reduce buckets of 100 MB,
    # 40 ms each (bus bandwidth: 400 MB x 2(n-1)/n = 400 MB in 0.16 s... per call 100 MB/0.04 s
    # = 2.5 GB/s); 30 ms exposed per step of 100 ms.
    calls = [coll(0, "broadcast", 10**6, 0.5, 0.5)]
    for s in (1, 2):
        calls += [coll(s, "all_reduce", 100 * 10**6, 0.04, 0.0) for _ in range(3)]
        calls.append(coll(s, "all_reduce", 100 * 10**6, 0.04, 0.03))
    base = {"peak_bytes": 0, "step_time_s": 0.1, "collectives": tuple(calls), "world_size": 2,
            "data_parallel": "DistributedDataParallel"}
    return Profile(**{**base, **kw})


def test_communication_fires_with_the_bus_bandwidth_prediction() -> None:
    finding = communication_rule(comm_profile())
    assert finding is not None and finding.bottleneck == "communication"
    assert finding.severity == pytest.approx(0.3)
    by_id = {r.id: r for r in finding.recommendations}
    # busbw = 100 MB x 2(2-1)/2 / 0.04 s = 2.5 GB/s; T_bw = 400 MB / 2.5 GB/s = 0.16 s = the time:
    # no per-call cost left, so a bigger bucket saves nothing and is not proposed
    assert "ddp-bucket" not in by_id
    # compression halves T_bw (0.08 s), more than the 30 ms exposed: all of it is saved
    assert by_id["grad-compression"].predicted.step_time_s == pytest.approx(0.07)
    assert by_id["grad-compression"].apply_class == "live-opt-in"
    # 30% exposed -> k = 4 micro-batches: per micro-batch 0.1 - 0.03 x 3/4
    acc = by_id["grad-accumulation"]
    assert acc.params == {"micro_batches": 4} and acc.apply_class == "restart"
    assert acc.predicted.step_time_s == pytest.approx(0.1 - 0.0225)


def test_communication_bucket_prediction_removes_three_quarters_of_the_per_call_cost() -> None:
    # A third step with one fast call sets the bus bandwidth (100 MB in 10 ms = 10 GB/s). Per step
    # (3 steps): 300 MB in 3 calls taking 110 ms; T_bw = 300 MB / 10 GB/s = 30 ms, per-call cost
    # L = 80 ms; bucket x4 saves 3/4 L = 60 ms, capped at the 30 ms exposed (median).
    calls = list(comm_profile().collectives) + [coll(3, "all_reduce", 100 * 10**6, 0.01, 0.0)]
    finding = communication_rule(comm_profile(collectives=tuple(calls)))
    bucket = next(r for r in finding.recommendations if r.id == "ddp-bucket")
    assert bucket.params == {"bucket_cap_mb": 100} and bucket.apply_class == "restart"
    assert bucket.predicted.step_time_s == pytest.approx(0.07)


def test_communication_silent_below_ten_percent_or_without_data_parallel() -> None:
    assert communication_rule(comm_profile(step_time_s=0.5)) is None  # 6% exposed
    assert communication_rule(comm_profile(data_parallel=None, world_size=1)) is None


def test_straggler_names_the_rank_and_the_phase() -> None:
    profile = Profile(peak_bytes=0, step_time_s=0.2, rank_phases={
        0: RankPhases(time_s=0.2, phases={"data_s": 0.01, "forward_s": 0.05, "backward_s": 0.12, "optimizer_s": 0.02}),
        1: RankPhases(time_s=0.2, phases={"data_s": 0.06, "forward_s": 0.05, "backward_s": 0.07, "optimizer_s": 0.02}),
    })
    finding = straggler_rule(profile)
    assert finding is not None
    assert "rank 1" in finding.summary and "data" in finding.summary
    assert finding.evidence[0].value == pytest.approx(0.13 / 0.08, abs=1e-4)
    assert finding.severity == pytest.approx(0.05 / 0.2)
    even = {r: replace(p, phases={**p.phases, "data_s": 0.01}) for r, p in profile.rank_phases.items()}
    assert straggler_rule(Profile(peak_bytes=0, rank_phases=even)) is None



def _steps(rank: int, *, optimizer_s: dict[int, float], deep: tuple[int, ...] = (1, 2, 3)) -> list[StepSample]:
    return [StepSample(rank=rank, index=i, time_s=0.2, deep=i in deep,
                       phases={"data_s": 0.01, "forward_s": 0.05, "backward_s": 0.1, "optimizer_s": o})
            for i, o in optimizer_s.items()]


def test_straggler_reads_ordinary_steps_only() -> None:
    """Step 0 (the optimizer's lazy state) and the deep steps (probe work, unequal across ranks)
    are not a rank's own work: a 2-rank job was called a straggler from its steps 0-3 alone."""
    slow_early = {0: 0.09, 1: 0.06, 2: 0.06, 3: 0.06}  # rank 0: a slow warm-up and slow deep steps
    even = {0: 0.02, 1: 0.02, 2: 0.02, 3: 0.02}
    first = profile_from_records(steps=_steps(0, optimizer_s=slow_early) + _steps(1, optimizer_s=even))
    assert first.rank_phases == {} and straggler_rule(first) is None  # no ordinary step yet
    later = {i: 0.02 for i in range(4, 10)}
    settled = profile_from_records(steps=_steps(0, optimizer_s={**slow_early, **later})
                                   + _steps(1, optimizer_s={**even, **later}))
    assert straggler_rule(settled) is None  # the same work on ordinary steps
    assert {r: p.phases["optimizer_s"] for r, p in settled.rank_phases.items()} == {0: 0.02, 1: 0.02}
    slow = {i: 0.08 for i in range(4, 10)}
    real = profile_from_records(steps=_steps(0, optimizer_s={**even, **slow}) + _steps(1, optimizer_s={**even, **later}))
    finding = straggler_rule(real)
    assert finding is not None and "rank 0" in finding.summary and "optimizer" in finding.summary


# --- input --------------------------------------------------------------------------------------
LOADER = DataLoaderSettings(index=0, num_workers=0, pin_memory=False, prefetch_factor=None, persistent_workers=False,
                            batch_size=16, cpu_count=4)


def test_input_proposes_workers_with_the_hidden_wait() -> None:
    # 48 ms of loading, 4 ms of compute: ceil(48/4) = 12 workers, capped at the 4 CPUs;
    # a batch every 12 ms against 4 ms of compute leaves 8 ms of wait: step 12 ms.
    profile = Profile(peak_bytes=0, step_time_s=0.052, phases={"data_s": 0.048}, loaders=(LOADER,),
                      device=CPU)
    finding = input_rule(profile)
    (rec,) = finding.recommendations
    assert rec.params == {"loader": 0, "num_workers": 4, "prefetch_factor": 2}
    assert rec.predicted.step_time_s == pytest.approx(0.012)
    assert rec.apply_class == "live-opt-in" and "random streams" in rec.prerequisites[0]


def test_input_with_workers_already_and_pinning_on_cuda() -> None:
    # 2 workers, 10 ms wait, 20 ms compute: a batch takes 2 x 30 = 60 ms; 3 workers: 20 ms apart,
    # no wait left. On CUDA pinning is added.
    loader = replace(LOADER, num_workers=2, prefetch_factor=2, cpu_count=8)
    profile = Profile(peak_bytes=0, step_time_s=0.03, phases={"data_s": 0.01}, loaders=(loader,),
                      device=H100)
    (rec,) = input_rule(profile).recommendations
    assert rec.params == {"loader": 0, "num_workers": 3, "pin_memory": True}
    assert rec.predicted.step_time_s == pytest.approx(0.02)


def test_input_without_a_captured_loader_says_what_it_needs() -> None:
    finding = input_rule(Profile(peak_bytes=0, step_time_s=0.1, phases={"data_s": 0.05}))
    assert finding.recommendations == ()
    assert any("DataLoader" in str(e.value) for e in finding.evidence)
    assert input_rule(Profile(peak_bytes=0, step_time_s=0.1, phases={"data_s": 0.004})) is None


# --- fragmentation ------------------------------------------------------------------------------
def test_fragmentation_predicts_the_reserve_recovered() -> None:
    profile = Profile(peak_bytes=10 * GIB, step_time_s=0.5, reserved_at_peak=16 * GIB, allocated_at_peak=10 * GIB)
    finding = fragmentation_rule(profile)
    (rec,) = finding.recommendations
    assert rec.baseline.peak_memory_bytes == 16 * GIB and rec.predicted.peak_memory_bytes == 10 * GIB
    assert rec.apply_class == "restart" and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in rec.prerequisites[0]
    assert fragmentation_rule(Profile(peak_bytes=0, reserved_at_peak=11 * GIB, allocated_at_peak=10 * GIB)) is None
    assert fragmentation_rule(Profile(peak_bytes=0)) is None  # CPU: no allocator figures


def test_an_oom_with_free_reserve_ranks_first() -> None:
    oom = Oom(op="aten.mm", requested_bytes=2 * GIB, reserved_bytes=70 * GIB, allocated_bytes=66 * GIB,
              categories={"activation": 60 * GIB})
    profile = Profile(peak_bytes=66 * GIB, budget_bytes=80 * GIB, oom=oom, step_time_s=None,
                      reserved_at_peak=70 * GIB, allocated_at_peak=66 * GIB)
    diagnosis, recs = advise(profile)
    assert "fragmentation" in diagnosis.summary
    assert recs[0].remedy == "expandable_segments"
    assert any(e.what == "also: memory" for e in diagnosis.evidence)  # the OOM's own finding stays


def test_ranking_names_the_costliest_bottleneck_and_keeps_the_others() -> None:
    ops = tuple(mm(s, flops=1e6, bytes=1e6, time_s=0.08) for s in (2, 3))  # 20% of the 0.4 s deep steps
    profile = comm_profile(ops=ops, phases={"data_s": 0.01}, loaders=(LOADER,), device=CPU,
                           step_times={2: (0.4, 0.0), 3: (0.4, 0.0)})
    diagnosis, recs = advise(profile)
    # host gap 0.09 x 80% = 72% of the step > exposed communication 30% > data wait 10%
    assert diagnosis.bottleneck == "launch_overhead"
    also = [e.what for e in diagnosis.evidence if e.what.startswith("also:")]
    assert also == ["also: communication", "also: input"]
    assert recs[0].remedy == "compile_blocks"


def test_fused_optimizer_prediction_reads_the_optimizer_ops() -> None:
    # 40 ms optimizer phase in a 100 ms step; its ops: 200 calls, 8 ms of kernels per step. The
    # 32 ms between them goes and the kernels halve (assumed): optimizer 4 ms, step 64 ms.
    ops = tuple(OpStat(step=s, name="aten._foreach_add_", phase="optimizer", count=100, bytes=2**20,
                       time_s=0.004) for s in (2, 3) for _ in range(2))
    finding = run("optimizer_step", Profile(peak_bytes=0, step_time_s=0.1, phases={"optimizer_s": 0.04}, ops=ops))
    (rec,) = finding.recommendations
    assert rec.predicted.step_time_s == pytest.approx(0.064)
    assert "200 optimizer ops per step" in rec.cost_model


def test_recorded_cpu_sessions_with_a_gpu_spec_are_not_compute_bound() -> None:
    # The recorded GPT's fp32 matmuls take 34 ms of a 1.93 s step (2%): even on a device with
    # tensor cores the compute rule stays silent; the same ops scaled to fill the step fire it.
    import dataclasses

    import recorded

    from advisor.advice import current_regime
    from advisor.recommend.profile import profile_from_records

    state = recorded.load_state("gpt")
    regime = current_regime(state)
    steps = [s for r in sorted(regime.steps) for s in regime.steps[r]]
    profile = profile_from_records(steps=steps, memory=regime.memory, modules=regime.modules, ops=regime.ops,
                                   events=regime.events, runs=[regime.runs[r] for r in sorted(regime.runs)])
    gpu = dataclasses.replace(profile, device=H100)
    assert compute_rule(gpu) is None
    mms = [o for o in gpu.ops if o.name in ("aten.mm", "aten.addmm")]
    flops = sum(o.flops for o in mms) / 2  # per step (2 deep steps)
    # at 80% of the 60 TFLOP/s fp32 peak these FLOPs take flops / 48e12 s; make that 90% of the step
    fast = dataclasses.replace(gpu, ops=tuple(dataclasses.replace(o, time_s=o.flops / 48e12) for o in mms),
                               step_time_s=flops / 48e12 / 0.9)
    finding = compute_rule(fast)
    assert finding is not None and finding.severity == pytest.approx(0.9)


def test_a_tensor_parallel_job_is_not_told_to_accumulate_under_no_sync() -> None:
    """Ranks with no DDP wrapper and no gradient reduced (tensor parallel: DTensor all-gathers) got
    "accumulate under no_sync" while its own evidence said 0 B reduced per step (issue 30)."""
    calls = [coll(0, "broadcast", 10**6, 0.5, 0.5)]
    for s in (1, 2):
        calls += [coll(s, "all_gather", 100 * 10**6, 0.04, 0.03)]
    finding = communication_rule(comm_profile(collectives=tuple(calls), data_parallel=None))
    assert finding is None or "grad-accumulation" not in {r.id for r in finding.recommendations}
    unwrapped_ddp = communication_rule(comm_profile(data_parallel=None))  # all-reduces seen, no wrapper
    assert "grad-accumulation" in {r.id for r in unwrapped_ddp.recommendations}
