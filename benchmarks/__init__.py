"""Benchmarks of tbdzoo; run each as ``python3 -m benchmarks.<name>`` from the repository root."""
