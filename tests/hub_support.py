"""A hub laid out on disk for tests without the internet: a model in the hub cache the way ``hf download``
leaves it (``models--org--name/refs/main`` + ``snapshots/<sha>/``), a dataset in the ``datasets`` cache the
way ``load_dataset`` of a hub repo leaves it (``org___name/default/0.0.0/<hash>/``, written by ``datasets``'
own json builder), and a stand-in hub server on 127.0.0.1 that records the requests it gets and answers 404.
"""

from __future__ import annotations

import glob
import http.server
import os
import shutil
import threading
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"


def save_tiny_llama(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 64) sized to ``tokenizer``, saved with it by ``save_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lay_out_model(hub_cache: Path, repo_id: str, folder: Path, revision: str = "main") -> Path:
    """Put the files of ``folder`` into ``hub_cache`` as hub repo ``repo_id`` at ``revision``; the
    snapshot."""
    repo = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / SHA
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(SHA)
    return snapshot


def lay_out_dataset(datasets_cache: Path, repo_id: str, files: dict[str, str]) -> Path:
    """Prepare ``files`` (``{split: jsonl path}``) with ``datasets``' json builder into ``datasets_cache``
    under the name ``load_dataset(repo_id)`` looks for offline (config ``default``); the prepared folder."""
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    builder = Json(cache_dir=str(datasets_cache), dataset_name=name, data_files=files, hash="standin")
    builder.download_and_prepare()
    root = Path(datasets_cache) / name
    (config,) = glob.glob(str(root / "default-*"))
    os.rename(
        config, root / "default"
    )  # a hub repo's config is "default"; local files add a hash of their names
    target = Path(datasets_cache) / f"{namespace}___{name}"
    os.rename(root, target)
    return target


class StandInHub:
    """An HTTP server on 127.0.0.1 (use ``HF_ENDPOINT=hub.url``) that answers every request with 404
    ``RepoNotFound`` and keeps the paths it was asked for."""

    def __init__(self) -> None:
        requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                requests.append(self.path)
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("X-Error-Message", "Repository not found")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.requests = requests
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
