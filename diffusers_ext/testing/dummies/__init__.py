"""Dummy setups of the package's pipelines, one module per method (imported by the registry on its first miss)."""
