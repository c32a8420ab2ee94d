"""Small helpers shared by the layers."""
import keras


def clone_initializer(initializer):
    """A fresh initializer with the same config, so that no two variables share a seeded instance."""
    if isinstance(initializer, keras.initializers.Initializer):
        return initializer.__class__.from_config(initializer.get_config())
    return keras.initializers.get(initializer)


def serialize_initializer(initializer):
    return keras.initializers.serialize(keras.initializers.get(initializer))
