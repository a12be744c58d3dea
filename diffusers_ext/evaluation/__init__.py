"""What measures or compares a method: judges, oracles, benchmark experts and comparison-only baselines."""
