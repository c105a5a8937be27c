"""Rank 0's decision about a run reaches the ranks it launches through the environment, and only them."""

from __future__ import annotations

import os

from hf_lightning.run.decision import ENV, RunDecision, agreed_decision, hand_on


def test_a_launched_rank_takes_rank_0s_decision_for_its_own_run_only(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    decision = RunDecision(run, "last", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), False)
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", ENV):
        monkeypatch.delenv(key, raising=False)
    with hand_on(decision):
        assert agreed_decision(run, "last", False) is None  # rank 0 (no rank in the environment) decides
        child = dict(os.environ)  # what Lightning's launcher copies into rank 1
    assert ENV not in os.environ  # put back as it was
    monkeypatch.setenv(ENV, child[ENV])
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert agreed_decision(run, "last", False) == decision
    # another command or run folder with the variable left in its environment decides for itself
    assert agreed_decision(str(tmp_path / "other"), "last", False) is None
    assert agreed_decision(run, None, False) is None
    assert agreed_decision(run, "last", True) is None
    monkeypatch.setenv(ENV, "{not json")
    assert agreed_decision(run, "last", False) is None


def test_hand_on_puts_back_a_previous_value(monkeypatch):
    monkeypatch.setenv(ENV, "before")
    with hand_on(RunDecision("/r", None, None, False)):
        assert os.environ[ENV] != "before"
    assert os.environ[ENV] == "before"
