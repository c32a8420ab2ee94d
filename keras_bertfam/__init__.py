"""keras_bertfam: the BERT family for Keras 3, with every pretraining objective."""
import importlib as _importlib
import os as _os
import sys as _sys

from keras_bertfam.version import __version__

_SUBMODULES = ("layers", "models", "preprocessing", "presets", "tasks", "distribute", "export",
               "analysis")


def _run_as_cli():
    """`python -m keras_bertfam.cli`: while `-m` locates the module, argv[0] is "-m"."""
    argv = getattr(_sys, "orig_argv", [])
    return _sys.argv[:1] == ["-m"] and "-m" in argv and argv[argv.index("-m") + 1:][:1] == [
        "keras_bertfam.cli"]


if _os.environ.get("KERAS_BERTFAM_LAZY_IMPORT") == "1" or _run_as_cli():
    # The console script (keras_bertfam_cli.py) or `python -m keras_bertfam.cli`: submodules
    # load on first use, so that `--help` does not import TensorFlow.
    def __getattr__(name):
        if name in _SUBMODULES:
            return _importlib.import_module(f"keras_bertfam.{name}")
        raise AttributeError(f"module 'keras_bertfam' has no attribute {name!r}")
else:
    from keras_bertfam import layers, models, preprocessing, presets, tasks
    from keras_bertfam import distribute, export
    from keras_bertfam import analysis
