"""The tokenized split's ``datasets`` cache is keyed by the code that tokenizes.

``Dataset.map`` hashes its function by module and name, not by code, so rows tokenized by an older
hf_lightning (say, chat labels that trained the line break after ``<|im_end|>``) would be served from the
cache to a newer one. The digest of the tokenizing sources is an argument of the map function, so other code
means another cache entry.
"""

from __future__ import annotations

import json
import shutil

import datasets

from hf_lightning.data import tokenize
from hf_lightning.data.tokenize import PACKAGE, tokenize_dataset, tokenizing_code

CHATS = [
    {"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c d"}]},
    {"messages": [{"role": "user", "content": "e"}, {"role": "assistant", "content": "f g h"}]},
]


def _file_backed(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    cache = str(tmp_path / "cache")
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=cache)


def _cache_files(ds):
    return sorted(f["filename"] for f in ds.cache_files)


def test_rows_tokenized_by_other_code_are_not_served_from_the_cache(word_tokenizer, tmp_path, monkeypatch):
    ds = _file_backed(tmp_path)
    first = tokenize_dataset(ds, "messages", word_tokenizer, 64, "train")
    again = tokenize_dataset(ds, "messages", word_tokenizer, 64, "train")
    assert _cache_files(again) == _cache_files(first)  # the same code: the cached rows
    monkeypatch.setattr(tokenize, "tokenizing_code", lambda: "the digest of other tokenizing code")
    other = tokenize_dataset(ds, "messages", word_tokenizer, 64, "train")
    assert _cache_files(other) != _cache_files(first)
    assert other["labels"] == first["labels"]


def test_the_digest_follows_the_tokenizing_sources(tmp_path):
    package = tmp_path / "hf_lightning"
    shutil.copytree(PACKAGE / "data", package / "data", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "core").mkdir()
    shutil.copy(PACKAGE / "core" / "batch.py", package / "core" / "batch.py")
    digest = tokenizing_code.__wrapped__  # uncached: the files change below
    assert digest(package) == tokenizing_code()
    chat = package / "data" / "chat.py"
    chat.write_text(chat.read_text() + "\n# one more line\n")
    assert digest(package) != tokenizing_code()
    (package / "data" / "new_format.py").write_text("")
    shutil.copy(PACKAGE / "data" / "chat.py", chat)
    assert digest(package) != tokenizing_code()
