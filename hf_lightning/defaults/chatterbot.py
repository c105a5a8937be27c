"""chatterbot-corpus (PyPI) English conversations as chat ``messages`` JSONL files.

Each corpus file holds ``conversations``: lists of utterances that alternate speakers without role names.
The first speaker becomes ``user``, the second ``assistant``, and so on; a trailing utterance with no reply
is dropped (there is nothing to train on after it), and single-utterance conversations are skipped. Every
20th conversation (in sorted-file order) is held out for validation: deterministic, no RNG involved.
"""

from __future__ import annotations

import hashlib
import json
import logging
from importlib import resources
from pathlib import Path

import yaml

from hf_lightning.defaults.cache import build_once, cache_root

log = logging.getLogger(__name__)

VALIDATION_EVERY = 20


def corpus_files(language: str = "english") -> list[Path]:
    """The corpus YAML files of one language, sorted by name."""
    root = resources.files("chatterbot_corpus") / "data" / language
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yml"))


def load_conversations(language: str = "english") -> list[list[dict[str, str]]]:
    """All conversations of one language as lists of ``{"role", "content"}`` messages."""
    conversations = []
    dropped_turns = 0
    for path in corpus_files(language):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for utterances in doc.get("conversations", []):
            turns = [str(u).strip() for u in utterances]
            if len(turns) % 2:
                turns = turns[:-1]
                dropped_turns += 1
            if not turns:
                continue
            roles = ("user", "assistant")
            conversations.append([{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)])
    log.info(
        "chatterbot-corpus/%s: %d conversations (%d trailing unanswered turns dropped)",
        language,
        len(conversations),
        dropped_turns,
    )
    return conversations


def prepare_chatterbot(language: str = "english") -> dict[str, str]:
    """Write the corpus once as ``train.jsonl`` / ``validation.jsonl`` and return their paths.

    Returns:
        ``{"train": path, "validation": path}``; files of ``{"messages": [...]}`` records.
    """
    files = corpus_files(language)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]
    target = cache_root() / f"chatterbot-{language}-{digest}"

    def build(tmp: Path) -> None:
        convs = load_conversations(language)
        with (
            open(tmp / "train.jsonl", "w", encoding="utf-8") as tr,
            open(tmp / "validation.jsonl", "w", encoding="utf-8") as va,
        ):
            for i, messages in enumerate(convs):
                out = va if i % VALIDATION_EVERY == 0 else tr
                out.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")

    build_once(target, build)
    return {"train": str(target / "train.jsonl"), "validation": str(target / "validation.jsonl")}
