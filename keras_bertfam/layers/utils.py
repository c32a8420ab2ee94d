"""Small helpers shared by the layers."""
import keras


def clone_initializer(initializer):
    """A fresh initializer with the same config, so that no two variables share a seeded instance."""
    if isinstance(initializer, keras.initializers.Initializer):
        return initializer.__class__.from_config(initializer.get_config())
    return keras.initializers.get(initializer)


def serialize_initializer(initializer):
    return keras.initializers.serialize(keras.initializers.get(initializer))


def sublayer_kwargs(layer):
    """Keyword arguments every sublayer of `layer` gets: its dtype policy (as Keras'
    `_get_common_kwargs_for_sublayer`), so that `dtype="bfloat16"` or `"mixed_float16"` reaches
    every weight and every computation, not only the outer layer."""
    return {"dtype": layer.dtype_policy}


def _check_positive(**values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
