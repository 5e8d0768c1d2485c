"""Model parallelism: ``layerwise``, ``tensor`` (Megatron), ``alexnet-2col``, ``gnmt``, ``strads``.

Shared pieces: :mod:`.shard_collectives` (sub-group communicators, Megatron's f/g and all-gather as autograd
operators), :mod:`.shard` (slicing layers by output rows), :mod:`.megatron` (splitting gpt
blocks), :mod:`.stages` (one stage of a cut model executing a pipeline schedule's actions).
"""
