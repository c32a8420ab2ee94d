"""Every warning the package gives points at the user's line (`keras_bertfam.user_warnings`):
the first frame outside keras_bertfam and the libraries it runs under (Keras, TensorFlow, ...).
The warnings of each part are asserted where their tests trigger them (`w.filename ==
__file__` in test_presets, test_conversion, test_tasks, test_ernie_masking, test_analysis,
test_classifier_activation, test_load_warnings); here: the rule itself, a warning given from
inside Keras' weight loading, and that no fixed `stacklevel` is left."""
import os
import re
import subprocess
import sys
import warnings

import pytest
import tensorflow as tf

import keras_bertfam as kb
from keras_bertfam import user_warnings
from keras_bertfam.user_warnings import warn
from tests.conftest import without_unused_imports

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "keras_bertfam")


def test_no_fixed_stacklevel_is_left_in_the_package():
    """A fixed `stacklevel=<int>` points wherever the call depth was when it was written (into
    keras_bertfam, Keras or pytest): every warning goes through `user_warnings.warn`."""
    fixed = []
    for folder, _, names in os.walk(ROOT):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                for number, line in enumerate(open(path, encoding="utf-8"), 1):
                    if re.search(r"stacklevel\s*=\s*\d", line):
                        fixed.append(f"{os.path.relpath(path, ROOT)}:{number}")
    assert not fixed, f"warnings with a fixed stacklevel (use user_warnings.warn): {fixed}"


def test_a_warning_given_under_a_tf_data_trace_points_at_the_user():
    """Through `tf.data`'s tracing (TensorFlow's frames between the user's `map` call and the
    warning) and a library frame: at the user's line, with the category and message given."""
    def library_code(x):
        warn("from inside", DeprecationWarning)
        return x

    # Made keras_bertfam's code: its module (globals) is the package's.
    traced = type(library_code)(library_code.__code__, vars(user_warnings))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tf.data.Dataset.range(2).map(traced)
    assert [(w.filename, w.category, str(w.message)) for w in caught] == [
        (__file__, DeprecationWarning, "from inside")]


def test_with_no_user_frame_the_outermost_frame_is_named(monkeypatch):
    """Everything on the stack library code (a worker thread of tf.data): the outermost frame,
    not an error or None."""
    assert user_warnings.user_frame().f_code.co_filename == __file__
    outermost = sys._getframe()
    while outermost.f_back is not None:
        outermost = outermost.f_back
    monkeypatch.setattr(user_warnings, "_is_library", lambda frame: True)
    assert user_warnings.user_frame() is outermost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("nowhere else")
    assert [(w.filename, w.lineno) for w in caught] == [
        (outermost.f_code.co_filename, outermost.f_lineno)]


@pytest.mark.multibackend
def test_a_task_warning_from_inside_keras_weight_loading_points_at_load_weights(tmp_path):
    """`Task.load_own_variables` warns about seed generators it cannot restore; Keras' saving
    calls it, so a `stacklevel=2` pointed into keras/src/saving: now at the load_weights line."""
    def task(dropout):
        backbone = kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
                                          hidden_dim=8, intermediate_dim=16,
                                          max_sequence_length=16, dropout=dropout)
        return kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None)

    path = str(tmp_path / "model.weights.h5")
    task(0.1).save_weights(path)
    other = task(0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.load_weights(path)
    found = [w for w in caught if "seed generators" in str(w.message)]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert found[0].filename == __file__, (found[0].filename, found[0].lineno)


@pytest.mark.parametrize("how", ["-c", "-m"])
def test_a_warning_in_a_python_c_or_m_program_is_shown_not_raised(tmp_path, how):
    """A `python -c` / `python -m` program's `__main__` has a loader that cannot give its source
    (`python -m keras_bertfam_cli analyze` died of "loader ... cannot handle __main__" at its
    first warning): the warning is printed with the program's line, and the program goes on."""
    program = ("import importlib.util, sys\n"
               f"spec = importlib.util.spec_from_file_location('uw', {user_warnings.__file__!r})\n"
               "uw = importlib.util.module_from_spec(spec); spec.loader.exec_module(uw)\n"
               "uw.warn('careful')\n"
               "print('went on')\n")
    if how == "-c":
        args = ["-c", program]
    else:
        (tmp_path / "a_program.py").write_text(program)
        args = ["-m", "a_program"]
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1800)  # a hang guard only
    assert done.returncode == 0, done.stderr
    assert done.stdout == "went on\n"
    expected = "<string>:4: UserWarning: careful" if how == "-c" else "a_program.py:4: UserWarning"
    assert expected in done.stderr, done.stderr


@pytest.mark.parametrize("entry", ["console script", "python -m keras_bertfam.cli"])
def test_a_cli_warning_points_at_the_cli_program_however_it_is_started(tmp_path, entry):
    """When the CLI is the program, a warning points at its line that ran the command
    (`keras_bertfam_cli.main`'s call of `cli.main`), however it was started: run as
    `python -m keras_bertfam.cli`, cli.py's `__name__` was "__main__", taken for the user's code,
    and the warning pointed into cli.py. The console script is what pip writes: it imports
    `keras_bertfam_cli.main` and calls it."""
    import keras_bertfam_cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("A first sentence.\nA second one.\n")
    (corpus / "b.bin").write_bytes(b"ok\n\x00\xff")  # skipped, with a warning
    start = {"console script": ["-c", "import sys\nfrom keras_bertfam_cli import main\n"
                                      "sys.exit(main())"],
             "python -m keras_bertfam.cli": ["-m", "keras_bertfam.cli"]}[entry]
    root = os.path.dirname(ROOT)
    # Without the packages the CLI never uses (conftest's `without_unused_imports`, here through
    # a `sitecustomize` module, which Python imports at start-up: the command line stays the
    # user's): ~1 s of CPU less per process.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(without_unused_imports("jax"))
    env = dict(os.environ, KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([str(site), root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, *start, "pretrain", "--family", "bert", "--preset",
         str(tmp_path / "no_preset"), "--corpus", str(corpus), "--output", str(tmp_path / "run"),
         "--steps", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)  # a hang guard
    assert done.returncode == 1 and "--preset" in done.stderr, done.stderr[-3000:]
    source = open(keras_bertfam_cli.__file__, encoding="utf-8").read().splitlines()
    line = next(n for n, text in enumerate(source, 1) if "cli.main(argv)" in text)
    warned = [text for text in done.stderr.splitlines() if "UserWarning: Skipping" in text]
    assert warned and all(text.startswith(f"{keras_bertfam_cli.__file__}:{line}: ")
                          for text in warned), done.stderr[-3000:]
