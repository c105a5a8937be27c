"""The commands in README.md and docs/migration.md work as written.

Every ``python -m hf_lightning.(train|inspect_batch|evaluate)`` command, in a code block or inline, composes with
Hydra and passes the schema; every override written in backticks in the migration tables names a key or a group
option that exists. The migration tutorial is run for real, block by block, from a fresh folder.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "docs" / "migration.md"]
ENTRY = re.compile(r"python -m hf_lightning\.(train|inspect_batch|evaluate)\b")
SHARED = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block."""
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def documented_commands() -> list[tuple[str, str]]:
    """``(file name, command)`` for every entry-point command, continuation lines joined."""
    found = []
    for path in DOCS:
        text = path.read_text()
        chunks = [body for lang, body in code_blocks(text) if lang in ("bash", "")]
        chunks += re.findall(r"`([^`\n]*python -m hf_lightning[^`\n]*)`", text.replace("`\n", "` "))
        # an inline command may wrap onto the next line inside its backticks
        chunks += [m.replace("\n", " ") for m in re.findall(r"`(python -m hf_lightning[^`]*)`", text)]
        for chunk in chunks:
            for line in chunk.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                if ENTRY.match(line):
                    found.append((path.name, " ".join(line.split())))
    return sorted(set(found))


def compose(config_name: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hf_lightning.config.compose import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=overrides)
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.output_dir = "/tmp/unused"
    return cfg


