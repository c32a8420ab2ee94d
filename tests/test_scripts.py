"""The scripts users run by hand (examples/, bench/, tools/) are not imported by any other test:
each must at least compile and say how it is run (a stray quote once broke an example unseen)."""
import ast
import glob
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPTS = sorted(os.path.relpath(p, ROOT) for d in ("examples", "bench", "tools")
                 for p in glob.glob(os.path.join(ROOT, d, "*.py")))


def test_scripts_are_found():
    assert any(s.startswith("examples") for s in SCRIPTS) and any(
        s.startswith("bench") for s in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_compiles_and_documents_its_use(script):
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, filename=script)  # a SyntaxError fails here, naming the line
    compile(tree, script, "exec")
    doc = ast.get_docstring(tree) or ""
    assert doc.strip(), f"{script} has no module docstring"
    assert any(word in doc for word in ("Run", "Usage", "python ")), \
        f"{script}'s docstring does not say how to run it"
