"""Connectivity distributions of low-rank RNNs: the two-flow sampling pipeline and the ridge (maximum-entropy)
read-out of the output-side loadings."""
