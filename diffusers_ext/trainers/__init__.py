"""TRL-style trainers: a config dataclass and a trainer class per method, on the shared `DiffusionTrainer` base."""
