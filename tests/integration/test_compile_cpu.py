"""``model.compile=true`` on the CPU (inductor, the machine's C compiler) through the one builder, for the
layouts whose shapes vary from step to step: padded rows (the longest row of each batch), padding-free (one
row of the batch's documents) and packed per batch (a varying number of rows), under accumulation windows of
2 micro-batches. 10 optimizer steps compiled and 10 eager side by side: the weights agree within 1e-3
(relative, per tensor), the micro-batches really had varying shapes, and the end-of-fit line says the model
was compiled once, with no recompilation."""

from __future__ import annotations

import json
import logging

import lightning as L
import pytest
import torch

STEPS = 10
RUN = (
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    f"trainer.max_steps={STEPS}",
    "trainer.max_epochs=-1",
    "trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=4",
    "data.gradient_accumulation_steps=2",
    "scheduler.warmup_steps=0",
    "optim.lr=3e-3",
    "model.config.hidden_size=32",
    "model.config.intermediate_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.num_key_value_heads=2",
    "+experiment=clm",
    "+callbacks.shapes._target_=tests.integration.test_compile_cpu.Shapes",
)
LAYOUTS = {
    "padded": ("data.layout=null",),
    "padding_free": ("data.padding_free=true",),
    "packed_per_batch": (),  # data.layout=auto under sdpa
}
WORDS = "the quick brown fox jumps over the lazy dog and runs far away from home".split(" ")  # noqa: SIM905


class Shapes(L.Callback):
    """The ``input_ids`` shape of every training micro-batch, and the weights before the first step."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []
        self.initial: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module):
        self.initial = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen += [tuple(micro["input_ids"].shape) for micro in batch]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("compile_data") / "text.jsonl"
    texts = [" ".join(WORDS[i % 6 : i % 6 + 3 + i % 9]) for i in range(240)]
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    return path


def run(tmp_path, name, overrides):
    from hf_lightning.config.compose import compose_train
    from hf_lightning.train import train

    # dynamo keeps its compilations of the model class's forward across the runs of one process: a new model
    # instance would count as a recompilation of them
    torch.compiler.reset()
    _, objects = train(compose_train([*RUN, *overrides], output_dir=tmp_path / name))
    shapes = next(c for c in objects["trainer"].callbacks if isinstance(c, Shapes))
    weights = {k: v.detach().clone() for k, v in objects["module"].model.state_dict().items()}
    return weights, shapes.seen, shapes.initial


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_compiled_weights_equal_eager_without_a_recompilation(tmp_path, text_file, caplog, layout):
    overrides = (f"data.path={text_file}", *LAYOUTS[layout])
    eager, eager_shapes, initial = run(tmp_path, "eager", overrides)
    caplog.set_level(logging.INFO, logger="hf_lightning.module.compiled")
    compiled, shapes, _ = run(tmp_path, "compiled", (*overrides, "model.compile=true"))
    assert shapes == eager_shapes and len(shapes) == 2 * STEPS
    assert len(set(shapes)) >= 3, shapes  # the lengths (and, packed per batch, the rows) varied
    assert compiled.keys() == eager.keys()
    for name, weight in eager.items():
        assert rel(compiled[name], weight) <= 1e-3, (name, rel(compiled[name], weight))
    # the control: 10 steps moved the weights far more than the band: a wrong compiled step would fail it
    assert max(rel(weight, initial[name]) for name, weight in eager.items()) > 1e-2
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_lightning.module.compiled"]
    assert lines == [
        "model.compile=true: torch.compile compiled 1 time during fit: 1 first compilation and 0 "
        "recompilations"
    ]
