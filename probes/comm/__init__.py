"""Communication probe: every collective's bytes, time and exposure, on every rank.

Modules: ``intercept`` (dispatcher-level interception of c10d ops), ``probe`` (``CommProbe``),
``cuda_timing`` (NCCL kernel times from the profiler), ``bench`` (bus-bandwidth sweep) and
``cache`` (the sweep's torch-free JSON cache). Import the one you need: this package does
not import torch by itself, so the report can read the cache cheaply.
"""
