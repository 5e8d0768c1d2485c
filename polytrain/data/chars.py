"""`chars`: a character-level language-modelling corpus made of Python's own standard library.

The text is the concatenation of the top-level ``*.py`` files of the running interpreter's stdlib
(``sysconfig.get_paths()["stdlib"]``) in sorted name order, cut after ``chars`` tokens. It needs
no network and is the same on every machine with the same Python version. A file that cannot be
read is skipped; undecodable bytes become U+FFFD.

Tokens are UTF-8 bytes (``vocab="bytes"``, 256 classes) or the sorted set of characters seen
(``vocab="chars"``). The first 90% of the tokens train, the last 10% test (a contiguous split, so
no test text leaks into training). Each stream is cut into non-overlapping windows: sample i is
x = s[iT : iT+T] and y = s[iT+1 : iT+T+1] (the next tokens), both (T,) int64.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from polytrain.data.base import Dataset, DatasetEntry, DataSpec, register_dataset
from polytrain.errors import ConfigError

TEST_FRACTION = 0.1


class CharsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seq_len: int = Field(64, ge=1, le=4096, description="T, tokens per sample")
    chars: int = Field(400_000, ge=1000, le=20_000_000, description="corpus length in tokens")
    vocab: Literal["bytes", "chars"] = "bytes"


def stdlib_sources() -> list[Path]:
    """The fixed, sorted list of files the corpus is read from."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


@functools.lru_cache(maxsize=4)
def corpus_text(limit: int) -> str:
    """At least ``limit`` characters of stdlib source (fewer only if the stdlib is smaller)."""
    parts: list[str] = []
    total = 0
    for path in stdlib_sources():
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:  # unreadable or vanished file: the corpus just moves on
            continue
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    return "".join(parts)


@functools.lru_cache(maxsize=4)
def _tokens(limit: int, vocab: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    """(tokens (n,) int64, alphabet) — the alphabet is empty for byte tokens."""
    text = corpus_text(limit)
    if vocab == "bytes":
        raw = bytearray(text.encode("utf-8")[:limit])
        return torch.frombuffer(raw, dtype=torch.uint8).long(), ()
    text = text[:limit]
    alphabet = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(alphabet)}
    return torch.tensor([index[c] for c in text], dtype=torch.int64), alphabet


def _streams(o: CharsOptions) -> tuple[torch.Tensor, torch.Tensor, int]:
    tokens, alphabet = _tokens(o.chars, o.vocab)
    n_test = int(len(tokens) * TEST_FRACTION)
    if n_test < o.seq_len + 1:
        where = sysconfig.get_paths()["stdlib"]
        raise ConfigError(
            f"Dataset 'chars' needs at least {o.seq_len + 1} test tokens for seq_len={o.seq_len}, "
            f"but only {len(tokens)} tokens could be read from {where} (the last "
            f"{TEST_FRACTION:.0%} test). Lower seq_len or raise chars."
        )
    vocab_size = 256 if o.vocab == "bytes" else len(alphabet)
    return tokens[: len(tokens) - n_test], tokens[len(tokens) - n_test :], vocab_size


def _windows(stream: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (x, y) windows: (M, T) each, y shifted one token ahead of x."""
    m = (len(stream) - 1) // length
    x = stream[: m * length].view(m, length)
    y = stream[1 : m * length + 1].view(m, length)
    return x.clone(), y.clone()


def _spec(o: CharsOptions) -> DataSpec:
    train, test, vocab_size = _streams(o)
    sizes = ((len(train) - 1) // o.seq_len, (len(test) - 1) // o.seq_len)
    return DataSpec("chars", "lm", (o.seq_len,), "long", vocab_size, *sizes)


def _build(o: CharsOptions, seed: int) -> Dataset:
    del seed  # fixed corpus and split
    train, test, _ = _streams(o)
    x_train, y_train = _windows(train, o.seq_len)
    x_test, y_test = _windows(test, o.seq_len)
    return Dataset(_spec(o), x_train, y_train, x_test, y_test)


def alphabet(options: CharsOptions | None = None) -> tuple[str, ...]:
    """Characters of the ``vocab="chars"`` vocabulary in id order (to decode samples)."""
    o = options or CharsOptions.model_validate({"vocab": "chars"})
    return _tokens(o.chars, "chars")[1]


register_dataset(
    DatasetEntry(
        name="chars",
        description="next-character prediction on Python's own stdlib source (bytes, T=64)",
        Options=CharsOptions,
        build=_build,
        spec=_spec,
    )
)
