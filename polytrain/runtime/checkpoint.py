"""Checkpoints that survive crashes and never run code when loaded.

Layout (one directory per checkpoint, the pointer moves last)::

    checkpoints/
      step-00000100/
        rank0.pt            tensors only (torch.save of a dict of tensors / nested dicts of tensors)
        meta.json           {"step", "t", "job_fingerprint", "files": {...}}
        MANIFEST.json       {"files": {name: sha256}}
      LATEST                "step-00000100"

Writing: files go to ``step-…​.tmp-<pid>``, each is fsynced, the directory is renamed into place,
then ``LATEST`` is replaced atomically (write temp, fsync, rename). Loading uses
``torch.load(weights_only=True)`` — a restricted unpickler that refuses anything but tensors and
plain containers — after checking every file's SHA-256 against the manifest. A corrupt or
half-written checkpoint is refused and the previous good one used, with a warning; if none is
good, resume stops with an error instead of silently starting afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from polytrain.errors import CheckpointError

MANIFEST = "MANIFEST.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_problem(e: BaseException) -> str:
    """What is wrong with a file ``torch.load(weights_only=True)`` refused, in our words."""
    if isinstance(e, pickle.UnpicklingError):
        return "holds Python objects other than tensors and plain containers"
    return f"cannot be read as a checkpoint ({type(e).__name__})"


def _unloadable(path: Path) -> str | None:
    """None when ``path`` loads as tensors only (mapped, not read), else what is wrong."""
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        return _load_problem(e)
    return None


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class CheckpointStore:
    """Atomic save and verified load of per-rank tensor states under ``root``."""

    def __init__(self, root: Path, fingerprint: str, clock: Callable[[], float] | None = None) -> None:
        """``clock``: the run's clock (the leader's recorder), stored as the checkpoint's ``t`` so
        that a resumed run's events continue the timeline."""
        self.root = root
        self.fingerprint = fingerprint
        self.clock = clock
        # Plans this run resolved from measurements (a pipeline's partition=auto), by name: every
        # checkpoint stores them, and a resumed or restarted run reuses them (stored_plan).
        self.plans: dict[str, Any] = {}

    # ---- writing ---------------------------------------------------------------------------
    def stage(self, step: int) -> Path:
        """The temporary directory ranks write their files into before :meth:`commit`."""
        tmp = self.root / f"{step_dir_name(step)}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp

    def write_rank(self, step: int, rank: int, state: dict[str, Any]) -> None:
        path = self.stage(step) / f"rank{rank}.pt"
        tmp = path.with_suffix(".part")
        torch.save(state, tmp)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        tmp.rename(path)

    def commit(self, step: int, keep: int) -> Path:
        """Seal the staged directory: manifest, rename into place, move LATEST, prune old ones."""
        tmp = self.stage(step)
        # rank files, and any other tensor file a strategy staged (e.g. zero's consolidated model.pt)
        files = {p.name: _sha256(p) for p in sorted(tmp.glob("*.pt"))}
        meta: dict[str, Any] = {"step": step, "job_fingerprint": self.fingerprint,
                                "files": sorted(files)}
        if self.clock is not None:
            meta["t"] = round(self.clock(), 6)
        if self.plans:
            meta["plans"] = self.plans
        _fsync_write(tmp / "meta.json", json.dumps(meta).encode())
        files["meta.json"] = _sha256(tmp / "meta.json")
        _fsync_write(tmp / MANIFEST, json.dumps({"files": files}, indent=1).encode())
        final = self.root / step_dir_name(step)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(self.root)
        pointer = self.root / "LATEST.tmp"
        _fsync_write(pointer, final.name.encode())
        pointer.rename(self.root / "LATEST")
        _fsync_dir(self.root)
        self.remove_stale(upto=step)  # a killed run's half-written ones
        self._prune(keep)
        return final

    def _prune(self, keep: int) -> None:
        done = sorted(p for p in self.root.glob("step-*") if not p.name.endswith(".tmp"))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    # ---- reading ---------------------------------------------------------------------------
    def verify(self, ckpt: Path) -> str | None:
        """None when ``ckpt`` is complete, intact and loadable, else what is wrong with it."""
        try:
            manifest = json.loads((ckpt / MANIFEST).read_text())["files"]
            names = sorted(manifest.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"no readable {MANIFEST} ({type(e).__name__})"
        for name, digest in names:
            f = ckpt / str(name)
            if not f.is_file():
                return f"file {name} is missing"
            if _sha256(f) != digest:
                return f"file {name} does not match its SHA-256 in the manifest"
        try:
            meta = json.loads((ckpt / "meta.json").read_text())
            int(meta["step"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"its meta.json is missing or unreadable ({type(e).__name__})"
        if meta.get("job_fingerprint") != self.fingerprint:
            return "it belongs to a different job (model, data or strategy differ)"
        for name, _ in names:
            if str(name).endswith(".pt"):
                problem = _unloadable(ckpt / str(name))
                if problem:
                    return f"file {name} {problem}"
        return None

    def candidates(self) -> list[Path]:
        """Checkpoints newest first, the one LATEST points to leading."""
        done = sorted((p for p in self.root.glob("step-*") if not p.name.endswith(".tmp")),
                      reverse=True)
        try:
            named = self.root / (self.root / "LATEST").read_text().strip()
        except (OSError, ValueError):  # no pointer, or a garbled one: newest first
            named = None
        if named is not None and named in done:
            done.remove(named)
            done.insert(0, named)
        return done

    def find_good(self) -> tuple[Path, list[str]]:
        """The newest intact checkpoint, and warnings for the newer ones that were refused."""
        warnings: list[str] = []
        for ckpt in self.candidates():
            problem = self.verify(ckpt)
            if problem is None:
                return ckpt, warnings
            warnings.append(f"checkpoint {ckpt.name} refused: {problem}")
        detail = "; ".join(warnings) if warnings else f"there is no checkpoint in {self.root}"
        raise CheckpointError(
            f"Cannot resume: {detail}. Start a fresh run (without --resume), or point --resume at "
            "a run directory that was started with --checkpoint-every N."
        )

    @staticmethod
    def load_rank(ckpt: Path, rank: int) -> dict[str, Any]:
        path = ckpt / f"rank{rank}.pt"
        if not path.is_file():
            raise CheckpointError(f"Checkpoint {ckpt} has no state for rank {rank} ({path.name}).")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # never pass on torch's advice to load it with weights_only=False
            raise CheckpointError(f"Checkpoint file {path} {_load_problem(e)}; polytrain never "
                                  "loads it. Resume from another run directory.") from None

    def remove_stale(self, upto: int | None = None) -> None:
        """Remove half-written checkpoints (``step-N.tmp`` left by a killed run), those of steps
        up to ``upto`` (default: all), and a stale ``LATEST.tmp``."""
        for tmp in self.root.glob("step-*.tmp"):
            try:
                step = int(tmp.name[len("step-"):-len(".tmp")])
            except ValueError:
                continue
            if upto is None or step <= upto:
                shutil.rmtree(tmp, ignore_errors=True)
        if upto is None:
            (self.root / "LATEST.tmp").unlink(missing_ok=True)

    def stored_plan(self, name: str) -> Any | None:
        """The plan ``name`` stored with the checkpoint a resume starts from (None: none)."""
        try:
            ckpt, _ = self.find_good()
        except CheckpointError:
            return None
        return json.loads((ckpt / "meta.json").read_text()).get("plans", {}).get(name)

    @staticmethod
    def step_of(ckpt: Path) -> int:
        return int(json.loads((ckpt / "meta.json").read_text())["step"])

    @staticmethod
    def time_of(ckpt: Path) -> float | None:
        """The run's clock when ``ckpt`` was written (None for a checkpoint without one)."""
        t = json.loads((ckpt / "meta.json").read_text()).get("t")
        return float(t) if isinstance(t, int | float) else None
