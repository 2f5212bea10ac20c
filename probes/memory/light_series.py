"""Light memory samples, downsampled as a run grows (``advisor.records.schedule.light_sample_bucket``).

Every light step's sample is sent until step ``2 * LIGHT_SAMPLES_FULL``; from there one per bucket
of light steps and event (``optimizer_start``; on CUDA each phase's), the one of largest
``total_bytes`` (so the peak a light step reached survives), sent when the next bucket starts or the
probe detaches, with ``steps_covered`` saying how many steps it stands for. Samples per rank grow
with the logarithm of the run's length: a million steps send about 76,000 per event, not a million.
"""

from __future__ import annotations

import dataclasses

from advisor.records.samples import MemorySample
from advisor.records.schedule import LIGHT_SAMPLES_FULL, light_sample_bucket


class LightSeries:
    """Holds each event's largest sample of the bucket under way; says what to send now."""

    def __init__(self, full: int = LIGHT_SAMPLES_FULL) -> None:
        self.full = full
        self._held: dict[str, tuple[int, int, MemorySample]] = {}  # event -> (bucket, seen, largest sample)

    def offer(self, sample: MemorySample) -> list[MemorySample]:
        """The samples to send now that ``sample`` was taken (it may be held back)."""
        bucket, size = light_sample_bucket(sample.step, self.full)
        held = self._held.get(sample.event)
        out: list[MemorySample] = []
        if held is not None and held[0] != bucket:
            out.append(self._covering(held))
            held = None
        if size == 1:
            self._held.pop(sample.event, None)
            return [*out, sample]
        if held is None:
            self._held[sample.event] = (bucket, 1, sample)
        else:
            _, seen, largest = held
            self._held[sample.event] = (bucket, seen + 1, sample if sample.total_bytes > largest.total_bytes else largest)
        return out

    def flush(self) -> list[MemorySample]:
        """Everything held (the probe detaches, the run ends)."""
        out = [self._covering(h) for h in self._held.values()]
        self._held = {}
        return out

    @staticmethod
    def _covering(held: tuple[int, int, MemorySample]) -> MemorySample:
        _, seen, sample = held
        return dataclasses.replace(sample, steps_covered=seen)
