"""Where the preset mechanism plugs into models, tasks and tokenizers.

`Backbone.from_preset`, `Task.from_preset`, `Tokenizer.from_preset` and their `save_to_preset`
call the functions registered here; `keras_bertfam.presets` registers them when it is imported
(which `import keras_bertfam` always does). So dependencies flow one way: presets imports models,
tasks and preprocessing, and none of those imports presets (no models <-> presets import circle).
"""
_FUNCTIONS = {}


def register(**functions):
    """Called by `keras_bertfam.presets` with its load/save functions."""
    _FUNCTIONS.update(functions)


def call(name, *args, **kwargs):
    if name not in _FUNCTIONS:
        raise RuntimeError(f"keras_bertfam.presets has not registered {name!r}: import "
                           "keras_bertfam (or keras_bertfam.presets) before loading presets.")
    return _FUNCTIONS[name](*args, **kwargs)
