"""DIRP: DDIM-inversion reconstruction purification, with the protections it is tested against and its baselines."""
