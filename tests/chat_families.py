"""Chat templates as the models ship them, each beside the same template marked with ``{% generation %}``.

``template`` is the model's own chat template, without ``{% generation %}`` markers as shipped: Qwen2.5,
Llama-3, Gemma and Phi-3 read from TRL's stored copies (byte-identical to the models'
``tokenizer_config.json``), Mistral v0.1 and Llama-2 copied here, two ChatML variants written here.
``marked`` is the same template with ``{% generation %}...{% endgeneration %}`` around what the model writes
after the generation prompt: each assistant reply and its end-of-turn token, not the line break or EOS the
template writes after that (Llama-3's writes the header apart from the reply to make room for the markers).
HF's ``apply_chat_template(return_assistant_tokens_mask=True)`` on ``marked`` gives the expected targets;
both render every conversation to the same text (``tests/unit/test_chat_template_families.py`` checks it).

The tokenizer is GPT-2's BPE (``shared/data/gpt2-tokenizer``) with each family's control tokens added as
special tokens and its EOS / BOS set as the model sets them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import trl


@dataclass(frozen=True)
class Family:
    template: str
    marked: str
    eos: str
    bos: str | None = None
    specials: tuple[str, ...] = ()


def _marked(template: str, old: str, new: str) -> str:
    assert template.count(old) == 1, old
    return template.replace(old, new)


def trl_template(name: str) -> str:
    """A model's chat template as TRL stores it for identity comparison (``trl/chat_templates/NAME.jinja``:
    byte-identical to the model's ``tokenizer_config.json``, checked against the hub weekly by TRL's CI)."""
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


# Qwen/Qwen2.5-0.5B (the base model: eos <|endoftext|>, not the end-of-turn <|im_end|>)
QWEN25 = trl_template("qwen2_5")
_QWEN_TURN = "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
QWEN25_MARKED = _marked(
    QWEN25,
    _QWEN_TURN,
    '        {%- if message.role == "assistant" %}\n'
    "            {{- '<|im_start|>' + message.role + '\\n' }}"
    "{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}\n"
    "        {%- else %}\n"
    f"    {_QWEN_TURN}"
    "        {%- endif %}\n",
)

# meta-llama/Meta-Llama-3-8B-Instruct (as first released: eos <|end_of_text|>, end of turn <|eot_id|>)
LLAMA3 = trl_template("llama3")
LLAMA3_MARKED = (  # the same text, the header written apart from the reply so that the reply can be marked
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% if loop.index0 == 0 %}"
    "{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# google/gemma-7b-it (eos <eos>; each turn ends '<end_of_turn>\n'; no system role)
GEMMA = trl_template("gemma")
GEMMA_MARKED = _marked(
    GEMMA,
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}",
    "{{ '<start_of_turn>' + role + '\n' }}{% if role == 'model' %}{% generation %}"
    "{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] | trim + '<end_of_turn>' }}{% endif %}{{ '\n' }}",
)

# microsoft/Phi-3-mini-4k-instruct (eos <|endoftext|>; each turn ends '<|end|>\n'; the conversation ends with
# the EOS unless a generation prompt follows)
PHI3 = trl_template("phi3")
PHI3_MARKED = _marked(
    PHI3,
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}",
    "{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{'\n'}}",
)

# mistralai/Mistral-7B-Instruct-v0.1 (bos <s>, eos </s>: '[INST] ... [/INST]' then the reply and the EOS)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 %"
    " 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
    "user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
MISTRAL_MARKED = _marked(
    MISTRAL,
    "{{ message['content'] + eos_token}}",
    "{% generation %}{{ message['content'] + eos_token}}{% endgeneration %}",
)

# meta-llama/Llama-2-7b-chat-hf (a space before the EOS: ' ' + reply + ' ' + '</s>')
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% "
    "endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
LLAMA2_MARKED = _marked(  # no generation prompt writes the space before the reply: the model writes it
    LLAMA2,
    "{{ ' '  + content.strip() + ' ' + eos_token }}",
    "{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}",
)

# ChatML as most ChatML models ship it ('<|im_start|>role\n' + content + '<|im_end|>\n')
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '"
    "<|im_end|>' "
    "+ '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_MARKED = _marked(
    CHATML,
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}",
)

# ChatML with a line break before the end of turn ('reply\n<|im_end|>\n'), written here: the template text
# a model must write ends with '\n<|im_end|>', the '\n' after it is formatting
CHATML_NEWLINE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'\n<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_NEWLINE_MARKED = _marked(
    CHATML_NEWLINE,
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '\n<|im_end|>\n'}}",
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '\n<|im_end|>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '\n<|im_end|>' }}{% endif %}{{ '\n' }}",
)

FAMILIES = {
    "qwen2.5-chatml": Family(
        QWEN25, QWEN25_MARKED, eos="<|endoftext|>", specials=("<|im_start|>", "<|im_end|>")
    ),
    "llama-3": Family(
        LLAMA3,
        LLAMA3_MARKED,
        eos="<|end_of_text|>",
        bos="<|begin_of_text|>",
        specials=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    ),
    "gemma": Family(
        GEMMA,
        GEMMA_MARKED,
        eos="<eos>",
        bos="<bos>",
        specials=("<start_of_turn>", "<end_of_turn>"),
    ),
    "phi-3": Family(
        PHI3,
        PHI3_MARKED,
        eos="<|endoftext|>",
        specials=("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
    ),
    "mistral-v0.1": Family(MISTRAL, MISTRAL_MARKED, eos="</s>", bos="<s>"),
    "llama-2": Family(LLAMA2, LLAMA2_MARKED, eos="</s>", bos="<s>"),
    "chatml-newline-before-end": Family(
        CHATML_NEWLINE, CHATML_NEWLINE_MARKED, eos="<|endoftext|>", specials=("<|im_start|>", "<|im_end|>")
    ),
    "chatml": Family(CHATML, CHATML_MARKED, eos="<|endoftext|>", specials=("<|im_start|>", "<|im_end|>")),
    # ChatML on GPT-2's own vocabulary: '<|im_end|>' is 7 BPE pieces, not one token
    "chatml-end-in-pieces": Family(CHATML, CHATML_MARKED, eos="<|endoftext|>"),
}


def family_tokenizers(gpt2, name: str):
    """``(unmarked, marked)`` copies of the GPT-2 tokenizer with the family's tokens and templates."""
    fam = FAMILIES[name]
    tok = copy.deepcopy(gpt2)
    extra = {"eos_token": fam.eos}
    if fam.bos:
        extra["bos_token"] = fam.bos
    if fam.specials:
        extra["additional_special_tokens"] = list(fam.specials)
    tok.add_special_tokens(extra)
    tok.chat_template = fam.template
    marked = copy.deepcopy(tok)
    marked.chat_template = fam.marked
    return tok, marked
