"""``preprocess_logits_for_metrics`` under the lean loss: applied to the logits of chunks of positions, never
to a batch's whole ``(B, L, V)`` logits, with HF ``Trainer``'s metrics; a function that is not position-wise
is found on the first batch and gets the whole logits."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hf_lightning import HFLightningModule
from tests.data_support import tiny_llama
from tests.unit.test_evaluation import _equal_target_rows, _hf_pad, _hf_trainer, validate

VOCAB = 300  # at least LEAN_MIN_VOCAB: module.lean_loss=null takes the lean loss
CHUNK = 5  # positions per chunk: a 2 x 12 batch is cut into 5 chunks, the last of 4


def _rows():
    rows = _equal_target_rows(n=7, length=12, vocab=VOCAB, seed=3)  # 7 rows: a ragged last batch
    rows[3] = {"input_ids": rows[3]["input_ids"][:7], "labels": rows[3]["labels"][:7]}  # a shorter row
    rows[5]["labels"] = [-100] * 4 + rows[5]["labels"][4:]  # a prompt without targets
    return rows


def _compute_metrics(seen):
    def compute_metrics(p):
        preds, labels = p.predictions, p.label_ids
        seen["predictions"] = preds
        top = preds if preds.ndim == 2 else preds.argmax(-1)
        if top.shape != labels.shape:  # one value per row
            return {"total": float(preds.sum())}
        mask = labels[:, 1:] != -100
        return {"accuracy": float((top[:, :-1] == labels[:, 1:])[mask].mean()), "total": float(preds.sum())}

    return compute_metrics


def _side_by_side(tmp_path, preprocess, **module_kwargs):
    """HF ``Trainer.evaluate`` and ours on the same rows and model: (hf metrics, hf predictions, ours,
    our predictions, the logits shapes ``preprocess`` saw on our side, our module)."""
    hf_seen, our_seen, shapes = {}, {}, []
    hf = _hf_trainer(
        tiny_llama(vocab_size=VOCAB),
        _rows(),
        tmp_path,
        compute_metrics=_compute_metrics(hf_seen),
        preprocess_logits_for_metrics=preprocess,
        data_collator=_hf_pad,
    ).evaluate()

    def recorded(logits, labels):
        shapes.append(tuple(logits.shape))
        return preprocess(logits, labels)

    module = HFLightningModule(
        tiny_llama(vocab_size=VOCAB),
        compute_metrics=_compute_metrics(our_seen),
        preprocess_logits_for_metrics=recorded,
        **module_kwargs,
    )
    module.lean.chunk_size = CHUNK
    assert module.lean.active is (module_kwargs.get("lean_loss", True) is not False)
    ours, _, _ = validate(module, _rows())
    return hf, hf_seen["predictions"], ours, our_seen["predictions"], shapes, module


def test_argmax_runs_on_chunks_and_matches_hf_trainer(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hf_lightning")
    hf, hf_preds, ours, preds, shapes, module = _side_by_side(
        tmp_path, lambda logits, labels: logits.argmax(-1)
    )
    np.testing.assert_array_equal(preds, hf_preds)
    assert preds.shape == (7, 12)
    assert ours["val/accuracy"] == pytest.approx(hf["eval_accuracy"], rel=1e-6)
    assert ours["val/total"] == hf["eval_total"]
    assert ours["val/loss"] == pytest.approx(hf["eval_loss"], rel=1e-3)  # HF: a mean of batch means
    # the first batch's check (after its 5 chunks): its two rows' first CHUNK // 2 positions taken whole
    assert shapes[5] == (2, CHUNK // 2, VOCAB)
    chunked = shapes[:5] + shapes[6:]
    assert all(s[0] == 1 and s[1] <= CHUNK and s[2] == VOCAB for s in chunked)
    assert sum(s[1] for s in chunked) == 2 * 12 * 3 + 1 * 12  # every position of the 4 batches once
    assert module.preprocess_chunks is True
    said = [r.getMessage() for r in caplog.records if "at most 5 positions at a time" in r.getMessage()]
    assert len(said) == 1 and "checked on the first batch" in said[0]
    # compute_metrics' own "accuracy" replaces the built-in token accuracy, said once
    messages = [r.getMessage() for r in caplog.records]
    replaced = [m for m in messages if "replaces the built-in val/accuracy" in m]
    assert len(replaced) == 1 and "'accuracy'" in replaced[0]


def test_a_vector_per_position_matches_hf_trainer(tmp_path):
    """Log-probabilities of the top 3 tokens: a float result with a trailing dimension."""

    def top3(logits, labels):
        return torch.log_softmax(logits.float(), -1).topk(3, dim=-1).values

    hf, hf_preds, ours, preds, shapes, module = _side_by_side(tmp_path, top3)
    assert preds.shape == hf_preds.shape == (7, 12, 3)
    np.testing.assert_allclose(preds, hf_preds, rtol=1e-5, atol=1e-6)  # -100 padding included
    assert ours["val/total"] == pytest.approx(hf["eval_total"], rel=1e-5)
    assert module.preprocess_chunks is True


def test_a_function_over_the_sequence_is_found_and_gets_whole_logits(tmp_path, caplog):
    """A softmax over positions is not position-wise: its chunked results differ on the first batch, so
    every batch gets its whole logits and the results are HF's."""
    caplog.set_level(logging.INFO, logger="hf_lightning")

    def over_positions(logits, labels):
        return torch.softmax(logits.float(), dim=1).amax(-1)

    hf, hf_preds, ours, preds, shapes, module = _side_by_side(tmp_path, over_positions)
    np.testing.assert_allclose(preds, hf_preds, rtol=1e-5, atol=1e-7)
    assert ours["val/total"] == pytest.approx(hf["eval_total"], rel=1e-5)
    assert module.preprocess_chunks is False
    # the first batch: its chunks, the check, then its whole logits; then whole batches only
    assert shapes[5:] == [(2, CHUNK // 2, VOCAB)] + [(2, 12, VOCAB)] * 3 + [(1, 12, VOCAB)]
    said = [r.getMessage() for r in caplog.records if "not position-wise" in r.getMessage()]
    assert len(said) == 1 and "differ from those on the whole logits" in said[0]
    # and no line claimed the chunked path before the check found it out
    assert not any("positions at a time" in r.getMessage() for r in caplog.records)


def test_a_result_without_positions_is_found_and_gets_whole_logits(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hf_lightning")

    def per_row(logits, labels):
        return logits.argmax(-1).sum(-1, keepdim=True)  # (B, 1): one value per row

    hf, hf_preds, ours, preds, shapes, module = _side_by_side(tmp_path, per_row)
    np.testing.assert_array_equal(preds, hf_preds)
    assert module.preprocess_chunks is False
    said = [r.getMessage() for r in caplog.records if "not position-wise" in r.getMessage()]
    assert len(said) == 1 and f"for logits of shape (1, {CHUNK}, {VOCAB})" in said[0]


def test_declared_position_wise_never_sees_whole_logits(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hf_lightning")
    hf, hf_preds, ours, preds, shapes, _ = _side_by_side(
        tmp_path, lambda logits, labels: logits.argmax(-1), preprocess_logits_position_wise=True
    )
    np.testing.assert_array_equal(preds, hf_preds)
    assert all(s[0] == 1 and s[1] <= CHUNK for s in shapes)
    said = [r.getMessage() for r in caplog.records if "positions at a time" in r.getMessage()]
    assert len(said) == 1 and "(declared position-wise)" in said[0]


def test_declared_not_position_wise_gets_whole_logits(tmp_path):
    hf, hf_preds, ours, preds, shapes, _ = _side_by_side(
        tmp_path, lambda logits, labels: logits.argmax(-1), preprocess_logits_position_wise=False
    )
    np.testing.assert_array_equal(preds, hf_preds)
    assert [s[0] for s in shapes] == [2, 2, 2, 1]


def test_predict_step_takes_the_argmax_chunk_by_chunk():
    """The lean path's predictions equal the full logits' argmax, with a chunk smaller than a row."""
    batch = _hf_pad(_rows())
    lean = HFLightningModule(tiny_llama(vocab_size=VOCAB))
    lean.lean.chunk_size = CHUNK
    plain = HFLightningModule(tiny_llama(vocab_size=VOCAB), lean_loss=False)
    assert lean.lean.active and not plain.lean.active
    with torch.no_grad():
        ours, theirs = lean.predict_step(batch, 0), plain.predict_step(batch, 0)
    assert ours == theirs
    assert sum(len(r["positions"]) for r in ours) == sum(
        sum(x != -100 for x in r["labels"][1:]) for r in _rows()
    )


def _at_targets(preds, labels):
    """HF's predictions with -100 where the shifted label is -100 (the positions without a loss target)."""
    targets = np.full_like(labels, -100)
    targets[:, :-1] = labels[:, 1:]
    return np.where(targets != -100, preds, -100), int((targets != -100).sum())


@pytest.mark.parametrize("lean_loss", [None, False])
def test_targets_only_runs_the_head_at_the_targets_and_keeps_hfs_accuracy(tmp_path, caplog, lean_loss):
    """preprocess_logits_positions='targets': the function sees only the positions with a target (lean: in
    chunks of at most CHUNK of them, no check on whole logits); elsewhere the predictions are -100, and the
    accuracy over the labelled positions is HF's. Without the lean loss, the same predictions."""
    caplog.set_level(logging.INFO, logger="hf_lightning")
    hf, hf_preds, ours, preds, shapes, module = _side_by_side(
        tmp_path,
        lambda logits, labels: logits.argmax(-1),
        preprocess_logits_positions="targets",
        lean_loss=lean_loss,
    )
    labels = np.stack(
        [np.pad(r["labels"], (0, 12 - len(r["labels"])), constant_values=-100) for r in _rows()]
    )
    expected, n_targets = _at_targets(hf_preds, labels)
    np.testing.assert_array_equal(preds, expected)
    assert (preds == -100).sum() > (hf_preds == -100).sum()  # the prompt's and last positions too
    assert ours["val/accuracy"] == pytest.approx(hf["eval_accuracy"], rel=1e-6)
    if lean_loss is None:
        assert all(s[0] == 1 and 1 <= s[1] <= CHUNK and s[2] == VOCAB for s in shapes)
        assert sum(s[1] for s in shapes) == n_targets  # each target position once, no other
        said = [r.getMessage() for r in caplog.records if "positions with a target only" in r.getMessage()]
        assert len(said) == 1
    else:
        assert [s[0] for s in shapes] == [2, 2, 2, 1]


def test_targets_only_refuses_a_result_that_cannot_hold_minus_100(tmp_path):
    module = HFLightningModule(
        tiny_llama(vocab_size=VOCAB),
        compute_metrics=lambda p: {},
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1) == labels,
        preprocess_logits_positions="targets",
    )
    with pytest.raises(TypeError, match="torch.bool cannot hold"):
        validate(module, _rows())


def test_targets_only_needs_a_position_wise_function():
    from hf_lightning.core.errors import ConfigError

    argmax = lambda logits, labels: logits.argmax(-1)  # noqa: E731
    with pytest.raises(ConfigError, match="pass preprocess_logits_for_metrics too"):
        HFLightningModule(tiny_llama(vocab_size=VOCAB), preprocess_logits_positions="targets")
    with pytest.raises(ConfigError, match="cannot go with preprocess_logits_position_wise=False"):
        HFLightningModule(
            tiny_llama(vocab_size=VOCAB),
            preprocess_logits_for_metrics=argmax,
            preprocess_logits_positions="targets",
            preprocess_logits_position_wise=False,
        )
    with pytest.raises(ConfigError, match="preprocess_logits_positions"):
        HFLightningModule(tiny_llama(vocab_size=VOCAB), preprocess_logits_positions="labels")


def test_a_batch_without_targets_gives_minus_100_in_the_functions_dtype():
    from hf_lightning.module.linear_cross_entropy import linear_cross_entropy_predictions

    torch.manual_seed(0)
    hidden, weight = torch.randn(6, 8), torch.randn(VOCAB, 8)
    none = torch.full((6,), -100)

    def top2(logits, labels):
        return logits.topk(2, dim=-1).values

    loss, correct, preds = linear_cross_entropy_predictions(
        hidden, weight, none, none, top2, targets_only=True
    )
    assert preds.shape == (1, 6, 2) and preds.dtype == torch.float32 and (preds == -100).all()
    assert loss.item() == 0 and correct.item() == 0
    targets = torch.tensor([-100, 3, -100, -100, 7, 9])
    _, _, some = linear_cross_entropy_predictions(hidden, weight, targets, none, top2, targets_only=True)
    whole = (hidden @ weight.T).topk(2, dim=-1).values
    keep = targets != -100
    torch.testing.assert_close(some[0][keep], whole[keep])
    assert (some[0][~keep] == -100).all()


@pytest.mark.parametrize("lean_loss", [None, False])
def test_targets_only_refuses_a_function_without_positions(lean_loss):
    module = HFLightningModule(
        tiny_llama(vocab_size=VOCAB),
        compute_metrics=lambda p: {},
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1).sum(-1, keepdim=True),
        preprocess_logits_positions="targets",
        lean_loss=lean_loss,
    )
    with pytest.raises(ValueError, match="one value \\(or vector\\) per position \\(it returned \\("):
        validate(module, _rows())
