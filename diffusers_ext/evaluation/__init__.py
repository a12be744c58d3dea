"""What measures or compares a method: judges, oracles and comparison-only baselines, one module per method."""
