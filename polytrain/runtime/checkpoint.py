"""Checkpoints that survive crashes and never run code when loaded.

Layout (one directory per checkpoint, the pointer moves last; training, the parameter server and
``polytrain rl`` alike)::

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


def load_tensors(path: Path, mmap: bool = False) -> tuple[Any, str | None]:
    """(the content, None) when ``path`` loads as tensors, numbers, strings and plain containers
    only (``weights_only``: a crafted file cannot run code), else (None, what is wrong). Every
    checkpoint file of polytrain is read here: training's rank files, rl's ``dqn.pt`` and the
    apex/gorila snapshot parts. ``mmap``: mapped, not read (training's verification)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap), None
    except FileNotFoundError:
        return None, "is missing"
    except Exception as e:
        return None, _load_problem(e)


def _load_mapped(path: Path) -> tuple[Any, str | None]:
    return load_tensors(path, mmap=True)


def save_tensors(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` whole: to ``path.part``, fsynced, then renamed (a reader sees
    the old file or the new one, never half). Every checkpoint file of polytrain is written here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    torch.save(state, tmp)
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def schema(state: Any, prefix: str = "") -> dict[str, list[int] | str]:
    """Every entry of a rank file by its dotted key: a tensor's shape, else its type's name.
    Kept in meta.json at commit and compared on load: a file whose hash was made to match but
    whose content changed (a wrong shape, a missing ``optimizer``) is refused before launch."""
    if isinstance(state, torch.Tensor):
        return {prefix: list(state.shape)}
    if isinstance(state, dict):
        out: dict[str, list[int] | str] = {}
        for k, v in state.items():
            out |= schema(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(state, list | tuple):
        out = {}
        for i, v in enumerate(state):
            out |= schema(v, f"{prefix}.{i}" if prefix else str(i))
        return out or {prefix: type(state).__name__}
    return {prefix: type(state).__name__}


def _schema_problem(name: str, found: dict[str, Any], kept: dict[str, Any]) -> str | None:
    missing = sorted(set(kept) - set(found))
    if missing:
        return f"file {name} lacks {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}"
    extra = sorted(set(found) - set(kept))
    if extra:
        return f"file {name} holds entries its checkpoint never wrote ({', '.join(extra[:3])})"
    for key in sorted(kept):
        if found[key] != kept[key]:
            return f"file {name}: {key} is {found[key]}, but {kept[key]} was written"
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
        tmp = None
        try:
            path = self.stage(step) / f"rank{rank}.pt"
            tmp = path.with_suffix(".part")
            save_tensors(path, state)
        except (OSError, RuntimeError) as e:  # torch's writer reports a full disk as RuntimeError
            raise CheckpointError(
                f"rank {rank} could not write {step_dir_name(step)}: {self._write_problem(e, tmp)} "
                f"({self.root}). The previous checkpoint is kept; free space or fix the "
                "permissions, then --resume the run") from None

    @staticmethod
    def _write_problem(e: BaseException, path: Path | None = None) -> str:
        """What made a write fail, in words: the OS's reason (no space left on device,
        permission denied, ...). Torch's writer gives none ("unexpected pos 704 vs 598"), so
        one plain write of 64 KiB to the same ``path`` asks the OS for it."""
        if isinstance(e, OSError) and e.strerror:
            return e.strerror.lower()
        if path is not None:
            try:
                with path.open("wb") as f:
                    f.write(bytes(1 << 16))
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as probe:
                if probe.strerror:
                    return probe.strerror.lower()
            finally:
                path.unlink(missing_ok=True)
        return str(e).splitlines()[0] if str(e) else type(e).__name__

    def commit(self, step: int, keep: int, window: int = 0, info: dict[str, Any] | None = None) -> Path:
        """Seal the staged directory: manifest, rename into place, move LATEST, prune old ones.
        ``info``: the app's own figures of the cut (rl: env steps, updates, clock), kept in meta.json
        (:meth:`info_of`)."""
        try:
            return self._commit(step, keep, window, info)
        except OSError as e:
            raise CheckpointError(
                f"rank 0 could not write {step_dir_name(step)}: {self._write_problem(e)} "
                f"({self.root}). The previous checkpoint is kept; free space or fix the "
                "permissions, then --resume the run") from None

    def _commit(self, step: int, keep: int, window: int, info: dict[str, Any] | None) -> Path:
        tmp = self.stage(step)
        # rank files, and any other tensor file a strategy staged (e.g. zero's consolidated model.pt)
        files = {p.name: _sha256(p) for p in sorted(tmp.glob("*.pt"))}
        meta: dict[str, Any] = {"step": step, "job_fingerprint": self.fingerprint,
                                "files": sorted(files),
                                "schema": {n: schema(_load_mapped(tmp / n)[0]) for n in files}}
        if self.clock is not None:
            meta["t"] = round(self.clock(), 6)
        if self.plans:
            meta["plans"] = self.plans
        if info is not None:
            meta["info"] = info
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
        self._prune(keep, step - window if window > 0 else None)  # window 0: no divergence window
        return final

    def _prune(self, keep: int, before: int | None = None) -> None:
        """Keep the newest ``keep``; with ``before`` (the divergence window's start) also every
        one after it and the newest at or before it: a run that diverges must still have a
        checkpoint from before the divergence began, however often it checkpoints, and as the
        run goes on the window's ones become that checkpoint."""
        done = sorted(p for p in self.root.glob("step-*") if not p.name.endswith(".tmp"))
        old = done[:-keep]
        if before is not None:
            early = [p for p in old if self._step_name(p) <= before]
            old = early[:-1]
        for path in old:
            shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _step_name(path: Path) -> int:
        try:
            return int(path.name[len("step-"):])
        except ValueError:
            return -1

    def set_aside_after(self, step: int) -> tuple[list[str], str | None]:
        """Rename every checkpoint after ``step`` to ``diverged-step-…`` (kept for a post-mortem,
        never resumed from) and point LATEST at the newest one left. Returns the names set aside
        and the last good one (None: none left). Run by the launcher once every rank stopped."""
        moved = []
        for path in sorted(self.root.glob("step-*")):
            if not path.name.endswith(".tmp") and self._step_name(path) > step:
                path.rename(self.root / f"diverged-{path.name}")
                moved.append(path.name)
        left = [p for p in self.candidates() if self._step_name(p) <= step]
        good = max(left, key=self._step_name).name if left else None
        if moved and good is not None:
            _fsync_write(self.root / "LATEST.tmp", good.encode())
            (self.root / "LATEST.tmp").rename(self.root / "LATEST")
        elif moved:
            (self.root / "LATEST").unlink(missing_ok=True)
        return moved, good

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
            step = int(meta["step"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"its meta.json is missing or unreadable ({type(e).__name__})"
        if step != self._step_name(ckpt) or step < 1:
            return f"its meta.json says step {meta['step']}, not the {self._step_name(ckpt)} of its name"
        if meta.get("job_fingerprint") != self.fingerprint:
            return "it belongs to a different job (model, data or strategy differ)"
        return self._verify_files(ckpt, meta, {str(n) for n, _ in names})

    def _verify_files(self, ckpt: Path, meta: dict[str, Any], listed: set[str]) -> str | None:
        """Every tensor file (rank files, and e.g. zero's consolidated model.pt, which commit()
        lists too) is in the manifest and meta.json, loads as tensors only, and holds what was
        written (meta.json's schema; checkpoints older than the schema: loadable)."""
        present = {p.name for p in ckpt.glob("*.pt")}
        unlisted = sorted(present - listed) or sorted(set(meta.get("files", present)) ^ present)
        if unlisted:
            return f"file {unlisted[0]} is not in its manifest and meta.json"
        kept: dict[str, Any] = meta["schema"] if isinstance(meta.get("schema"), dict) else {}
        for name in sorted(present):
            state, problem = _load_mapped(ckpt / name)
            if problem:
                return f"file {name} {problem}"
            if name in kept:
                found = {k: list(v) if isinstance(v, list) else v for k, v in schema(state).items()}
                problem = _schema_problem(name, found, kept[name])
                if problem:
                    return problem
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
    def info_of(ckpt: Path) -> dict[str, Any]:
        """The figures the app committed with ``ckpt`` (``commit(info=...)``; {} when none)."""
        info = json.loads((ckpt / "meta.json").read_text()).get("info")
        return info if isinstance(info, dict) else {}

    @staticmethod
    def time_of(ckpt: Path) -> float | None:
        """The run's clock when ``ckpt`` was written (None for a checkpoint without one)."""
        t = json.loads((ckpt / "meta.json").read_text()).get("t")
        return float(t) if isinstance(t, int | float) else None
