"""Assistant-only targets of fastchat-dummy under chat templates without ``{% generation %}`` markers.

    python scripts/chat_targets.py      # HF_LIGHTNING_SHARED_DATA=DIR to read the data elsewhere

The ShareGPT file (500 conversations, 1,000 assistant replies) goes through ``HFDataModule`` as ``data.path``
with GPT-2's BPE, each template's control tokens added as special tokens and its EOS set as the model sets it
(ChatML and Qwen2.5: ``<|endoftext|>``, the Qwen2.5 base models' setup). Per template it prints the targets
(labels other than -100) hf_lightning trains, the same count by hand (each reply's tokens plus one end-of-turn
token), and, for the templates TRL ships a training variant of (``trl/chat_templates/NAME_training.jinja``,
which TRL's ``assistant_only_loss`` swaps in), the tokens HF's ``return_assistant_tokens_mask`` marks with it.
The templates are the models' own, as TRL stores them (``trl/chat_templates/NAME.jinja``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path

import datasets
import trl
from transformers import PreTrainedTokenizerFast

from hf_lightning import HFDataModule

DATA = Path(
    os.environ.get("HF_LIGHTNING_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
)
FASTCHAT = DATA / "fastchat-dummy" / "dummy_conversation.json"
TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# template name -> (template, EOS, control tokens, end-of-turn token, TRL training variant or None)
TEMPLATES = {
    "chatml": (CHATML, "<|endoftext|>", ["<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
    "qwen2_5": (None, "<|endoftext|>", ["<|im_start|>", "<|im_end|>"], "<|im_end|>", "qwen2_5_training"),
    "llama3": (
        None,
        "<|end_of_text|>",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|eot_id|>",
        "llama3_training",
    ),
    "gemma": (
        None,
        "<eos>",
        ["<bos>", "<start_of_turn>", "<end_of_turn>"],
        "<end_of_turn>",
        "gemma_training",
    ),
    "phi3": (
        None,
        "<|endoftext|>",
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        "<|end|>",
        "phi3_training",
    ),
}


def _tokenizer(template: str, eos: str, specials: list[str]) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(DATA / "gpt2-tokenizer" / "tokenizer.json"), pad_token="<|endoftext|>"
    )
    extra = {"eos_token": eos, "additional_special_tokens": specials}
    if "<bos>" in specials:
        extra["bos_token"] = "<bos>"
    if "<|begin_of_text|>" in specials:
        extra["bos_token"] = "<|begin_of_text|>"
    tok.add_special_tokens(extra)
    tok.chat_template = template
    return tok


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("hf_lightning").setLevel(logging.ERROR)  # the DataModule's setup lines, per template
    datasets.disable_progress_bars()
    speaker = {"human": "user", "gpt": "assistant"}
    rows = json.loads(FASTCHAT.read_text())
    conversations = [
        [{"role": speaker[t["from"]], "content": t["value"]} for t in r["conversations"]] for r in rows
    ]
    replies = [m["content"] for c in conversations for m in c if m["role"] == "assistant"]
    print(f"{FASTCHAT}: {len(conversations)} conversations, {len(replies)} assistant replies")
    print(f"{'template':<10} {'EOS':<16} {'hf_lightning':>12} {'by hand':>8} {'TRL training template':>22}")
    for name, (template, eos, specials, end_of_turn, training) in TEMPLATES.items():
        template = template or (TRL_TEMPLATES / f"{name}.jinja").read_text()
        tok = _tokenizer(template, eos, specials)
        dm = HFDataModule(tok, path=str(FASTCHAT), validation_split=0.0, shuffle=False)
        dm.setup()
        ours = sum(sum(t != -100 for t in labels) for labels in dm.train_dataset["labels"])
        by_hand = sum(len(tok.encode(r.strip(), add_special_tokens=False)) + 1 for r in replies)
        theirs = "-"
        if training:
            marked = copy.deepcopy(tok)
            marked.chat_template = (TRL_TEMPLATES / f"{training}.jinja").read_text()
            masks = [
                marked.apply_chat_template(
                    c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
                )["assistant_masks"]
                for c in conversations
            ]
            theirs = f"{sum(map(sum, masks)):,}"
        print(f"{name:<10} {eos:<16} {ours:>12,} {by_hand:>8,} {theirs:>22}  (end of turn {end_of_turn})")


if __name__ == "__main__":
    main()
