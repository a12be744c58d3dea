"""Flow matching on low-dimensional manifolds: the sampling pipeline of the two-head velocity model."""
