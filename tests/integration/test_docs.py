"""The commands in README.md and the docs pages work as written.

Every ``python -m hf_lightning.(train|inspect_batch|evaluate)`` command, in a code block or inline, composes
with Hydra and passes the schema; every override written in backticks in the migration tables names a key or a
group option that exists. The migration tutorial is run for real, block by block, from a fresh folder.
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

from tests.docs_support import PAGES

REPO = Path(__file__).resolve().parents[2]
DOCS = PAGES  # the README and every docs page
ENTRY = re.compile(r"python -m hf_lightning\.(train|inspect_batch|evaluate)\b")
SHARED = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block."""
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def documented_commands() -> list[tuple[str, str, str]]:
    """``(file name, command, expected error)`` for every entry-point command, continuation lines joined.

    A command shown with its output (``$ command`` then ``hf_lightning: error: ...``) must fail with that
    message.
    """
    found = []
    for path in DOCS:
        text = path.read_text()
        chunks = [body for lang, body in code_blocks(text) if lang in ("bash", "")]
        # inline commands, which may wrap onto the next line inside their backticks
        chunks += [m.replace("\n", " ") for m in re.findall(r"`(python -m hf_lightning[^`]*)`", text)]
        for chunk in chunks:
            lines = [line.strip() for line in chunk.replace("\\\n", " ").splitlines()]
            for i, line in enumerate(lines):
                command = line.removeprefix("$ ")
                if ENTRY.match(command):
                    shown = lines[i + 1] if i + 1 < len(lines) else ""
                    error = (
                        shown.removeprefix("hf_lightning: error: ")
                        if shown.startswith("hf_lightning: error:")
                        else ""
                    )
                    found.append((path.name, " ".join(command.split()), error))
    return sorted(set(found))


