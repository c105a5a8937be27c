"""The survivor's line when another rank went away, beyond the two-rank case the slow test runs
(``tests/integration/test_resume_ranks.py``)."""

from __future__ import annotations

from hf_lightning.run.faults import is_peer_lost, peer_lost_message

# gloo's words when the other end of a pair closed (torch/csrc/distributed/c10d, gloo/transport/tcp/pair.cc)
GLOO = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500\n"
    "Exception raised from ... (most recent call first)"
)


def test_among_four_ranks_the_survivor_names_another_rank_and_the_resume_command(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(
        "- +experiment=clm\n- trainer.devices=4\n- ckpt_path=last\n- data.path=my data.jsonl\n"
    )
    err = RuntimeError(GLOO)
    assert is_peer_lost(err) and not is_peer_lost(RuntimeError("CUDA error: an illegal memory access"))
    assert peer_lost_message(err, 2, 4, 7, str(run)) == (
        "another rank stopped during training at optimizer step 7 (rank 2 lost its connection: Connection "
        f"closed by peer), so rank 2 stopped too; the run folder {run} is intact (a checkpoint is written "
        "whole or not at all, so the newest one is complete). See another rank's log for why it stopped, "
        "then resume with: python -m hf_lightning.train +experiment=clm trainer.devices=4 "
        f"'data.path=my data.jsonl' ckpt_path=last hydra.run.dir={run}"
    )
