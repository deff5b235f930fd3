"""Measured training runs as cost-model inputs, the model's error on them, and the fit of a device's
physical constants to them (benchmarks/accuracy.py and benchmarks/fit_profiles.py print the figures;
tests/test_calibration_runs.py checks them)."""
