"""Benchmarks that print figures (ratios measured within one run); not tests."""
