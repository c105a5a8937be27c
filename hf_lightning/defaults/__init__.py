"""The embedded default run: real chat data from ``chatterbot-corpus``, a tokenizer trained on it, and a small
Llama-architecture model built from a config. Nothing here touches the network."""

from hf_lightning.defaults.chatterbot import prepare_chatterbot
from hf_lightning.defaults.tokenizer import CHATML_TEMPLATE, train_default_tokenizer

__all__ = ["CHATML_TEMPLATE", "prepare_chatterbot", "train_default_tokenizer"]
