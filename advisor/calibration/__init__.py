"""``advisor calibrate``'s parts: per-rank probes, fits to the cost model, the profile."""
