"""Benchmark scripts (run from the repository root: python -m benchmarks.NAME)."""
