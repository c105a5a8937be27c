"""``data.max_length`` longer than the model's positions.

Before: a GPT-2 with ``n_positions=128`` and the clm default ``max_length=512`` passed setup, then the first
step died with ``IndexError: index out of range in self`` in the position embedding (exit 1 from the command
line). Now it is refused at setup, naming ``data.max_length``, the limit and the config field.

The oracle for the limit is the model itself: a forward pass of ``limit`` tokens runs and one of ``limit + 1``
fails, for every architecture with a position table; a rotary model (Llama) runs past its
``max_position_embeddings``, which is why it gets a WARNING instead (transformers raises nothing there
either).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import datasets
import pytest
import torch
import transformers as T

from hf_lightning import HFDataModule
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import check_positions, position_limit
from tests.data_support import make_word_tokenizer
from tests.errors.support import fit, one_line_error, run_train_cli

TINY = {"vocab_size": 40}


def _models() -> dict:
    """Factories of tiny models with a 32-position limit (RoBERTa: 34 rows, its positions skip 2)."""
    return {
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(n_positions=32, n_embd=16, n_layer=1, n_head=2, **TINY)
        ),
        "gpt_neo": lambda: T.GPTNeoForCausalLM(
            T.GPTNeoConfig(
                max_position_embeddings=32,
                hidden_size=16,
                num_layers=1,
                attention_types=[[["global"], 1]],
                num_heads=2,
                **TINY,
            )
        ),
        "opt": lambda: T.OPTForCausalLM(
            T.OPTConfig(
                max_position_embeddings=32,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                ffn_dim=32,
                word_embed_proj_dim=16,
                **TINY,
            )
        ),
        "roberta": lambda: T.RobertaForCausalLM(
            T.RobertaConfig(
                max_position_embeddings=34,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                is_decoder=True,
                **TINY,
            )
        ),
        "bert_classifier": lambda: T.BertForSequenceClassification(
            T.BertConfig(
                max_position_embeddings=32,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                **TINY,
            )
        ),
        "bart": lambda: T.BartForConditionalGeneration(
            T.BartConfig(
                max_position_embeddings=32,
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                **TINY,
            )
        ),
        "gptj": lambda: T.GPTJForCausalLM(
            T.GPTJConfig(n_positions=32, n_embd=16, n_layer=1, n_head=2, rotary_dim=4, **TINY)
        ),
        "llama": lambda: T.LlamaForCausalLM(
            T.LlamaConfig(
                max_position_embeddings=32,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                **TINY,
            )
        ),
        "t5": lambda: T.T5ForConditionalGeneration(
            T.T5Config(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, n_positions=32, **TINY)
        ),
    }


def _runs(model, length: int) -> bool:
    extra = {"decoder_input_ids": torch.full((1, 4), 5)} if model.config.is_encoder_decoder else {}
    try:
        with torch.no_grad():
            model.eval()(input_ids=torch.full((1, length), 5), **extra)
    except (IndexError, RuntimeError):
        return False
    return True


@pytest.mark.parametrize("arch", list(_models()))
def test_the_limit_is_where_the_model_fails(arch):
    torch.manual_seed(0)
    model = _models()[arch]()
    limit = position_limit(model)
    if arch == "t5":  # relative positions: no limit
        assert limit is None and _runs(model, 200)
        return
    assert limit is not None and limit.tokens == 32, limit
    assert limit.field == ("n_positions" if arch in ("gpt2", "gptj", "t5") else "max_position_embeddings")
    assert limit.value == getattr(model.config, limit.field)
    assert _runs(model, limit.tokens)
    if arch == "llama":
        assert not limit.hard and _runs(model, limit.tokens + 30)  # rotary: runs on, untrained -> a warning
    else:
        assert limit.hard and not _runs(model, limit.tokens + 1)


# ------------------------------------------------------------------------------------------ through fit
WORDS = "abcdefghijklmnopqrstuvwxyz"


def _long_texts(n: int = 12, words: int = 200) -> datasets.Dataset:
    return datasets.Dataset.from_list(
        [{"text": " ".join(WORDS[(i + j) % 26] for j in range(words))} for i in range(n)]
    )


def _gpt2(n_positions: int = 128):
    torch.manual_seed(0)
    config = T.GPT2Config(n_positions=n_positions, n_embd=16, n_layer=1, n_head=2, vocab_size=32)
    return T.GPT2LMHeadModel(config)


TAIL = (
    "is longer than the 128 positions GPT2LMHeadModel has (config.n_positions=128): its position table has "
    "no row past that, so that batch would fail (IndexError; on a GPU a device-side assert). "
)


@pytest.mark.parametrize(
    "data_kwargs,message",
    [
        (  # each row is 200 words, one token per word: 200 tokens
            {"max_length": 512},
            "The longest train row (200 tokens after truncation to data.max_length=512) "
            + TAIL
            + "Set data.max_length=128 or less",
        ),
        (  # packed rows hold several 200-token documents, up to data.max_length
            {"max_length": 512, "packing": "bfd"},
            re.compile(
                r"The longest train row \((\d+) tokens after truncation to data.max_length=512\) "
                + re.escape(TAIL + "Set data.max_length=128 or less")
            ),
        ),
        (  # 128 tokens fit, the padding to a multiple of 48 does not
            {"max_length": 128, "pad_to_multiple_of": 48},
            "The longest train row (128 tokens after truncation to data.max_length=128, padded to 144 by "
            "data.pad_to_multiple_of=48) "
            + TAIL
            + "Set data.max_length=96 or less, or a data.pad_to_multiple_of that divides 128",
        ),
    ],
    ids=["padded", "bfd", "pad_to_multiple_of"],
)
def test_rows_past_the_position_table_are_refused_before_training(tmp_path, data_kwargs, message):
    model = _gpt2()
    assert model.config.n_positions == 128  # the limit in the messages is the model config's
    assert len(_long_texts()[0]["text"].split()) == 200
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dm = HFDataModule(make_word_tokenizer(), path=_long_texts(), per_device_train_batch_size=2, **data_kwargs)
    with pytest.raises(ConfigError) as err:
        fit(tmp_path, model, dm)
    if isinstance(message, str):
        assert str(err.value) == message
    else:
        match = message.fullmatch(str(err.value))
        assert match and 200 < int(match.group(1)) <= 512, str(err.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing trained


def test_a_long_max_length_with_short_rows_trains_and_says_so(tmp_path, caplog):
    """The rows decide: 12-token rows fit a 128-position GPT-2 whatever data.max_length says (HF runs them
    too)."""
    model = _gpt2()
    dm = HFDataModule(
        make_word_tokenizer(), path=_long_texts(words=12), per_device_train_batch_size=2, max_length=512
    )
    with caplog.at_level(logging.WARNING, logger="hf_lightning.data.checks"):
        trainer = fit(tmp_path, model, dm)
    assert trainer.global_step == 1
    assert (
        "data.max_length=512 is longer than GPT2LMHeadModel's 128 positions (config.n_positions=128); no row "
        "of this data is (the longest has 12 tokens), so nothing fails now, but a longer row would: set "
        "data.max_length=128"
    ) in caplog.text


def test_a_stream_is_judged_on_max_length(tmp_path):
    """A stream's rows are not measured ahead: data.max_length itself must fit."""
    model = _gpt2()
    dm = HFDataModule(
        make_word_tokenizer(), path=_long_texts(words=12).to_iterable_dataset(), validation_split=0.0,
        per_device_train_batch_size=2, max_length=512,
    )  # fmt: skip
    with pytest.raises(ConfigError) as err:
        fit(tmp_path, model, dm)
    assert str(err.value) == (
        "data.max_length=512 (the rows of a stream or a torch dataset are not measured ahead) "
        + TAIL
        + "Set data.max_length=128 or less"
    )


