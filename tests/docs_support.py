"""The pages of the documentation and the blocks the tests run from them.

A block a test runs is marked ``<!-- docs-test: NAME -->`` on the line before its fence, on any page (the
README or ``docs/*.md``); names are unique across the pages. A Python block that builds its own stand-ins for
the reader's tokenizer, model and data ends them with :data:`SETUP_END`: a test that brings its own stand-ins
runs the rest (:func:`after_setup`), and ``tests/integration/test_docs_snippets.py`` runs the whole block.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the README, then every docs page, by name
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: the comment line that closes a block's stand-ins for the reader's own objects
SETUP_END = "# (the lines above stand for your own tokenizer, model and data)\n"
_BLOCK = re.compile(r"<!-- docs-test: ([\w-]+) -->\n```(\w*)\n(.*?)```", re.S)


def page_text(name: str) -> str:
    """The text of one page: ``README.md`` or a ``docs/`` page's file name."""
    path = REPO / name if name == "README.md" else REPO / "docs" / name
    return path.read_text()


def marked_blocks() -> dict[str, tuple[str, str, str]]:
    """``name -> (page file name, language, body)`` of every marked block on every page.

    Raises:
        AssertionError: a name marks two blocks.
    """
    found: dict[str, tuple[str, str, str]] = {}
    for path in PAGES:
        for name, language, body in _BLOCK.findall(path.read_text()):
            assert name not in found, (
                f"docs-test: {name} marks a block in {found[name][0]} and in {path.name}"
            )
            found[name] = (path.name, language, body)
    return found


def docs_block(name: str) -> str:
    """The body of the block marked ``name``, wherever it is."""
    return marked_blocks()[name][2]


def after_setup(code: str) -> str:
    """The block without its stand-ins: the lines after :data:`SETUP_END`, with the block's imports (the lines
    before the stand-ins that import)."""
    head, rest = code.split(SETUP_END, 1)
    imports = [line for line in head.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports) + "\n" + rest
