"""Accounted communication (every byte counted per rank, peer and operation)."""

from polytrain.comm.accounted import CollectiveMismatch, Comm
from polytrain.comm.groups import GroupComm, new_groups

__all__ = ["CollectiveMismatch", "Comm", "GroupComm", "new_groups"]
