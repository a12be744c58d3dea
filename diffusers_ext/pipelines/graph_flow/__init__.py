"""Graph generation with discrete graph flow models (DeFoG), sampled with the analytic CTMC rate of Graph-GRPO."""
