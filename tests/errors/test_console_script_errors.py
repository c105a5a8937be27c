"""An unknown subcommand of ``hf-lightning``: one line naming it and the commands, status 2."""

from __future__ import annotations

from hf_lightning.cli.main import main


def test_an_unknown_command_is_one_line(capsys):
    assert main(["fit", "+experiment=sft"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "hf_lightning: error: unknown command 'fit': the commands are train, evaluate, inspect, migrate "
        "(hf-lightning --help lists them)\n"
    )
