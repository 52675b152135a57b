"""Benchmarks that put Sluice side by side with a baseline and report ratios, medians and spread."""
