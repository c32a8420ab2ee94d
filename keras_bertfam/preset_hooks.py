"""Where the preset mechanism plugs into models, tasks and tokenizers.

`Backbone.from_preset`, `Task.from_preset`, `Tokenizer.from_preset` and their `save_to_preset`
call the functions registered here; `keras_bertfam.presets` registers them when it is imported
(which `import keras_bertfam` does, and the first `call` does in the console script's lazy mode).
So dependencies flow one way: presets imports models, tasks and preprocessing, and none of those
imports presets (no models <-> presets import circle).
"""
import importlib

_FUNCTIONS = {}


def register(**functions):
    """Called by `keras_bertfam.presets` with its load/save functions."""
    _FUNCTIONS.update(functions)


def call(name, *args, **kwargs):
    if name not in _FUNCTIONS:
        # The console script imports the package lazily (keras_bertfam_cli.py): load the preset
        # mechanism on first use; it registers its functions as it is imported.
        importlib.import_module("keras_bertfam.presets")
    return _FUNCTIONS[name](*args, **kwargs)
