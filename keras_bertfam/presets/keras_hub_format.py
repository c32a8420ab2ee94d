"""keras-hub preset directories: `config.json` (a serialized keras-hub backbone), `metadata.json`,
`model.weights.h5`, `tokenizer.json` and `assets/tokenizer/...`.

The backbone is rebuilt and loaded by keras-hub itself (so its weights file is read by the code
that wrote it); the family's `weights_from_keras_hub` map then copies each variable, by path, into
our backbone through `checkpoints.assign` (names and shapes checked).
"""
import json
import os

from keras_bertfam.presets import checkpoints


def is_keras_hub_dir(path):
    config = os.path.join(path, "config.json")
    if not (os.path.exists(config) and os.path.exists(os.path.join(path, "metadata.json"))):
        return False
    with open(config) as f:
        data = json.load(f)
    return isinstance(data, dict) and "class_name" in data and str(
        data.get("registered_name", "")).startswith("keras_hub>")


def read_json(path, name):
    with open(os.path.join(path, name)) as f:
        return json.load(f)


def family_of(path, families):
    class_name = read_json(path, "config.json")["class_name"]
    for spec in families.values():
        if class_name in spec.keras_hub_classes:
            return spec, class_name
    raise ValueError(f"{path!r} is a keras-hub {class_name} preset; no family here loads it "
                     f"(keras-hub backbones we load: "
                     f"{sorted(c for s in families.values() for c in s.keras_hub_classes)}).")


def load_backbone(path, spec, load_weights=True, **overrides):
    config = read_json(path, "config.json")["config"]
    backbone = spec.backbone_cls(**dict(spec.config_from_keras_hub(config), **overrides))
    if load_weights:
        weights = os.path.join(path, "model.weights.h5")
        if not os.path.exists(weights):
            raise FileNotFoundError(f"The keras-hub preset {path!r} has no model.weights.h5.")
        import keras
        import keras_hub  # noqa: F401 - registers keras-hub's classes for deserialization

        try:
            kh = keras.saving.deserialize_keras_object(read_json(path, "config.json"))
            kh.load_weights(weights)
        except Exception as e:
            raise checkpoints.CheckpointError(
                f"Could not load the keras-hub weights {weights!r}: the file is corrupt or does "
                f"not match its config.json ({type(e).__name__}: {e})."
            ) from e
        state = {v.path: keras.ops.convert_to_numpy(v) for v in kh.weights}
        checkpoints.assign(spec.weights_from_keras_hub(backbone), state,
                           what=type(backbone).__name__)
    return backbone


def load_tokenizer(path, spec):
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(f"The keras-hub preset {path!r} has no tokenizer.json.")
    config = read_json(path, "tokenizer.json")["config"]
    assets = os.path.join(path, "assets", "tokenizer")
    if spec.tokenizer_files == ("vocab.txt",):
        vocab = os.path.join(assets, "vocabulary.txt")
        if not os.path.exists(vocab):
            raise FileNotFoundError(f"The keras-hub preset {path!r} has no vocabulary file "
                                    f"{vocab!r}.")
        return spec.make_tokenizer(
            {"kind": "wordpiece", "vocabulary": vocab, "lowercase": config.get("lowercase", False)},
            None)
    raise NotImplementedError(f"keras-hub tokenizers of the {spec.name!r} family are not "
                              "loaded yet.")
