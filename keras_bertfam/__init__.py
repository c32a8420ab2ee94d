"""keras_bertfam: the BERT family for Keras 3, with every pretraining objective."""
import importlib as _importlib
import os as _os

from keras_bertfam.version import __version__

_SUBMODULES = ("layers", "models", "preprocessing", "presets", "tasks", "distribute", "export",
               "analysis")

if _os.environ.get("KERAS_BERTFAM_LAZY_IMPORT") == "1":
    # The console script (keras_bertfam_cli.py): submodules load on first use, so that `--help`
    # does not import TensorFlow.
    def __getattr__(name):
        if name in _SUBMODULES:
            return _importlib.import_module(f"keras_bertfam.{name}")
        raise AttributeError(f"module 'keras_bertfam' has no attribute {name!r}")
else:
    from keras_bertfam import layers, models, preprocessing, presets, tasks
    from keras_bertfam import distribute, export
    from keras_bertfam import analysis
