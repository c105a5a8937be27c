"""A byte-level BPE tokenizer trained on the default corpus with ``tokenizers``, cached on disk.

Special tokens, laid out as Qwen2.5's base tokenizer lays them out: ``<|pad|>`` (padding), ``<|im_start|>``
and ``<|im_end|>`` (ChatML turn markers), and ``<|endoftext|>``, the EOS token: the end of a document. Plain
text ends with it where a document end is written (packed ``text`` rows, a completion), so a causal LM on text
never learns the chat end-of-turn; a chat reply ends with ``<|im_end|>``, which the template writes, and a
model built on this tokenizer stops generating on both (``generation_config.eos_token_id``, see
:func:`~hf_lightning.data.chat.stop_on_end_of_turn`). The chat template marks each assistant reply plus
its ``<|im_end|>`` with ``{% generation %}`` so that ``apply_chat_template(...,
return_assistant_tokens_mask=True)`` finds exactly the trained-on tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hf_lightning.defaults.cache import build_once, cache_root

PAD, IM_START, IM_END, END_OF_TEXT = "<|pad|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, END_OF_TEXT)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _texts(jsonl_path: str):
    with open(jsonl_path, encoding="utf-8") as fh:
        for line in fh:
            for m in json.loads(line)["messages"]:
                yield m["content"]


def train_default_tokenizer(train_file: str, vocab_size: int = 2048) -> str:
    """Train (once) and save a ``PreTrainedTokenizerFast`` on the ``messages`` of ``train_file``.

    Returns:
        The folder holding the saved tokenizer (loads with ``AutoTokenizer.from_pretrained``).
    """
    key = hashlib.sha256(
        Path(train_file).read_bytes() + f"{vocab_size}{CHATML_TEMPLATE}{SPECIAL_TOKENS}".encode()
    ).hexdigest()[:12]
    target = cache_root() / f"tokenizer-bpe{vocab_size}-{key}"

    def build(tmp: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_texts(train_file), trainer=trainer)
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token=PAD,
            eos_token=END_OF_TEXT,
            additional_special_tokens=[IM_START, IM_END],
        )
        hf.chat_template = CHATML_TEMPLATE
        hf.save_pretrained(str(tmp))

    build_once(target, build)
    return str(target)
