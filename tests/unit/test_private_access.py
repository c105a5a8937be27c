"""Guard: private attributes of Lightning, transformers, datasets and torch are used in
``hf_lightning/compat.py`` only.

What counts as a use, found by walking the AST of every ``hf_lightning`` module but ``compat.py``:

- ``from lib import _name`` and any import of a private module path (``lib._impl``);
- ``obj._name`` on anything but ``self`` / ``cls``, and ``getattr/hasattr/setattr(obj, "_name")`` likewise;
- ``self._name`` (read, written or a method defined) in a class that subclasses a library class defining
  ``_name`` (found by reading the library bases' attributes and sources on the installed versions);
- internals without a leading underscore (:data:`INTERNALS`): Lightning's loop progress and transformers' loss
table.

Run ``python tests/unit/test_private_access.py [PACKAGE_DIR]`` to list the uses (the closing-note figure).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

#: attributes that are library internals without a leading underscore (undocumented, may change)
INTERNALS = {"fit_loop", "epoch_loop", "batch_progress", "epoch_progress", "LOSS_MAPPING"}
ALLOWED_FILES = {"compat.py"}
SELF_NAMES = {"self", "cls"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library_privates(cls: type) -> set[str]:
    """Private names the non-hf_lightning bases of ``cls`` define (class attributes, or ``self._x`` in their
    code)."""
    names: set[str] = set()
    for base in cls.__mro__[1:]:
        module = getattr(base, "__module__", "") or ""
        if module.startswith("hf_lightning") or base is object or module == "builtins":
            continue
        names.update(n for n in vars(base) if _private(n))
        try:
            source = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"self\.(_[A-Za-z]\w*)", source))
    return {n for n in names if _private(n)}


def _classes(module_name: str) -> dict[str, type]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:  # an optional dependency missing: the static checks still run
        if (err.name or "").split(".")[0] == "hf_lightning":
            raise  # a broken module of ours must fail the guard, not hide its classes from it
        return {}
    return {n: c for n, c in vars(module).items() if inspect.isclass(c) and c.__module__ == module_name}


def private_accesses(root: Path) -> list[str]:
    """``file:line: what`` for every private library attribute used under ``root`` (the ``hf_lightning``
    folder)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if path.name in ALLOWED_FILES and path.parent == root:
            continue
        tree = ast.parse(path.read_text())
        module_name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        classes = _classes(module_name)

        def add(node: ast.AST, what: str, rel: Path = rel) -> None:
            found.append(f"{rel}:{node.lineno}: {what}")

        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and not node.module.startswith("hf_lightning")
            ):
                if node.level == 0 and any(_private(p) for p in node.module.split(".")):
                    add(node, f"from {node.module} import ...")
                for alias in node.names:
                    if _private(alias.name) or alias.name in INTERNALS:
                        add(node, f"from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if not alias.name.startswith("hf_lightning") and any(
                        _private(p) for p in alias.name.split(".")
                    ):
                        add(node, f"import {alias.name}")
            elif isinstance(node, ast.Attribute):
                on_self = isinstance(node.value, ast.Name) and node.value.id in SELF_NAMES
                if node.attr in INTERNALS or (_private(node.attr) and not on_self):
                    add(node, f".{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and (_private(node.args[1].value) or node.args[1].value in INTERNALS)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in SELF_NAMES)
            ):
                add(node, f'{node.func.id}(..., "{node.args[1].value}")')
        for cls_node in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            cls = classes.get(cls_node.name)
            if cls is None:
                continue
            theirs = _library_privates(cls)
            for node in ast.walk(cls_node):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in theirs:
                    add(node, f"{cls_node.name} overrides {node.name}")
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and node.attr in theirs
                ):
                    add(node, f"{cls_node.name}: self.{node.attr}")
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr")
                    and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in theirs
                ):
                    add(node, f'{cls_node.name}: {node.func.id}(self, "{node.args[1].value}")')
    return sorted(set(found))


def test_private_library_attributes_appear_in_compat_only():
    import hf_lightning

    offenders = private_accesses(Path(hf_lightning.__file__).parent)
    assert not offenders, "private library attributes outside hf_lightning/compat.py:\n" + "\n".join(
        offenders
    )


def test_the_guard_finds_each_kind_of_use(tmp_path):
    """The guard is not vacuous: one file with each kind of use gives one finding each."""
    pkg = tmp_path / "hf_lightning_probe"
    pkg.mkdir()
    (pkg / "probe.py").write_text(
        "from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher\n"
        "def f(trainer, ds):\n"
        "    trainer.fit_loop.epoch_loop.batch_progress.is_last_batch\n"
        "    getattr(ds, '_fingerprint', None)\n"
        "    return ds._indices\n"
    )
    found = private_accesses(pkg)
    assert any("_SubprocessScriptLauncher" in f for f in found)
    assert any(".fit_loop" in f for f in found) and any(".batch_progress" in f for f in found)
    assert any('"_fingerprint"' in f for f in found) and any("._indices" in f for f in found)


def test_the_guard_finds_a_private_of_a_library_base_class():
    """``self._trainer`` in a LightningModule subclass is Lightning's private attribute, though it reads as
    ours."""
    import lightning as L

    class Probe(L.LightningModule):
        pass

    assert "_trainer" in _library_privates(Probe)
    assert "_check_log_dir_exists" in _library_privates(
        type("W", (importlib.import_module("lightning.pytorch.loggers.csv_logs").ExperimentWriter,), {})
    )


if __name__ == "__main__":
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "hf_lightning"
    result = private_accesses(here)
    print("\n".join(result))
    print(f"{len(result)} uses in {len({r.split(':')[0] for r in result})} files")
