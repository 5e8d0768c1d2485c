"""Parameter servers: sharding plans (:mod:`.sharding`), consistency models (:mod:`.consistency`),
the server and its client with their wire protocol (:mod:`.server`), the ``ps`` strategy
(:mod:`.strategy`, worker loop in :mod:`.worker`) and ``sandblaster`` L-BFGS (:mod:`.sandblaster`).
"""
