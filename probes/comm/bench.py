"""Bus-bandwidth sweep of all_reduce, all_gather and reduce_scatter on the current world.

Run under torchrun, one process per rank:

    python -m torch.distributed.run --nproc-per-node 2 -m advisor.probes.comm.bench [--sizes ...]

Each size is timed with ``time.perf_counter()`` around ``iters`` calls after a warm-up
(``torch.cuda.synchronize()`` first on CUDA), and the slowest rank's mean counts, as in
nccl-tests. Rank 0 prints a table and stores the results in the JSON cache
(``advisor.records.comm_cache``). Bandwidths are bytes per second, sizes bytes (S per nccl-tests).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist

from advisor.records.comm_cache import cache_key, save_result
from advisor.records.bandwidth import algbw, busbw

DEFAULT_SIZES = [2**k for k in range(12, 25, 2)]  # 4 KiB .. 16 MiB
OPS = ("all_reduce", "all_gather", "reduce_scatter")


class BenchError(Exception):
    """A user-facing failure of the sweep (printed with a hint, exit code 2)."""


def _time_op(op: str, nbytes: int, device: torch.device, iters: int, warmup: int) -> float:
    world = dist.get_world_size()
    elems = max(world, nbytes // 4 // world * world)  # divisible by the world for the sharded ops
    full = torch.ones(elems, dtype=torch.float32, device=device)
    shard = torch.ones(elems // world, dtype=torch.float32, device=device)

    def call() -> None:
        if op == "all_reduce":
            dist.all_reduce(full)
        elif op == "all_gather":
            dist.all_gather_into_tensor(full, shard)
        else:
            with warnings.catch_warnings():
                # deprecated for reduce_scatter_single on torch 2.13, which torch 2.11 lacks
                warnings.simplefilter("ignore", FutureWarning)
                dist.reduce_scatter_tensor(shard, full)

    for _ in range(warmup):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank bounds the collective
    return float(elapsed.item())


def sweep(sizes: Sequence[int], *, iters: int, warmup: int, device: torch.device) -> list[dict[str, Any]]:
    """One row per (op, size): {op, bytes, time_s, algbw, busbw} on the current world."""
    world = dist.get_world_size()
    rows = []
    for op in OPS:
        for size in sizes:
            elems = max(world, size // 4 // world * world)
            nbytes = elems * 4
            t = _time_op(op, nbytes, device, iters, warmup)
            rows.append(
                {"op": op, "bytes": nbytes, "time_s": t, "algbw": algbw(nbytes, t), "busbw": busbw(op, nbytes, t, world)}
            )
    return rows


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="advisor bench-comm", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="sizes in bytes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with CUDA, else gloo")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise BenchError(
                "not launched as a distributed job (RANK/WORLD_SIZE unset); run "
                "`python -m torch.distributed.run --nproc-per-node N -m advisor.probes.comm.bench`"
            )
        if any(s <= 0 for s in args.sizes) or args.iters < 1 or args.warmup < 0:
            raise BenchError("--sizes must be positive, --iters at least 1, --warmup at least 0")
        cuda = torch.cuda.is_available()
        backend = args.backend or ("nccl" if cuda else "gloo")
        if backend == "nccl" and not cuda:
            raise BenchError("backend nccl needs CUDA; valid here: gloo")
    except BenchError as exc:
        print(f"advisor bench-comm: {exc}", file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        rows = sweep(args.sizes, iters=args.iters, warmup=args.warmup, device=device)
        if dist.get_rank() == 0:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            world = dist.get_world_size()
            key = cache_key(backend=backend, world_size=world, device=name, hostname=socket.gethostname())
            path = save_result(
                key,
                {"backend": backend, "world_size": world, "device": name, "measured_at": time.time(), "results": rows},
            )
            print(f"{'op':<16}{'bytes':>12}{'time (us)':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
            for r in rows:
                print(f"{r['op']:<16}{r['bytes']:>12}{r['time_s'] * 1e6:>12.1f}"
                      f"{r['algbw'] / 1e9:>12.3f}{r['busbw'] / 1e9:>12.3f}")
            print(f"cached in {path}" if path is not None else "could not write the cache (the figures above stand)")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
