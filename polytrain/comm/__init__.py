"""Accounted communication (every byte counted per rank, peer and operation)."""

from polytrain.comm.accounted import CollectiveMismatch, Comm

__all__ = ["CollectiveMismatch", "Comm"]
