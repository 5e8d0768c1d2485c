"""Generate the documentation's tables from the code, so the docs cannot drift from it.

``python -m polytrain.docs_gen`` writes, under ``docs/snippets/``:

- ``options/<strategy>.md``: the strategy's options (name, type, default, meaning), from its
  pydantic ``Options`` class through :func:`polytrain.strategies.describe.option_rows` — the
  same rows ``polytrain strategies NAME`` prints;
- ``strategies.md``: every registered strategy with its family and one-line summary;
- ``supports.md``: the support matrix, from each strategy's ``Strategy.declared()``;
- ``training.md``: the training features' matrix (docs/training.md).

The family pages include these files (``--8<--`` snippets), and README.md's support matrix is
rewritten between its ``supports:begin``/``supports:end`` markers. ``--check`` writes nothing
and exits 1 when a committed file differs from what the code gives (CI and a test run it).
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

from polytrain.runtime.supports import FEATURES

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = Path("docs") / "snippets"
BEGIN, END = "<!-- supports:begin (python -m polytrain.docs_gen) -->", "<!-- supports:end -->"
# Column titles of the support matrix (tests/test_resume_all.py reads README's copy).
FEATURE_TITLES = {"checkpoint": "checkpoint", "resume": "resume", "eval": "--eval-every",
                  "compression": "compression", "torchrun": "torchrun (hosts > 1)",
                  "testbed": "testbed", "lr_schedule": "--lr-schedule", "clip": "--clip-grad-norm",
                  "grad_accum": "--grad-accum", "precision": "--precision",
                  "recompute": "--activation-checkpointing"}


def _cell(value: str) -> str:
    """A value as one markdown table cell: pipes escaped, no line breaks."""
    return value.replace("|", "\\|").replace("\n", " ").strip()


def _code(value: str) -> str:
    """Inline code for a table cell. A pipe inside backticks would stay escaped (``\\|``) in the
    rendered page, so such a value is written as HTML code with the pipe as an entity."""
    if "|" not in value:
        return f"`{value}`"
    return "<code>" + html.escape(value, quote=False).replace("|", "&#124;") + "</code>"


def _table(columns: list[str], rows: list[list[str]]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(_cell(c) for c in r) + " |\n" for r in rows)


def options_table(name: str) -> str:
    """The markdown options table of strategy ``name``."""
    from polytrain.strategies.describe import describe_strategy

    d = describe_strategy(name)
    rows = [[_code(o), _code(t), _code(default), meaning] for o, t, default, meaning in d["options"]]
    if not rows:
        return f"`{name}` takes no options of its own (`--set KEY=VALUE`).\n"
    return _table(["option", "type", "default", "meaning"], rows)


def common_table() -> str:
    """The options every strategy takes."""
    from polytrain.strategies.describe import COMMON

    return _table(["option", "type", "default", "meaning"],
                  [[_code(o), _code(t), _code(d), m] for o, t, d, m in COMMON])


def strategies_table() -> str:
    """id, family and summary of every registered strategy."""
    from polytrain.strategies import registry

    return _table(["id", "family", "what it does"],
                  [[f"`{n}`", c.family, c.summary] for n, c in sorted(registry().items())])


def supports_table() -> str:
    """The support matrix: what each strategy honours whatever its options."""
    from polytrain.strategies import registry

    rows = []
    for name, cls in sorted(registry().items()):
        declared = cls.declared()
        rows.append([f"`{name}`", *("yes" if declared.honours(f) else "no" for f in FEATURES)])
    return _table(["strategy", *(FEATURE_TITLES[f] for f in FEATURES)], rows)


def generated() -> dict[Path, str]:
    """Every generated snippet file (relative to the repository root) and its text."""
    from polytrain.strategies import registry

    out = {SNIPPETS / "options" / f"{n}.md": options_table(n) for n in sorted(registry())}
    out[SNIPPETS / "common-options.md"] = common_table()
    out[SNIPPETS / "strategies.md"] = strategies_table()
    out[SNIPPETS / "supports.md"] = supports_table()
    from polytrain.strategies.describe import training_matrix

    out[SNIPPETS / "training.md"] = training_matrix() + "\n"
    return out


def with_matrix(readme: str) -> str:
    """README text with the support matrix between its markers replaced by the generated one."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md lacks the markers {BEGIN} ... {END}")
    head, rest = readme.split(BEGIN, 1)
    return head + BEGIN + "\n" + supports_table() + END + rest.split(END, 1)[1]


def stale(root: Path = ROOT) -> list[Path]:
    """Files whose committed text differs from what the code generates."""
    bad = [p for p, text in generated().items()
           if not (root / p).exists() or (root / p).read_text() != text]
    readme = root / "README.md"
    if readme.exists() and with_matrix(readme.read_text()) != readme.read_text():
        bad.append(Path("README.md"))
    return bad


def write(root: Path = ROOT) -> list[Path]:
    """Write every generated file (and README's matrix); returns what changed."""
    changed = stale(root)
    for p, text in generated().items():
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text(text)
    readme = root / "README.md"
    if readme.exists():
        readme.write_text(with_matrix(readme.read_text()))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polytrain.docs_gen", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for p in bad:
            print(f"stale: {p} (regenerate: python -m polytrain.docs_gen)", file=sys.stderr)
        return 1 if bad else 0
    for p in write():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
