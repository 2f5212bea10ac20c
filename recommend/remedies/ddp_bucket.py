"""A larger DDP bucket, the predictor half (``rules/communication.py``).

``restart``: DDP fixes ``bucket_cap_mb`` when the wrapper is built (its C++ ``Reducer`` is
constructed with the bucket size and only rebuilds the buckets once, after the first step, from
that same cap); no public API changes it on the script's DDP object, and a new DDP instance is
not the object the script's loop calls. The recommendation carries the exact change.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec


def validate(params: Mapping[str, Any]) -> None:
    value = params.get("bucket_cap_mb")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, not {value!r}")


SPEC = RemedySpec(name="ddp_bucket", apply_class="restart", params=("bucket_cap_mb",), validate=validate,
                  phase="layout")
