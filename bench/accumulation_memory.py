"""Peak-memory prediction under gradient accumulation, before and after per-call figures.

    python bench/accumulation_memory.py

Runs the nanoGPT-like loop of tests/test_memory_accumulation.py (4 layers, micro-batches of
8 x 64 tokens, AdamW) under MemoryProbe, with 1 and with 4 micro-batches per step. For each it
prints the tracked peak without and with every block checkpointed (the applier run for real),
and the memory model's predictions from the same session read two ways: with the per-call
figures (now) and with them stripped, the step's sums read as one forward (before). Error is
(predicted - tracked) / tracked.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_memory_accumulation import accumulation_run, profile_of  # noqa: E402

from advisor.recommend.memory_model import chain_from_profile, predicted_peak  # noqa: E402


def _err(predicted: int, tracked: int) -> str:
    return f"{predicted / 2**20:8.2f} MiB ({(predicted - tracked) / tracked:+6.1%})"


def main() -> int:
    for micro in (1, 4):
        ctx, tracked = accumulation_run(micro_batches=micro)
        names = list(chain_from_profile(profile_of(ctx)).names)  # type: ignore[union-attr]
        _, tracked_ckpt = accumulation_run(micro_batches=micro, checkpoint=names)
        print(f"{micro} micro-batch(es): tracked peak {tracked / 2**20:.2f} MiB, "
              f"all {len(names)} blocks checkpointed {tracked_ckpt / 2**20:.2f} MiB")
        for label, per_call in (("before (sums as one forward)", False), ("after (per call)", True)):
            chain = chain_from_profile(profile_of(ctx, per_call=per_call))
            assert chain is not None
            print(f"  {label:30s} no checkpointing {_err(predicted_peak(chain, set()), tracked)}   "
                  f"checkpointed {_err(predicted_peak(chain, set(range(chain.n))), tracked_ckpt)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
