"""Device ceilings for the roofline: spec table, NVML, micro-benchmarks."""
