"""``strategy=fsdp`` (FSDP2) settings that cannot take effect: refused in one line, at config time and by the
strategy itself (Python API), and the lean loss's INFO line when the LM head's weight is still a shard."""

from __future__ import annotations

import logging

import pytest
import torch

from hf_lightning import ConfigError
from hf_lightning.strategies.fsdp import OFFLOAD_ON_CPU, fsdp_config_errors, fsdp_strategy


def test_offload_on_cpu_is_refused_at_config_time():
    errors = fsdp_config_errors({"offload": True, "precision": "32-true"}, "cpu")
    assert errors == [OFFLOAD_ON_CPU]
    assert OFFLOAD_ON_CPU.startswith("strategy.offload=true with trainer.accelerator=cpu")
    assert fsdp_config_errors({"offload": True, "precision": "32-true"}, "gpu") == []


def test_float16_and_unknown_state_dict_type_are_refused():
    with pytest.raises(ConfigError, match=r"^trainer.precision=16-mixed with strategy=fsdp: float16 needs"):
        fsdp_strategy(precision="16-mixed")
    with pytest.raises(ConfigError, match=r"^strategy.state_dict_type='local'; allowed values"):
        fsdp_strategy(state_dict_type="local")
    for precision in ("32-true", "bf16-mixed", "bf16-true"):
        assert fsdp_strategy(precision=precision).precision == precision


def test_lean_loss_falls_back_with_one_info_line_when_the_head_is_a_shard(tmp_path, caplog):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from hf_lightning.module.lean_loss import LeanLoss
    from tests.data_support import tiny_llama

    model = tiny_llama()
    lean = LeanLoss(model)
    assert lean.active
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        head, mesh = model.get_output_embeddings(), init_device_mesh("cpu", (1,))
        ids = torch.tensor([[5, 6, 7, 8]])

        def forward_then_reshard():
            # a unit that frees its gathered weights after its forward leaves a DTensor shard behind
            outputs = model(input_ids=ids)
            head.weight = torch.nn.Parameter(distribute_tensor(head.weight.detach(), mesh))
            return outputs

        with caplog.at_level(logging.INFO, logger="hf_lightning.module.lean_loss"):
            assert lean.forward(forward_then_reshard, ids.shape) is None
            lean.say()
    finally:
        dist.destroy_process_group()
    assert not lean.active
    assert caplog.messages == [
        "the loss is computed from the full logits: the LM head's weight is still sharded after the model's "
        "forward (FSDP2 gathers it for the forward of the unit that holds it only)"
    ]
