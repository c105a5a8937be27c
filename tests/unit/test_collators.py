"""Padding collator: exact tensors, written out by hand."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.data.collators import PaddingCollator


def test_labels_padded_by_position_not_by_pad_id():
    # pad = eos = 2: the real EOS at the end of each row stays a target; only padding becomes -100
    batch = PaddingCollator(pad_token_id=2)([{"input_ids": [10, 11, 2]}, {"input_ids": [12, 2]}])
    assert batch["input_ids"].tolist() == [[10, 11, 2], [12, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[10, 11, 2], [12, 2, -100]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_user_labels_are_kept_and_pad_to_multiple_of():
    examples = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        {"input_ids": [8], "labels": [8]},
    ]
    batch = PaddingCollator(pad_token_id=0, pad_to_multiple_of=4)(examples)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [8, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_matches_hf_collator_when_pad_differs_from_eos():
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(20)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")))
    tok.pad_token, tok.eos_token = "t0", "t3"
    rows = [{"input_ids": [5, 6, 7, 3]}, {"input_ids": [9, 3]}, {"input_ids": [4]}]
    hf = DataCollatorForLanguageModeling(tok, mlm=False)(rows)
    ours = PaddingCollator(pad_token_id=0)(rows)
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(ours[key], hf[key]), key


def test_mismatched_labels_are_refused_with_the_example_index():
    with pytest.raises(ValueError, match="example 1: 'labels' has 1 positions but 'input_ids' has 2"):
        PaddingCollator(0)([{"input_ids": [1]}, {"input_ids": [1, 2], "labels": [1]}])


# ------------------------------------------------------------------------------------------ padding-free
def test_padding_free_flattens_with_restarting_positions_and_masked_starts():
    from hf_lightning.data.collators import PaddingFreeCollator, sequence_boundaries
    from hf_lightning.module.loss import count_loss_items

    examples = [{"input_ids": [10, 11, 12, 13]}, {"input_ids": [20, 21, 22]}, {"input_ids": [30, 31]}]
    batch = PaddingFreeCollator()(examples)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 13, 20, 21, 22, 30, 31]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 11, 12, 13, -100, 21, 22, -100, 31]]
    assert "attention_mask" not in batch  # transformers detects packed sequences only without a mask
    assert sequence_boundaries(batch["position_ids"]).tolist() == [0, 4, 7, 9]
    assert count_loss_items(batch) == 6
    flash = PaddingFreeCollator(return_flash_attn_kwargs=True)(examples)
    assert flash["cu_seq_lens_q"].tolist() == [0, 4, 7, 9] and flash["cu_seq_lens_q"].dtype == torch.int32
    assert flash["max_length_q"] == 4


def test_padding_free_matches_hf_data_collator_with_flattening():
    from transformers import DataCollatorWithFlattening

    from hf_lightning.data.collators import PaddingFreeCollator

    examples = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        {"input_ids": [8, 9], "labels": [8, 9]},
        {"input_ids": [3, 4, 5, 6], "labels": [-100, -100, 5, -100]},
    ]
    ours = PaddingFreeCollator(return_flash_attn_kwargs=True)(examples)
    hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(examples)
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(ours[key], hf[key]), key
    assert ours["max_length_q"] == hf["max_length_q"]


def test_padding_free_refuses_padded_rows_and_announces_extra_keys_once(caplog):
    import logging

    from hf_lightning.data.collators import PaddingFreeCollator

    collate = PaddingFreeCollator()
    with pytest.raises(ValueError, match="example 0: attention_mask has zeros"):
        collate([{"input_ids": [1, 2], "attention_mask": [1, 0]}])
    with caplog.at_level(logging.WARNING):
        collate([{"input_ids": [1, 2], "token_type_ids": [0, 0]}])
        collate([{"input_ids": [1, 2], "token_type_ids": [0, 0]}])
    assert caplog.text.count("leaves key 'token_type_ids' out") == 1


def test_padding_collator_announces_uncarried_keys_once_and_stacks_numbers(caplog):
    import logging

    collate = PaddingCollator(0)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            batch = collate(
                [{"input_ids": [1], "text": "x", "id": 7}, {"input_ids": [2, 3], "text": "y", "id": 8}]
            )
    assert "text" not in batch and batch["id"].tolist() == [7, 8]
    assert caplog.text.count("cannot batch key 'text'") == 1


# -------------------------------------------------------------------------------- classification, seq2seq
def test_classification_collator_matches_hf_data_collator_with_padding():
    from transformers import DataCollatorWithPadding

    from hf_lightning.data.collators import ClassificationCollator
    from tests.data_support import make_word_tokenizer

    tok = make_word_tokenizer()
    examples = [
        {"input_ids": [4, 5, 6], "attention_mask": [1, 1, 1], "label": 2},
        {"input_ids": [7], "attention_mask": [1], "label": 0},
    ]
    ours = ClassificationCollator(tok.pad_token_id, pad_to_multiple_of=4)(examples)
    hf = DataCollatorWithPadding(tok, pad_to_multiple_of=4)(examples)
    assert set(ours) == set(hf) == {"input_ids", "attention_mask", "labels"}
    for key in ours:
        assert torch.equal(ours[key], hf[key]), key
    assert ours["labels"].tolist() == [2, 0] and ours["labels"].dtype == torch.long
    assert ours["input_ids"].tolist() == [[4, 5, 6, 0], [7, 0, 0, 0]]
    regression = ClassificationCollator(0)(
        [{"input_ids": [4], "label": 0.5}, {"input_ids": [5], "label": 1.5}]
    )
    assert regression["labels"].dtype == torch.float32


def test_seq2seq_collator_matches_hf_with_decoder_inputs_from_a_real_t5():
    from transformers import DataCollatorForSeq2Seq, T5Config, T5ForConditionalGeneration

    from hf_lightning.data.collators import Seq2SeqCollator
    from tests.data_support import make_word_tokenizer

    tok = make_word_tokenizer()
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=32,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=1,
            num_heads=2,
            pad_token_id=0,
            decoder_start_token_id=0,
            eos_token_id=2,
        )
    )
    examples = [
        {"input_ids": [4, 5, 6, 2], "attention_mask": [1, 1, 1, 1], "labels": [7, 2]},
        {"input_ids": [8, 2], "attention_mask": [1, 1], "labels": [9, 10, 11, 2]},
    ]
    ours = Seq2SeqCollator(tok.pad_token_id, model=model)(examples)
    hf = DataCollatorForSeq2Seq(tok, model=model)(examples)
    assert set(ours) == set(hf)
    for key in ours:
        assert torch.equal(ours[key], hf[key]), key
    assert ours["labels"].tolist() == [[7, 2, -100, -100], [9, 10, 11, 2]]
    # shifted right behind the decoder start token (0), -100 replaced by the pad id (0)
    assert ours["decoder_input_ids"].tolist() == [[0, 7, 2, 0], [0, 9, 10, 11]]
    loss = model(**ours).loss
    assert torch.isfinite(loss)


def test_seq2seq_collator_names_an_example_without_input_ids():
    from hf_lightning.data.collators import Seq2SeqCollator

    with pytest.raises(ValueError, match=r"example 1 has no 'input_ids' \(keys: \['labels'\]\)"):
        Seq2SeqCollator(0)([{"input_ids": [5, 6], "labels": [7]}, {"labels": [8]}])


@pytest.mark.parametrize("junk", [[""], [[], [0]], [[1, 2], [3]]])
def test_rows_torch_would_silently_reshape_are_refused(junk):
    """torch reads [""] as an empty row and sizes [[], [0]] by its first row (dropping the 0); found by the
    fuzz test once it required junk to be rejected."""
    from hf_lightning.core.errors import DataError

    with pytest.raises(DataError, match="a token row must be a list of integer ids"):
        PaddingCollator(pad_token_id=0)([{"input_ids": [1, 2]}, {"input_ids": junk}])
