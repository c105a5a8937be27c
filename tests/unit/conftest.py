"""Fixtures of the unit tests (helpers in ``data_support.py``)."""

from __future__ import annotations

import pytest
from data_support import make_word_tokenizer, shared_data


@pytest.fixture(scope="session")
def word_tokenizer():
    return make_word_tokenizer()


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from transformers import PreTrainedTokenizerFast

    path = shared_data() / "gpt2-tokenizer" / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|endoftext|>")