def test_max_length_within_the_table_trains(tmp_path):
    model = _gpt2()
    dm = HFDataModule(
        make_word_tokenizer(),
        path=_long_texts(),
        per_device_train_batch_size=2,
        max_length=128,
        pad_to_multiple_of=32,
    )
    trainer = fit(tmp_path, model, dm)
    assert trainer.global_step == 1


def test_rotary_model_past_its_positions_warns_and_trains(tmp_path, caplog):
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=64, use_cache=False, pad_token_id=0,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config)
    dm = HFDataModule(
        make_word_tokenizer(), path=_long_texts(), per_device_train_batch_size=2, max_length=100
    )
    with caplog.at_level(logging.WARNING, logger="hf_lightning.data.checks"):
        trainer = fit(tmp_path, model, dm)
    assert trainer.global_step == 1
    assert (
        "The longest train row (100 tokens after truncation to data.max_length=100) is longer than "
        "LlamaForCausalLM's 64 positions (config.max_position_embeddings=64): its rotary positions go on "
        "without an error, but the model was not trained past position 64"
    ) in caplog.text


def test_check_positions_directly():
    model = _gpt2(n_positions=64)
    check_positions(model, 64)
    check_positions(model, 64, padding_free=True, pad_to_multiple_of=48)  # padding-free rows are not rounded
    with pytest.raises(ConfigError, match=r"^data.max_length=65 is longer than the 64 positions"):
        check_positions(model, 65)


@pytest.mark.slow
def test_clm_default_max_length_on_a_short_gpt2_cli(tmp_path, shared_data):
    """The reported case end to end: ``+experiment=clm`` (max_length 512) with a GPT-2 of 128 positions."""
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "gpt2"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=f"{shared_data}/gpt2-tokenizer/tokenizer.json",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    config = T.GPT2Config(n_positions=128, n_embd=16, n_layer=1, n_head=2, vocab_size=len(tok))
    T.GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    proc = run_train_cli(
        "+experiment=clm",
        f"model.name_or_path={folder}",
        f"data.path={shared_data}/c4-demo/c4_demo.jsonl",
        "trainer.max_steps=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    # the longest row after truncation, measured with the tokenizer itself (the split is 95% of the rows)
    lines = Path(f"{shared_data}/c4-demo/c4_demo.jsonl").read_text().splitlines()
    longest = max(
        len(tok(json.loads(line)["text"], truncation=True, max_length=512)["input_ids"])
        for line in lines
        if line
    )
    assert longest > 128
    line = one_line_error(proc)
    assert re.fullmatch(
        rf"hf_lightning: error: The longest (train|validation) row \({longest} tokens after truncation to "
        rf"data.max_length=512\) " + re.escape(TAIL + "Set data.max_length=128 or less"),
        line,
    ), line
    assert not (tmp_path / "run" / "checkpoints").exists()
