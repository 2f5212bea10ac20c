"""``advisor import``: turn artifacts users already have into a session of ordinary records.

Kineto traces (``kineto``) and CUDA memory snapshots (``snapshot``) become the same typed records
the agent emits (``advisor.records.samples``), so the report, the recommender and ``advisor diff``
work on them unchanged. Torch-free: nothing here imports torch or unpickles a class.
"""
