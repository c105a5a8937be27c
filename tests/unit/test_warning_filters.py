"""Warnings: the library installs no process-wide filter; the commands install theirs.

``lightning_module.py`` used to install three ``warnings.filterwarnings`` at import time, hiding them from
every application that imported ``hf_lightning``; one of them hid the warning Lightning gives on every fit
where both the LightningModule and the DataModule define ``transfer_batch_to_device``. The hook is now the
DataModule's alone, so Lightning has nothing to warn about, and the two remaining filters live in
``hf_lightning/cli/process.py``.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import datasets
import lightning as L
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.cli.process import HIDDEN_WARNINGS, hide_library_warnings
from tests.data_support import PadOnly
from tests.unit.hand_case import TableLM
from tests.unit.test_evaluation import ROWS

OURS = ("transfer_batch_to_device", "logging interval")


def test_importing_the_library_installs_no_warning_filter():
    """In a fresh interpreter: pytest's own ``catch_warnings`` around collection would hide an import-time
    filter."""
    code = (
        "import warnings, hf_lightning, hf_lightning.train, hf_lightning.evaluate, "
        "hf_lightning.inspect_batch\nprint([f[1].pattern for f in warnings.filters if f[1] is not None\n"
        f"       and any(s in f[1].pattern for s in {OURS})])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_commands_hide_the_two_lightning_warnings():
    with warnings.catch_warnings():
        hide_library_warnings()
        count = len(warnings.filters)
        hide_library_warnings()  # a multirun's next job
        assert len(warnings.filters) == count
        installed = {f[1].pattern for f in warnings.filters if f[0] == "ignore" and f[1] is not None}
    assert {message for message, _ in HIDDEN_WARNINGS} <= installed


def test_a_fit_with_the_datamodule_gets_no_transfer_hook_warning(tmp_path):
    """Lightning warns when the LightningModule and the DataModule both override
    ``transfer_batch_to_device``."""
    ds = datasets.Dataset.from_list(ROWS)
    dm = HFDataModule(PadOnly(), path=ds, validation_path=ds, per_device_eval_batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.validate(HFLightningModule(TableLM()), datamodule=dm, verbose=False)
    assert not [w for w in caught if "transfer_batch_to_device" in str(w.message)]


def test_the_datamodule_moves_a_flat_batch_and_keeps_its_counts():
    dm = HFDataModule(PadOnly(), path=datasets.Dataset.from_list(ROWS))
    batch = {"input_ids": torch.tensor([[1, 2]]), "num_items_in_batch": 3}
    moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert moved["num_items_in_batch"] == 3 and torch.equal(moved["input_ids"], batch["input_ids"])
    assert dm.transfer_batch_to_device([torch.ones(1)], torch.device("cpu"), 0)[0].item() == 1.0


def test_a_flat_batch_skips_lightnings_collection_walk(monkeypatch):
    """The fast path: a flat dict batch never reaches Lightning's ``move_data_to_device``
    (``apply_to_collection``, ~6x slower per micro-batch with the window's ``int`` counts in it); a list batch
    still does."""
    import lightning.pytorch.core.hooks as hooks

    walked = []
    real = hooks.move_data_to_device
    monkeypatch.setattr(hooks, "move_data_to_device", lambda b, d: walked.append(b) or real(b, d))
    dm = HFDataModule(PadOnly(), path=datasets.Dataset.from_list(ROWS))
    dm.transfer_batch_to_device(
        {"input_ids": torch.tensor([[1, 2]]), "num_items_in_batch": 3}, torch.device("cpu"), 0
    )
    assert walked == []
    dm.transfer_batch_to_device([torch.ones(1)], torch.device("cpu"), 0)
    assert len(walked) == 1


def test_the_commands_hide_deepspeeds_cpu_notice_only_in_a_fresh_process():
    """A command's process: DeepSpeed's import-time "Setting accelerator to CPU" WARNING (accelerate imports
    DeepSpeed whenever it is installed) is dropped, another DeepSpeed record passes, and a second call adds no
    second filter."""
    code = (
        "import logging\n"
        "from hf_lightning.cli.process import hide_library_warnings\n"
        "hide_library_warnings(); hide_library_warnings()\n"
        "log = logging.getLogger('DeepSpeed')\n"
        "seen = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record): seen.append(record.getMessage())\n"
        "log.addHandler(Keep()); log.propagate = False\n"
        "log.warning('Setting accelerator to CPU. If you have GPU or other accelerator, ...')\n"
        "log.warning('ZeRO stage 3 offload')\n"
        "print(len(log.filters), seen)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1 ['ZeRO stage 3 offload']"
