"""Plan search: every valid layout of a model on a cluster, pruned by memory, simulated, ranked."""
