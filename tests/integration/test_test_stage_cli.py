"""The train command's test stage (lightning-hydra-template's ``train.py`` tests after ``fit``): with
``data.test_path`` the weights the run ends with are tested, and ``test/*`` lands in ``metrics.csv`` and
``final_metrics.json``. The expected ``test/loss`` is the exported ``hf_model/`` run by ``transformers`` on
the test file by hand: the token-weighted mean of its own per-row loss."""

from __future__ import annotations

import csv
import json

import pytest
import torch

pytestmark = pytest.mark.slow

TRAIN = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(16)]
TEST = ["a lazy fox sleeps", "the dog jumps over the quick brown fox twice", "brown dog"]
SMALL = (
    "model.config.hidden_size=32",
    "model.config.intermediate_size=64",
    "model.config.num_hidden_layers=1",
)


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def hand_test_loss(folder) -> float:
    """``hf_model/`` in ``transformers``: each test row tokenized as ``+experiment=clm`` does, its own mean
    loss weighted by its targets (every token after the first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for text in TEST:
            ids = torch.tensor([tokenizer(text, truncation=True, max_length=512)["input_ids"]])
            n = ids.shape[1] - 1
            total += float(model(input_ids=ids, labels=ids).loss) * n
            count += n
    return total / count


def csv_rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("best", [False, True], ids=["final", "load_best_model_at_end"])
def test_the_weights_the_run_ends_with_are_tested(compose_cfg, tmp_path, best):
    from hf_lightning.train import train

    data = tmp_path / "data"
    data.mkdir()
    extra = (
        # validated and saved every step; SGD at a learning rate so high that val/loss goes 6.2, 4.8, 7.1
        (
            "load_best_model_at_end=true",
            "eval_steps=1",
            "save_steps=1",
            "scheduler=constant",
            "optim.name=sgd",
        )
        + ("optim.lr=5",)
        if best
        else ()
    )
    cfg = compose_cfg(
        "+experiment=clm",
        *SMALL,
        f"data.path={write_jsonl(data / 'train.jsonl', TRAIN)}",
        f"data.test_path={write_jsonl(data / 'test.jsonl', TEST)}",
        "trainer.max_steps=3",
        *extra,
    )
    metrics, objects = train(cfg)

    expected = hand_test_loss(tmp_path / "hf_model")
    (tested,) = [r for r in csv_rows(tmp_path / "metrics.csv") if r.get("test/loss")]
    assert int(tested["step"]) == 3  # logged at the run's last optimizer step
    assert float(tested["test/loss"]) == pytest.approx(expected, rel=1e-5)
    saved = json.loads((tmp_path / "final_metrics.json").read_text())
    assert (
        saved["test/loss"] == pytest.approx(expected, rel=1e-5) and metrics["test/loss"] == saved["test/loss"]
    )
    assert saved["test/perplexity"] == pytest.approx(torch.exp(torch.tensor(expected)).item(), rel=1e-5)
    if best:  # not vacuous: the exported (and tested) weights are an earlier step's
        assert saved["best_model_step"] == 2 and saved["global_step"] == 3