def compose(config_name: str, overrides: list[str]):
    """The config the command line composes: the entry points' spelling of a mapping setting's new key
    (:func:`~hf_lightning.config.typos.mapping_spellings`), then Hydra."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hf_lightning.config.compose import CONF_DIR
    from hf_lightning.config.typos import mapping_spellings

    overrides = mapping_spellings(overrides, config_name)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=overrides)
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.output_dir = "/tmp/unused"
    return cfg


def overrides_of(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    entry = words[2].split(".")[1]
    rest = [
        w for w in words[3:] if w not in ("-m", "--multirun") and not w.startswith("--cfg") and w != "job"
    ]
    multirun = "-m" in words or "--multirun" in words
    # a sweep composes once per value; the first value stands for all of them
    rest = [w.split(",")[0] if multirun and "=" in w and "[" not in w else w for w in rest]
    return entry, rest


def test_the_docs_name_commands():
    commands = documented_commands()
    assert {name for name, _, _ in commands} >= {
        "README.md",
        "migration.md",
        "data.md",
        "training.md",
        "hub.md",
        "distributed.md",
        "evaluation.md",
    }
    assert len(commands) >= 15, commands
    assert sum(bool(error) for _, _, error in commands) == 1  # the README's schema example


@pytest.mark.parametrize("source,command,error", documented_commands())
def test_every_documented_command_composes_and_passes_the_schema(source, command, error):
    from hf_lightning.config import validate_config
    from hf_lightning.core.errors import ConfigError

    entry, overrides = overrides_of(command)
    purpose = "evaluate" if entry == "evaluate" else "train"
    cfg = compose(purpose, overrides)
    if error:
        with pytest.raises(ConfigError) as caught:
            validate_config(cfg, purpose)
        assert str(caught.value) == error  # the message the doc shows, word for word
        return
    try:
        validate_config(cfg, purpose)
    except ConfigError as err:
        # GPU setups (bf16 autocast, FSDP, DeepSpeed) are refused on a CPU-only config; nothing else may be
        assert "CPU" in str(err) or "cpu" in str(err), f"{source}: {command}: {err}"


def test_the_readmes_short_run_is_not_all_warm_up():
    """The README's 20-step sft run: sft warms up over 20 steps, so as written before the rate rose for the
    whole run and never reached optim.lr. Its schedule, stepped here, follows HF's linear warm-up and decay
    by hand (step s at lr * s / w during the w warm-up steps, then lr * (T - s) / (T - w)) and reaches
    optim.lr."""
    import torch
    from hydra.utils import instantiate

    text = (REPO / "README.md").read_text().replace("\n", " ")
    command = re.search(r"A shorter run to try the pipeline: `(python -m hf_lightning\.train [^`]*)`", text)
    _, overrides = overrides_of(" ".join(command.group(1).split()))
    cfg = compose("train", overrides)
    total, lr = cfg.trainer.max_steps, cfg.optim.lr
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=lr)
    scheduler = instantiate(cfg.scheduler)(optimizer=optimizer, num_training_steps=total)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    w = cfg.scheduler.warmup_steps
    assert cfg.scheduler.name == "linear" and 0 < w < total
    expected = [lr * s / w if s < w else lr * (total - s) / (total - w) for s in range(total)]
    assert rates == pytest.approx(expected, rel=1e-9)
    assert max(rates) == pytest.approx(lr)


def table_overrides() -> list[str]:
    """Every inline-code span made only of ``key=value`` words in the hf_lightning columns of the migration
    tables.

    A column is ours when its header names ``hf_lightning`` or says ``to get HF's``; the other columns hold HF
    spellings (``learning_rate=5e-5``).
    """
    spans, ours = [], []
    lines = (REPO / "docs" / "migration.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            ours = []
            continue
        cells = line.strip().strip("|").split(" | ")
        if i + 1 < len(lines) and lines[i + 1].startswith("|---"):  # a header row
            ours = [j for j, cell in enumerate(cells) if "hf_lightning" in cell or "to get HF" in cell]
            continue
        for j in ours:
            for span in re.findall(r"`([^`]+)`", cells[j] if j < len(cells) else ""):
                words = span.split()
                if words and all(re.fullmatch(r"\+?[a-z_][\w./]*=\S*", w) for w in words):
                    spans.append(span)
    return sorted(set(spans))


def test_the_tables_name_overrides():
    assert len(table_overrides()) >= 60


@pytest.mark.parametrize("span", table_overrides())
def test_every_override_in_the_tables_exists(span):
    """Each span composes onto ``+experiment=sft`` (or the experiment it names) and passes the schema's key
    check."""
    from hf_lightning.config import validate_config
    from hf_lightning.core.errors import ConfigError

    words = span.split()
    cfg = compose(
        "train", words if any(w.startswith("+experiment=") for w in words) else ["+experiment=sft", *words]
    )
    try:
        validate_config(cfg)
    except ConfigError as err:
        # values may be refused on a CPU machine (16-bit, DeepSpeed); a key must never be unknown
        assert "unknown" not in str(err) and "not an argument" not in str(err), f"{span}: {err}"


# --------------------------------------------------------------------------------------------- the tutorial
def tutorial_blocks() -> dict[str, str]:
    text = (REPO / "docs" / "migration.md").read_text()
    blocks = dict(re.findall(r"<!-- docs-test: ([\w-]+) -->\n```\w+\n(.*?)```", text, re.S))
    hf = re.search(r"### With HF `Trainer`\n.*?```python\n(.*?)```", text, re.S).group(
        1
    )  # its first code block
    texts = re.search(r"texts = \[\n.*?\n\]\n", hf, re.S).group(0)
    blocks["hf"] = hf
    # the prepare block says `texts = [...]  # the 20 sentences above`
    blocks["tutorial-prepare"] = blocks["tutorial-prepare"].replace(
        "texts = [...]  # the 20 sentences above\n", texts
    )
    return {k: v.replace("../shared/data", str(SHARED)) for k, v in blocks.items()}


def run_block(code: str, cwd: Path, capsys=None) -> str:
    """A shell block in bash; a Python block in this process (the imports are paid once), both from
    ``cwd``."""
    if code.lstrip().startswith("python -m"):
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            ["bash", "-c", code.replace("python -m", f"{sys.executable} -m")],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout
    capsys.readouterr()
    exec(compile(code, "<docs/migration.md>", "exec"), {"__name__": "__main__"})
    return capsys.readouterr().out


@pytest.mark.slow
def test_the_migration_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    if not (SHARED / "gpt2-tokenizer" / "tokenizer.json").is_file():
        pytest.skip(f"no GPT-2 tokenizer under {SHARED} (set HF_LIGHTNING_SHARED_DATA)")
    blocks = tutorial_blocks()
    monkeypatch.chdir(tmp_path)
    assert set(blocks) >= {
        "tutorial-prepare",
        "tutorial-inspect",
        "tutorial-train",
        "tutorial-best",
        "tutorial-evaluate",
        "tutorial-python",
    }
    run_block(blocks["tutorial-prepare"], tmp_path, capsys)
    assert (tmp_path / "gpt2-qa" / "config.json").is_file()
    assert len((tmp_path / "qa_train.jsonl").read_text().splitlines()) == 16

    shown = run_block(blocks["tutorial-inspect"], tmp_path)
    # the claim of step 2: HF's Trainer draws the same first four rows with seed 42
    first = re.search(r"first example \(\d+ tokens; .*?\n\[\[(.*?)\]\]", shown, re.S).group(1)
    assert first == hf_first_text(blocks["hf"], tmp_path, capsys)

    run_block(blocks["tutorial-train"], tmp_path)
    run = tmp_path / "outputs" / "qa"
    with open(run / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows if r["train/loss"]] == list(range(5, 61, 5))
    val = {int(r["step"]): float(r["val/loss"]) for r in rows if r["val/loss"]}
    assert sorted(val) == list(range(10, 61, 10))
    names = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))  # each has a .sha256 beside it
    # HF's load_best_model_at_end, by hand from metrics.csv: a new lowest val/loss becomes the best model when
    # its step is saved (20, 40 and the final 60)
    lowest, best_model = float("inf"), None
    for step in sorted(val):
        if val[step] < lowest:
            lowest, best_eval = val[step], step
        if step % 20 == 0 and best_eval == step:
            best_model = step
    saved = ["last.ckpt", "step000020.ckpt", "step000040.ckpt", "step000060.ckpt"]
    assert names == sorted(saved + (["best.ckpt"] if best_model else []))
    assert (run / "loss.png").is_file() and (run / "hf_model" / "model.safetensors").is_file()

    printed = run_block(blocks["tutorial-best"], tmp_path, capsys)
    shown = re.search(r"best model: step (\d+) eval_loss (\S+)", printed)
    assert int(shown.group(1)) == best_model and float(shown.group(2)) == pytest.approx(
        val[best_model], rel=1e-6
    )

    run_block(blocks["tutorial-evaluate"], tmp_path)
    import json

    evaluated = json.loads((tmp_path / "outputs" / "qa_eval" / "eval_metrics.json").read_text())
    assert evaluated["val/loss"] == pytest.approx(val[best_model], rel=1e-5)  # hf_model/ holds the best model
    best_step = min(val, key=val.get)  # the step whose val/loss is lowest, read from metrics.csv

    printed = run_block(blocks["tutorial-python"], tmp_path, capsys)
    path, score = printed.strip().splitlines()[-1].rsplit(" ", 1)
    assert path.endswith("best.ckpt")
    assert float(score) == pytest.approx(val[best_step], rel=1e-5)  # the same run, from Python


def hf_first_text(hf_script: str, cwd: Path, capsys) -> str:
    """The first row of HF Trainer's first training batch, decoded, from the tutorial's own HF script."""
    setup = hf_script.split("trainer.train()")[0]
    code = setup + (
        "batch = next(iter(trainer.get_train_dataloader()))\n"
        "print(tokenizer.decode(batch['input_ids'][0][batch['attention_mask'][0].bool()]))\n"
    )
    return run_block(code, cwd, capsys).strip().splitlines()[-1]


# what lightning-hydra-template's own files need beyond hf_lightning's dependencies (read from
# ashleve/lightning-hydra-template at bddbc24): src/train.py and src/eval.py `import rootutils`,
# src/utils/rich_utils.py `import rich` (and callbacks/default.yaml's rich_progress_bar), and
# configs/hydra/default.yaml `override hydra_logging: colorlog` (the hydra-colorlog plugin)
TEMPLATE_NEEDS = ("hydra-colorlog", "rootutils", "rich")


def test_the_template_example_installs_what_the_template_imports():
    # before: "pip install -e /path/to/hf_lightning" alone: the template stopped at import rootutils
    readme = (REPO / "examples" / "lightning-hydra-template" / "README.md").read_text()
    lines = [
        line.strip() for _, body in code_blocks(readme) for line in body.splitlines() if "pip install" in line
    ]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0])
    assert words[:4] == ["pip", "install", "-e", "/path/to/hf_lightning"]
    assert sorted(words[4:]) == sorted(TEMPLATE_NEEDS)
    import tomllib

    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ]", d)[0] for d in ours}
    assert {"torch", "lightning", "torchmetrics", "hydra-core"} <= names  # the rest the README says we bring
    assert not names & set(TEMPLATE_NEEDS)
