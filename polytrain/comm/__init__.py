"""Accounted communication (every byte counted per rank, peer and operation)."""

from polytrain.comm.accounted import Comm

__all__ = ["Comm"]
