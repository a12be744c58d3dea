"""What measures or compares a method: judges, oracles, exact evaluators and comparison-only baselines."""
