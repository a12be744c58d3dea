"""Geometry shared by pipelines, data and training scripts: camera conventions, rays and trajectories."""
