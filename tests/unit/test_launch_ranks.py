"""Ranks > 0 started by a cluster launcher log to their own file in rank 0's run folder."""

from __future__ import annotations

import pytest

from hf_lightning.strategies.launch import other_rank_overrides

OWN = ["hydra.output_subdir=null"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, []),
        ({"RANK": "0", "LOCAL_RANK": "0"}, []),  # torchrun, rank 0
        ({"RANK": "3", "LOCAL_RANK": "1"}, ["hydra.job.name=train_rank_3", *OWN]),  # torchrun, rank 3
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, ["hydra.job.name=train_rank_1", *OWN]),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, []),
        ({"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}, ["hydra.job.name=train_node_1", *OWN]),
    ],
)
def test_other_ranks_get_their_own_log(environ, expected):
    assert other_rank_overrides(["+experiment=sft"], environ) == expected


def test_a_command_line_that_names_the_job_is_left_alone():
    """Lightning's own children come with hydra.job.name=train_ddp_process_N and LOCAL_RANK set."""
    args = ["+experiment=sft", "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    assert other_rank_overrides(args, {"LOCAL_RANK": "1", "NODE_RANK": "1"}) == []


def test_the_rendezvous_variables_are_put_back_after_one_process_only(monkeypatch):
    """After a one-process run the launcher's variables go; after several, rank 0 keeps them (Lightning reads
    ``LOCAL_RANK`` to not start the other ranks again at a later ``trainer.test()``)."""
    from hf_lightning.strategies.launch import rendezvous_variables, restore_rendezvous

    monkeypatch.setenv("MASTER_PORT", "29511")
    for key in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    saved = rendezvous_variables()
    launched = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "40000", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    for key, value in launched.items():
        monkeypatch.setenv(key, value)
    restore_rendezvous(saved, world_size=2)
    assert {key: value for key, value in rendezvous_variables().items() if value is not None} == launched
    restore_rendezvous(saved, world_size=1)
    assert rendezvous_variables() == {
        "MASTER_ADDR": None,
        "MASTER_PORT": "29511",
        "RANK": None,
        "WORLD_SIZE": None,
        "LOCAL_RANK": None,
    }
