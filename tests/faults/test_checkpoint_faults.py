"""Corrupt, crafted and half-written checkpoints (issue 22 item 8): each is refused with one
line naming the file and the previous good checkpoint used; nothing is ever unpickled beyond
tensors; a killed run's half-written ``step-N.tmp`` is removed."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import torch

from polytrain.errors import CheckpointError
from polytrain.runtime.checkpoint import MANIFEST, CheckpointStore
from tests.conftest import run_cli
from tests.faults.probes import leftovers


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/polytrain-pwned",))


def _store(tmp_path: Path, steps: tuple[int, ...] = (2, 4)) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "checkpoints", "job")
    for step in steps:
        store.write_rank(step, 0, {"w": torch.full((3,), float(step))})
        store.commit(step, keep=5)
    return store


def _replace(ckpt: Path, name: str, data: bytes | None) -> None:
    """Put ``data`` in ``ckpt/name`` (None: remove it) and re-hash the manifest, so only the
    content is wrong, not its hash."""
    manifest = json.loads((ckpt / MANIFEST).read_text())
    if data is None:
        (ckpt / name).unlink()
        manifest["files"].pop(name)
    else:
        (ckpt / name).write_bytes(data)
        manifest["files"][name] = hashlib.sha256(data).hexdigest()
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def _crafted() -> bytes:
    """A torch.save file whose pickle would run ``os.system`` if loaded without weights_only."""
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(3), "x": Payload()}, buf)
    return buf.getvalue()


def test_hash_valid_but_crafted_file_falls_back_naming_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _replace(store.root / "step-00000004", "rank0.pt", _crafted())
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000002"
    assert warnings == ["checkpoint step-00000004 refused: file rank0.pt holds Python objects "
                        "other than tensors and plain containers"]
    with pytest.raises(CheckpointError) as err:
        CheckpointStore.load_rank(store.root / "step-00000004", 0)
    assert "rank0.pt" in str(err.value) and "weights_only" not in str(err.value)
    assert not Path("/tmp/polytrain-pwned").exists()


@pytest.mark.parametrize("meta", [None, b"{not json", b'{"job_fingerprint": "job"}', b"\xff\xfe"])
def test_missing_or_garbled_meta_falls_back_in_one_line(tmp_path: Path, meta: bytes | None) -> None:
    store = _store(tmp_path)
    _replace(store.root / "step-00000004", "meta.json", meta)
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000002" and len(warnings) == 1
    assert "step-00000004 refused: its meta.json is missing or unreadable" in warnings[0]
    assert "\n" not in warnings[0]


def test_garbled_manifest_and_pointer(tmp_path: Path) -> None:
    store = _store(tmp_path)
    (store.root / "step-00000004" / MANIFEST).write_text('{"files": [1, 2]}')
    (store.root / "LATEST").write_bytes(b"\xff\x00garbage")
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000002"
    assert warnings == [f"checkpoint step-00000004 refused: no readable {MANIFEST} (AttributeError)"]


def test_stale_half_written_checkpoints_are_removed(tmp_path: Path) -> None:
    store = _store(tmp_path, steps=(2,))
    for step in (1, 3, 9):  # a killed run's: before, just after, well after the next commit
        store.stage(step)
        (store.root / f"step-{step:08d}.tmp" / "rank0.pt.part").write_bytes(b"half")
    store.write_rank(4, 0, {"w": torch.zeros(1)})
    store.commit(4, keep=5)
    names = sorted(p.name for p in store.root.iterdir())
    assert names == ["LATEST", "step-00000002", "step-00000004", "step-00000009.tmp"]
    store.remove_stale()  # before a resume starts any rank
    assert not list(store.root.glob("*.tmp"))


@pytest.mark.slow
def test_resume_skips_a_crafted_checkpoint_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    """Through the CLI: the crafted newest checkpoint is named and skipped, the previous one
    resumed; no traceback, no weights_only advice; no torchelastic tree in TMPDIR; stale .tmp
    directories gone."""
    run, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    job = ["--model", "mlp", "--set", "model.hidden=16", "--procs", "2", "--no-report"]
    r = run_cli("train", *job, "--steps", "4", "--checkpoint-every", "2", "--out", str(run), env=env)
    assert r.returncode == 0, r.stderr
    _replace(run / "checkpoints" / "step-00000004", "rank0.pt", _crafted())
    (run / "checkpoints" / "step-00000006.tmp").mkdir()
    r = run_cli("train", "--resume", str(run), "--steps", "6", "--no-report", env=env)
    assert r.returncode == 0, r.stderr
    assert "step-00000004 refused: file rank0.pt holds Python objects" in r.stderr
    assert "resuming from step-00000002" in r.stderr
    assert "Traceback" not in r.stderr and "weights_only" not in r.stderr
    assert not leftovers(tmp) and not (run / "ranks" / "agent").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "LATEST", "step-00000002", "step-00000004", "step-00000006"]



def _saved(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _rewrite_meta(ckpt: Path, **changes: object) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    _replace(ckpt, "meta.json", json.dumps({**meta, **changes}).encode())


@pytest.mark.parametrize(("fault", "says"), [
    (lambda c: _replace(c, "rank0.pt", _saved({"w": torch.zeros(5)})), "w is [5], but [3] was written"),
    (lambda c: _replace(c, "rank0.pt", _saved({"v": torch.zeros(3)})), "file rank0.pt lacks w"),
    (lambda c: (c / "rank1.pt").write_bytes(_saved({"w": torch.zeros(3)})),
     "file rank1.pt is not in its manifest"),
    (lambda c: _rewrite_meta(c, step=-5), "its meta.json says step -5, not the 4 of its name"),
    (lambda c: _rewrite_meta(c, step=190), "its meta.json says step 190, not the 4 of its name"),
])
def test_hash_valid_but_wrong_content_falls_back_in_one_line(tmp_path: Path, fault: object,
                                                             says: str) -> None:
    """Issue 50 item 8: a wrong shape, a missing entry, a file left out of the manifest, a
    meta.json step that is not the checkpoint's: refused by the check every resume runs before
    launch (and again in the ranks), the previous good checkpoint used."""
    store = _store(tmp_path)
    fault(store.root / "step-00000004")  # type: ignore[operator]
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000002" and len(warnings) == 1 and "\n" not in warnings[0]
    assert says in warnings[0], warnings


def test_a_missing_optimizer_entry_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", "job")
    for step in (2, 4):
        store.write_rank(step, 0, {"model": {"w": torch.ones(2)}, "optimizer": {"state": {}, "lr": 0.1}})
        store.commit(step, keep=5)
    _replace(store.root / "step-00000004", "rank0.pt", _saved({"model": {"w": torch.ones(2)}}))
    ckpt, warnings = store.find_good()
    assert ckpt.name == "step-00000002" and "lacks optimizer.lr" in warnings[0]
