"""TRL-style trainers: a config dataclass and a trainer per method."""
