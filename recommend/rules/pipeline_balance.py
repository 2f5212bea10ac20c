"""Pipeline balance: a live pipeline split whose measured stage times are imbalanced gets a new
split with its predicted gain (issue 12, the rule's second part). The logic, the calibration and
the thresholds are in ``recommend/remedies/pipeline_repartition.py``."""

from __future__ import annotations

from advisor.recommend.remedies.pipeline_repartition import rule

RULE = rule