def overrides_of(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    entry = words[2].split(".")[1]
    rest = [w for w in words[3:] if w not in ("-m", "--multirun") and not w.startswith("--cfg") and w != "job"]
    multirun = "-m" in words or "--multirun" in words
    # a sweep composes once per value; the first value stands for all of them
    rest = [w.split(",")[0] if multirun and "=" in w and "[" not in w else w for w in rest]
    return entry, rest


def test_the_docs_name_commands():
    commands = documented_commands()
    files = {name for name, _ in commands}
    assert files == {"README.md", "migration.md"}
    assert len(commands) >= 10, commands


@pytest.mark.parametrize("source,command", documented_commands())
def test_every_documented_command_composes_and_passes_the_schema(source, command):
    from hf_lightning.config import validate_config
    from hf_lightning.errors import ConfigError

    entry, overrides = overrides_of(command)
    cfg = compose("evaluate" if entry == "evaluate" else "train", overrides)
    try:
        validate_config(cfg)
    except ConfigError as err:
        # a documented GPU-only or multi-device setup may be refused on this CPU machine, nothing else may
        assert all(word in str(err) for word in ("CPU",)) or "cuda" in str(err).lower(), f"{source}: {command}: {err}"


def table_overrides() -> list[str]:
    """Every inline-code span of the migration tables made only of ``key=value`` words."""
    spans = []
    for line in (REPO / "docs" / "migration.md").read_text().splitlines():
        if not line.startswith("|"):
            continue
        for span in re.findall(r"`([^`]+)`", line):
            words = span.split()
            if words and all(re.fullmatch(r"\+?[a-z_][\w./]*=\S*", w) for w in words) and "." in span + "=":
                spans.append(span)
    return sorted(set(spans))


def test_the_tables_name_overrides():
    assert len(table_overrides()) >= 60


@pytest.mark.parametrize("span", table_overrides())
def test_every_override_in_the_tables_exists(span):
    """HF-side spellings (``eval_strategy="no"``) are not overrides; ours compose onto ``+experiment=sft``."""
    from hf_lightning.config import validate_config
    from hf_lightning.errors import ConfigError

    if any(w.split("=")[1].startswith('"') for w in span.split()):
        pytest.skip("an HF TrainingArguments value, not an override")
    cfg = compose("train", ["+experiment=sft", *span.split()])
    try:
        validate_config(cfg)
    except ConfigError as err:
        # values may be refused on a CPU machine (16-bit, DeepSpeed); a key must never be unknown
        assert "unknown" not in str(err) and "not an argument" not in str(err), f"{span}: {err}"


# --------------------------------------------------------------------------------------------- the tutorial
def tutorial_blocks() -> dict[str, str]:
    text = (REPO / "docs" / "migration.md").read_text()
    blocks = dict(re.findall(r"<!-- docs-test: ([\w-]+) -->\n```\w+\n(.*?)```", text, re.S))
    hf = re.search(r"### With HF `Trainer`\n\n```python\n(.*?)```", text, re.S).group(1)
    texts = re.search(r"texts = \[\n.*?\n\]\n", hf, re.S).group(0)
    blocks["hf"] = hf
    # the prepare block says `texts = [...]  # the 20 sentences above`
    blocks["tutorial-prepare"] = blocks["tutorial-prepare"].replace("texts = [...]  # the 20 sentences above\n", texts)
    return {k: v.replace("../shared/data", str(SHARED)) for k, v in blocks.items()}


def run_block(code: str, cwd: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if code.lstrip().startswith("python -m"):
        args = ["bash", "-c", code.replace("python -m", f"{sys.executable} -m")]
    else:
        args = [sys.executable, "-c", code]
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_the_migration_tutorial_runs_as_written(tmp_path):
    if not (SHARED / "gpt2-tokenizer" / "tokenizer.json").is_file():
        pytest.skip(f"no GPT-2 tokenizer under {SHARED} (set HF_LIGHTNING_SHARED_DATA)")
    blocks = tutorial_blocks()
    assert set(blocks) >= {"tutorial-prepare", "tutorial-inspect", "tutorial-train", "tutorial-best",
                           "tutorial-evaluate", "tutorial-python"}
    run_block(blocks["tutorial-prepare"], tmp_path)
    assert (tmp_path / "gpt2-qa" / "config.json").is_file()
    assert len((tmp_path / "qa_train.jsonl").read_text().splitlines()) == 16

    shown = run_block(blocks["tutorial-inspect"], tmp_path)
    # the claim of step 2: HF's Trainer draws the same first four rows with seed 42
    first = re.search(r"first example \(\d+ tokens; .*?\n\[\[(.*?)\]\]", shown, re.S).group(1)
    assert first == hf_first_text(blocks["hf"], tmp_path)

    run_block(blocks["tutorial-train"], tmp_path)
    run = tmp_path / "outputs" / "qa"
    with open(run / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows if r["train/loss"]] == list(range(5, 61, 5))
    val = {int(r["step"]): float(r["val/loss"]) for r in rows if r["val/loss"]}
    assert sorted(val) == list(range(10, 61, 10))
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["best.ckpt", "last.ckpt", "step000020.ckpt", "step000040.ckpt", "step000060.ckpt"]
    assert (run / "loss.png").is_file() and (run / "hf_model" / "model.safetensors").is_file()

    printed = run_block(blocks["tutorial-best"], tmp_path)
    best_step = min(val, key=val.get)  # the step whose val/loss is lowest, read from metrics.csv
    assert f"best checkpoint: step {best_step}" in printed
    assert (run / "best" / "model.safetensors").is_file()

    run_block(blocks["tutorial-evaluate"], tmp_path)
    import json

    evaluated = json.loads((tmp_path / "outputs" / "qa_eval" / "eval_metrics.json").read_text())
    assert evaluated["val/loss"] == pytest.approx(val[best_step], rel=1e-5)

    printed = run_block(blocks["tutorial-python"], tmp_path)
    path, score = printed.strip().splitlines()[-1].rsplit(" ", 1)
    assert path.endswith("best.ckpt")
    assert float(score) == pytest.approx(val[best_step], rel=1e-5)  # the same run, from Python


def hf_first_text(hf_script: str, cwd: Path) -> str:
    """The first row of HF Trainer's first training batch, decoded, from the tutorial's own HF script."""
    setup = hf_script.split("trainer.train()")[0].replace('output_dir="hf_out"', f'output_dir="{cwd / "hf_out"}"')
    code = setup + (
        "batch = next(iter(trainer.get_train_dataloader()))\n"
        "print(tokenizer.decode(batch['input_ids'][0][batch['attention_mask'][0].bool()]))\n"
    )
    return run_block(code, cwd).strip().splitlines()[-1]
