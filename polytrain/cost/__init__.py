"""The cost model: what a step of a strategy costs on a cluster, from a profile of the model."""
