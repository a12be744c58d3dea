"""What measures or compares a method: judges, oracles, headroom diagnostics, comparison-only baselines."""
