"""Counts and losses for encoder-decoder and sequence-classification models, and HF's label smoother.

The oracle is HF itself, run side by side: the model's own ``loss`` (a mean over its targets) on one batch
holding a whole window, and ``transformers.trainer_pt_utils.LabelSmoother`` with ``num_items_in_batch``.
"""

from __future__ import annotations

import pytest
import torch

from hf_lightning import ConfigError, HFLightningModule
from hf_lightning.module.loss import count_loss_items, token_cross_entropy_sum


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    return BartForConditionalGeneration(config).eval()


def _seq2seq_batch():
    return {
        "input_ids": torch.tensor([[0, 5, 6, 7, 2], [0, 8, 9, 2, 1], [0, 10, 2, 1, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
        "labels": torch.tensor([[11, 12, 13, 2], [14, 2, -100, -100], [15, 16, 17, 2]]),
    }


def _rows(batch, idx):
    return {k: v[idx] for k, v in batch.items()}


def test_encoder_decoder_counts_every_label_and_matches_the_model_loss():
    model = _bart()
    module = HFLightningModule(model)
    assert (
        module.causal is False
    )  # HF: ForConditionalGeneration maps to the causal loss, but it is encoder-decoder
    batch = _seq2seq_batch()
    n = module.count_loss_items(batch)
    assert n == 10  # every label != -100, none dropped for a shift
    ours, _ = module.compute_loss(batch, n)
    hf = model(**batch).loss  # HF's mean over all targets (decoder inputs built from labels by the model)
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-6)


def test_encoder_decoder_shares_add_up_to_the_window_loss():
    model = _bart()
    module = HFLightningModule(model)
    batch = _seq2seq_batch()
    n = module.count_loss_items(batch)
    whole = module.compute_loss(batch, n)[0]
    parts = [module.compute_loss(_rows(batch, slice(i, i + 1)), n)[0] for i in range(3)]
    torch.testing.assert_close(torch.stack(parts).sum(), whole, rtol=1e-6, atol=1e-6)
    # and both are HF's mean over the whole batch (independent of compute_loss: a constant loss would fail
    # here)
    torch.testing.assert_close(whole, model(**batch).loss, rtol=1e-6, atol=1e-6)
    # counted per micro-batch on the host, the shares are what the DataModule attaches
    assert sum(module.count_loss_items(_rows(batch, slice(i, i + 1))) for i in range(3)) == n


def _seq_classifier(num_labels: int):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=num_labels,
        pad_token_id=0,
    )
    return LlamaForSequenceClassification(config)


def test_sequence_classification_counts_examples_and_matches_the_model_loss():
    model = _seq_classifier(3)
    module = HFLightningModule(model)
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [10, 11, 12, 13]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([2, 0, 1]),
    }
    assert module.count_loss_items(batch) == 3
    assert count_loss_items({"labels": torch.tensor([2, -100, 1])}) == 2
    ours, _ = module.compute_loss(batch, 3)
    torch.testing.assert_close(ours, model(**batch).loss, rtol=1e-6, atol=1e-6)


def test_regression_labels_need_the_model_loss():
    module = HFLightningModule(_seq_classifier(1))
    batch = {
        "input_ids": torch.tensor([[5, 6]]),
        "attention_mask": torch.tensor([[1, 1]]),
        "labels": torch.tensor([0.5]),
    }
    with pytest.raises(ConfigError, match="use_model_loss"):
        module.compute_loss(batch, 1)
    assert count_loss_items(batch) == 1


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_sum_over_the_window_count_is_hf_label_smoother(shift, eps):
    from transformers.modeling_outputs import CausalLMOutput
    from transformers.trainer_pt_utils import LabelSmoother

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 6, 11, generator=g)
    labels = torch.randint(0, 11, (3, 6), generator=g)
    labels[0, :3] = -100
    labels[2, 4:] = -100
    window_count = 23  # the micro-batch is one part of a larger window
    ours = token_cross_entropy_sum(logits, labels, causal=shift, label_smoothing=eps) / window_count
    hf = LabelSmoother(epsilon=eps)(
        CausalLMOutput(logits=logits), labels, shift_labels=shift, num_items_in_batch=window_count
    )
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-7)


def test_label_smoothing_for_sequence_classification_is_hf_label_smoother():
    from transformers.modeling_outputs import SequenceClassifierOutput
    from transformers.trainer_pt_utils import LabelSmoother

    logits = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([1, 4, -100, 0])
    ours = token_cross_entropy_sum(logits, labels, label_smoothing=0.2) / 3
    hf = LabelSmoother(epsilon=0.2)(SequenceClassifierOutput(logits=logits), labels, num_items_in_batch=3)
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-7)
