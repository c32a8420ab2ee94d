"""The package's imports point one way (DESIGN.md, "The house"): preprocessing at the bottom,
then layers and models, tasks, presets and export, and the CLI and analysis tools on top. Every
import in every module counts, the lazy ones inside functions too: a lazy import upward (a
preprocessor reaching into `models` and `tasks` for Longformer's global-attention rule) is the
same circle, only hidden until it runs."""
import ast
import glob
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "keras_bertfam")

# What each part of the package may import of ours (besides itself). `preset_hooks` is where the
# preset mechanism plugs in from above (it imports nothing of ours); `distribute` is the
# strategy helpers tasks use; `user_warnings` (warnings at the user's line) is a leaf every part
# may import; `atomic` (files and directories replaced whole) is a leaf presets, export and
# the CLI's run use.
BELOW = {
    "user_warnings": set(),
    "atomic": set(),
    "preset_hooks": set(),
    "version": set(),
    "distribute": set(),
    "layers": {"user_warnings"},
    "preprocessing": {"preset_hooks", "user_warnings"},
    "models": {"layers", "preprocessing", "preset_hooks", "user_warnings"},
    "tasks": {"layers", "models", "preprocessing", "preset_hooks", "distribute", "user_warnings"},
    "presets": {"layers", "models", "preprocessing", "tasks", "preset_hooks", "distribute",
                "user_warnings", "atomic"},
    "export": {"layers", "models", "preprocessing", "tasks", "presets", "preset_hooks", "atomic",
               "user_warnings"},
}


def imports_of_ours(path):
    """(part imported, line) for every import of `keras_bertfam.<part>` in the file, at any depth;
    `from keras_bertfam import x` counts as importing part x."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "keras_bertfam" or node.module.startswith("keras_bertfam.")):
            parts = node.module.split(".")
            for part in (parts[1:2] or [alias.name for alias in node.names]):
                yield part, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_bertfam."):
                    yield alias.name.split(".")[1], node.lineno
                elif alias.name == "keras_bertfam":
                    yield "*", node.lineno  # the whole package: everything


def part_of(path):
    rel = os.path.relpath(path, ROOT).split(os.sep)
    return rel[0].removesuffix(".py")


MODULES = sorted(p for p in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
                 if part_of(p) in BELOW)


def test_every_part_below_the_top_is_checked():
    assert {part_of(p) for p in MODULES} == set(BELOW)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: os.path.relpath(p, ROOT))
def test_imports_point_down(path):
    part = part_of(path)
    upward = [f"line {line}: keras_bertfam.{other}" for other, line in imports_of_ours(path)
              if other != part and other not in BELOW[part]]
    assert not upward, (f"{os.path.relpath(path, ROOT)} ({part}) imports above it: {upward}; "
                        f"{part} may import only {sorted(BELOW[part]) or 'nothing of ours'}")


def test_the_check_finds_a_lazy_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from keras_bertfam.tasks.task import TF_OPS\n"
                   "    from keras_bertfam import models\n")
    assert list(imports_of_ours(str(bad))) == [("tasks", 2), ("models", 3)]
