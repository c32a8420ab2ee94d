"""keras-hub preset directories: `config.json` (a serialized keras-hub backbone), `metadata.json`,
`model.weights.h5`, `tokenizer.json` and `assets/tokenizer/...` (a tokenizer saved alone writes
only the last two).

Every keras-hub 0.32 backbone of our families loads: BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA
(all on keras-hub's `TransformerEncoder`) and XLNet. keras-hub has no SpanBERT; its XLNet has no
tokenizer. `KERAS_HUB` below is the whole per-family knowledge, one entry per keras-hub backbone
class: which family loads it, its config -> our arguments, and where its weights sit.

The backbone is rebuilt and loaded by keras-hub itself (so its weights file is read by the code
that wrote it); its variables, by path, are then copied into our backbone through
`checkpoints.assign` (names and shapes checked). The encoder families share one map: keras-hub
names every `TransformerEncoder`'s sublayers the same way, so a family only names its embedding
layers, its layer prefix and its pooler. Every keras-hub variable must be used (or be listed as
having no counterpart here), so a keras-hub layout change fails loudly instead of half-loading.
A task's head weights (task.weights.h5: a few small arrays) are read from the file itself, laid
out by Keras (`_stored_arrays`): no keras-hub task, with a second backbone, is built for them.

Tokenizers are our family's, with the options of the preset's keras-hub tokenizer (WordPiece
`lowercase`, RoBERTa `add_prefix_space`; keras-hub's ALBERT tokenizer runs the SentencePiece model
alone, so ours neither lowercases nor strips accents for it), and give keras-hub's ids except
where keras-hub departs from the original models' normalization, which ours keeps: keras-hub's
WordPiece `lowercase=True` keeps accents (an accented word becomes [UNK]) and applies NFKC; ALBERT
turns "``" and "''" into '"', keras-hub does not.
"""
import dataclasses
import os
from typing import Callable, Optional

import numpy as np

from keras_bertfam import user_warnings
from keras_bertfam.presets import checkpoints, integrity

TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


def _keras_hub_class(path, name):
    """The keras-hub class serialized in `path/name`, or None."""
    file = os.path.join(path, name)
    if not os.path.exists(file):
        return None
    data = integrity.read_json_object(file)
    if str(data.get("registered_name", "")).startswith("keras_hub>"):
        return data.get("class_name")
    return None


def is_keras_hub_dir(path):
    """A keras-hub backbone's config.json, or a tokenizer alone (tokenizer.json, all that
    `keras_hub.models.*Tokenizer.save_to_preset` writes besides its assets)."""
    return any(_keras_hub_class(path, name) for name in ("config.json", "tokenizer.json"))


def read_json(path, name):
    return integrity.read_json_object(os.path.join(path, name))


# === The per-family table ===
@dataclasses.dataclass(frozen=True)
class KerasHubFormat:
    """How one keras-hub backbone class maps onto one of our families.

    Attributes:
        family: our family name.
        config: keras-hub backbone config -> our backbone arguments (raises CheckpointError for a
            config we cannot represent).
        weights: `(backbone) -> [(our variable, keras-hub variable path or None, transform)]`;
            a None path sets the variable to `transform(None)` (a table keras-hub lacks).
        unused: keras-hub variable path prefixes with no counterpart in our backbone.
        tokenizer_files: files keras-hub's tokenizer saves under `assets/tokenizer`.
        tokenizer: keras-hub tokenizer config -> our family's `make_tokenizer` spec; None: keras-hub
            has no tokenizer for this backbone.
    """

    family: str
    config: Callable
    weights: Callable
    unused: tuple = ()
    tokenizer_files: tuple = ()
    tokenizer: Optional[Callable] = None


def _take(config, *keys, **renames):
    out = {k: config[k] for k in keys if k in config}
    out.update({ours: config[theirs] for ours, theirs in renames.items() if theirs in config})
    return out


_SIZES = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim",
          "dropout")


def _pair(layer, path, names=("kernel", "bias")):
    return [(getattr(layer, names[0]), f"{path}/{names[0]}", None),
            (getattr(layer, names[1]), f"{path}/{names[1]}", None)]


def _norm(layer, path):
    return _pair(layer, path, ("gamma", "beta"))


def _transformer_encoder(block, path):
    """Our TransformerBlock <- keras-hub's TransformerEncoder at `path` (no transforms: both keep
    EinsumDense kernels as (H, N, Dh) and (N, Dh, H))."""
    mha, ffn = block.attention.attention, block.feedforward
    out = []
    for layer, name in ((mha.query_dense, "query"), (mha.key_dense, "key"),
                        (mha.value_dense, "value"), (mha.output_dense, "attention_output")):
        out += _pair(layer, f"{path}/self_attention_layer/{name}")
    return (out + _norm(block.attention.layer_norm, f"{path}/self_attention_layer_norm")
            + _pair(ffn.intermediate_dense, f"{path}/feedforward_intermediate_dense")
            + _pair(ffn.output_dense, f"{path}/feedforward_output_dense")
            + _norm(ffn.layer_norm, f"{path}/feedforward_layer_norm"))


def _encoder_weights(embeddings="", projection=None, layer="transformer_layer_{}", pooler=None,
                     segments=True):
    """The weight map of a keras-hub encoder family from the names of its layers.

    `embeddings`: the prefix of its token/position tables ("" or a TokenAndPositionEmbedding's
    name); `layer`: the name of encoder layer i (ALBERT: of group i); `segments`: keras-hub has a
    segment table (RoBERTa's has none: our single-row table is set to zeros, adding nothing).
    """
    def weights(backbone):
        emb = backbone.embeddings
        out = [(emb.token_embedding.embeddings, f"{embeddings}token_embedding/embeddings", None)]
        offset = emb.position_offset  # RoBERTa's first position is our row 2, keras-hub's row 0
        out.append((emb.position_embedding.embeddings,
                    f"{embeddings}position_embedding/embeddings",
                    (lambda w: np.concatenate([np.zeros((offset, w.shape[1]), w.dtype), w]))
                    if offset else None))
        if emb.segment_embedding is not None:
            out.append((emb.segment_embedding.embeddings, "segment_embedding/embeddings", None)
                       if segments else (emb.segment_embedding.embeddings, None,
                                         lambda _: np.zeros(emb.segment_embedding.embeddings.shape,
                                                            "float32")))
        out += _norm(emb.layer_norm, "embeddings_layer_norm")
        if emb.projection is not None:
            out += _pair(emb.projection, projection)
        repeats = backbone.encoder.num_inner_repetitions
        for k, block in enumerate(backbone.encoder.blocks):
            out += _transformer_encoder(block, layer.format(k // repeats, k % repeats))
        if pooler and backbone.pooler_dense is not None:
            out += _pair(backbone.pooler_dense, pooler)
        return out

    return weights


def _wordpiece(config):
    return {"kind": "wordpiece", "lowercase": config.get("lowercase", False)}


def _bert_config(config):
    # keras-hub's BERT and ELECTRA use the tanh-approximate GELU (HF's checkpoints: exact).
    return dict(_take(config, *_SIZES, "max_sequence_length", "num_segments"),
                activation="gelu_approximate")


def _electra_config(config):
    return dict(_bert_config(config),
                **_take(config, "embedding_dim", vocabulary_size="vocab_size"))


def _plain_config(config):  # RoBERTa, DistilBERT: exact GELU, our defaults
    return _take(config, *_SIZES, "max_sequence_length")


def _albert_config(config):
    from keras_bertfam.layers.encoder import sharing_plan

    if config["embedding_dim"] == config["hidden_dim"]:
        raise checkpoints.CheckpointError(
            "embedding_dim == hidden_dim: keras-hub's ALBERT still projects E -> H there, "
            "AlbertBackbone (like the paper's E=768 rows) has no projection.")
    layers, groups = config["num_layers"], config.get("num_groups", 1)
    # keras-hub runs group i // (L / G) at layer i (L a multiple of G); ours int(i / L * G).
    if [i // (layers // groups) for i in range(layers)] != sharing_plan(layers, groups, "all")[0]:
        raise checkpoints.CheckpointError(
            f"num_layers={layers}, num_groups={groups}: keras-hub's group order differs from "
            "AlbertBackbone's.")
    return dict(_take(config, *_SIZES, "max_sequence_length", "num_segments", "embedding_dim",
                      "num_groups", "num_inner_repetitions"), share="all", activation="gelu_approximate")


def _xlnet_config(config):
    return _take(config, *_SIZES, "activation", initializer_range="kernel_initializer_range")


def _xlnet_weights(backbone):
    """Our XLNetBackbone <- keras-hub's XLNetBackbone (both keep XLNet's (H, N, Dh) projections)."""
    out = [(backbone.word_embedding.embeddings, "content_query_embedding/word_embedding/embeddings",
            None),
           (backbone.mask_embedding.mask_emb, "encoder_block_attn_mask_layer/mask_emb", None)]
    for i in range(backbone.num_layers):
        p, attn = f"xlnet_encoder_{i}", backbone.attention_layers[i].attention
        for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value"),
                             ("o", "attention_output"), ("r", "encoding")):
            out.append((getattr(attn, ours), f"{p}/rel_attn/{theirs}/kernel", None))
        out.append((attn.seg_embed, f"{p}/segment_encoding", None))
        for ours, theirs in (("r_w_bias", "content_attention_bias"),
                             ("r_r_bias", "positional_attention_bias"),
                             ("r_s_bias", "segment_attention_bias")):
            out.append((getattr(attn.biases, ours), f"{p}/{theirs}", None))
        out += _norm(attn.layer_norm, f"{p}/layer_norm_rel_attn")
        ff = backbone.feedforward_layers[i]
        out += (_pair(ff.intermediate_dense, f"{p}/feedforward_intermediate_dense")
                + _pair(ff.output_dense, f"{p}/feedforward_output_dense")
                + _norm(ff.layer_norm, f"{p}/layer_norm_ff"))
    return out


_VOCABULARY = ("vocabulary.txt",)

KERAS_HUB = {
    "BertBackbone": KerasHubFormat(
        "bert", _bert_config, _encoder_weights(pooler="pooled_dense"),
        tokenizer_files=_VOCABULARY, tokenizer=_wordpiece),
    # keras-hub's RoBERTa has no pooler: ours keeps its initial weights (what a classifier's new
    # head on <s> starts from in keras-hub too).
    "RobertaBackbone": KerasHubFormat(
        "roberta", _plain_config, _encoder_weights(embeddings="embeddings/", segments=False),
        tokenizer_files=("vocabulary.json", "merges.txt"),
        tokenizer=lambda c: {"kind": "byte_pair",
                             "add_prefix_space": c.get("add_prefix_space", False)}),
    "AlbertBackbone": KerasHubFormat(
        "albert", _albert_config,
        _encoder_weights(projection="embedding_projection", layer="group_{}_inner_layer_{}",
                         pooler="pooled_dense"),
        tokenizer_files=("vocabulary.spm",),
        tokenizer=lambda c: {"kind": "sentencepiece", "lowercase": False, "keep_accents": True}),
    "DistilBertBackbone": KerasHubFormat(
        "distil_bert", _plain_config,
        _encoder_weights(embeddings="token_and_position_embedding/"),
        tokenizer_files=_VOCABULARY, tokenizer=_wordpiece),
    "ElectraBackbone": KerasHubFormat(
        "electra", _electra_config, _encoder_weights(projection="embeddings_projection"),
        unused=("pooled_dense/",),  # keras-hub's ELECTRA has a pooler, HF's and ours none
        tokenizer_files=_VOCABULARY, tokenizer=_wordpiece),
    "XLNetBackbone": KerasHubFormat("xlnet", _xlnet_config, _xlnet_weights),
}


# === Loading ===
def family_of(path, families):
    """-> (our FamilySpec, KerasHubFormat) of the keras-hub preset directory `path`, from its
    backbone's class, or from its tokenizer's (keras-hub names them `XTokenizer` / `XBackbone`)."""
    found = _keras_hub_class(path, "config.json") or _keras_hub_class(path, "tokenizer.json")
    class_name = found.replace("Tokenizer", "Backbone")
    if class_name not in KERAS_HUB:
        raise ValueError(
            f"{path!r} is a keras-hub {found} preset; no family here loads it (keras-hub "
            f"backbones we load: {sorted(KERAS_HUB)}, and their tokenizers).")
    fmt = KERAS_HUB[class_name]
    return families[fmt.family], fmt


def load_backbone(path, spec, fmt, load_weights=True, built=None, **overrides):
    """Our backbone of the keras-hub preset `path`; `built`: see `PresetLoader.load_backbone`."""
    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"The keras-hub preset {path!r} has no config.json: it holds a "
                                "tokenizer only, no backbone.")
    config = read_json(path, "config.json")
    backbone = spec.backbone_cls(**dict(fmt.config(config["config"]), **overrides))
    if config["config"].get("trainable") is False and "trainable" not in overrides:
        backbone.trainable = False  # frozen when saved: keras-hub's from_preset keeps it so
    if built is not None:
        built(backbone)
    if not load_weights:
        return backbone
    weights = os.path.join(path, "model.weights.h5")
    if not os.path.exists(weights):
        raise FileNotFoundError(f"The keras-hub preset {path!r} has no model.weights.h5.")
    import keras
    import keras_hub  # noqa: F401 - registers keras-hub's classes for deserialization

    try:
        kh = keras.saving.deserialize_keras_object(config)
        kh.load_weights(weights)
    except Exception as e:
        raise checkpoints.CheckpointError(
            f"Could not load the keras-hub weights {weights!r}: the file is corrupt or does "
            f"not match its config.json ({type(e).__name__}: {e})."
        ) from e
    # Keras' load_weights fills the model's variables and skips the file's other entries: a
    # config.json with fewer layers than its weights loaded silently, the extra layers dropped.
    stored = _count_arrays(weights)
    if stored != len(kh.weights):
        raise checkpoints.CheckpointError(
            f"{weights!r} holds {stored} weight arrays, the keras-hub {config['class_name']} of "
            f"its config.json {len(kh.weights)}: config.json does not describe this checkpoint "
            f"(another num_layers?); every stored weight must be used.")
    state = {v.path: keras.ops.convert_to_numpy(v) for v in kh.weights}
    mapping = fmt.weights(backbone)
    used = {key for _, key, _ in mapping}
    left = [k for k in state if k not in used and not k.startswith(fmt.unused)]
    if left:
        raise checkpoints.CheckpointError(
            f"The keras-hub {config['class_name']} in {path!r} has {len(left)} weight(s) that "
            f"{type(backbone).__name__} has no place for, e.g. {left[:3]}; this keras-hub layout "
            "is not supported.")
    for variable, _, make in [m for m in mapping if m[1] is None]:
        variable.assign(make(None))
    checkpoints.assign([m for m in mapping if m[1] is not None], state,
                       what=type(backbone).__name__, source=weights)
    return backbone


def _count_arrays(h5_path):
    """The number of arrays (datasets) in a Keras `.weights.h5` file."""
    import h5py

    count = [0]

    def visit(name, item):
        count[0] += isinstance(item, h5py.Dataset)

    with h5py.File(h5_path, "r") as f:
        f.visititems(visit)
    return count[0]


def load_tokenizer(path, spec, fmt):
    """Our family's tokenizer from the keras-hub tokenizer's files, with keras-hub's options."""
    if fmt.tokenizer is None:
        raise ValueError(f"{path!r} is a keras-hub {spec.name!r} preset, and keras-hub has no "
                         f"tokenizer for that family: load one from elsewhere (an HF-format "
                         f"directory or one of our preset directories).")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(f"The keras-hub preset {path!r} has no tokenizer.json (it was "
                                "saved without a tokenizer).")
    assets = os.path.join(path, TOKENIZER_ASSETS)
    missing = [n for n in fmt.tokenizer_files if not os.path.exists(os.path.join(assets, n))]
    if missing:
        raise FileNotFoundError(f"The keras-hub preset {path!r} lacks its tokenizer's "
                                f"{', '.join(missing)} in {assets!r}.")
    return spec.make_tokenizer(fmt.tokenizer(read_json(path, "tokenizer.json")["config"]), assets)


def saved_sequence_length(path, suffix):
    """The `sequence_length` of the keras-hub preprocessor saved in `path` (preprocessor.json)
    when its class name ends with `suffix` (keras-hub's BertTextClassifierPreprocessor: our
    TextClassifierPreprocessor), else None."""
    name = _keras_hub_class(path, "preprocessor.json")
    if name is None or not name.endswith(suffix):
        return None
    length = read_json(path, "preprocessor.json").get("config", {}).get("sequence_length")
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def saved_task_class(path):
    """The keras-hub task class saved in `path` (task.json), or None."""
    return _keras_hub_class(path, "task.json")


# === Task heads (task.json, task.weights.h5) ===
@dataclasses.dataclass(frozen=True)
class KerasHubHead:
    """How one keras-hub task's head maps onto one of our tasks.

    Attributes:
        task: our task class's name.
        config: keras-hub task config -> (our task arguments that compute keras-hub's head, or
            None and the reason none do).
        weights: `(our task) -> [(our variable, keras-hub variable path, None)]`; raises
            CheckpointError where the task built has another head (its arguments overridden).
    """

    task: str
    config: Callable
    weights: Callable


def _no_head_of(task, reason):
    raise checkpoints.CheckpointError(
        f"{type(task).__name__} has {reason}, keras-hub's head has not: its head does not fit.")


def _classifier_config(hidden_activation):
    def config(config):
        if config.get("hidden_dim") not in (None, config["backbone"]["config"]["hidden_dim"]):
            return None, (f"its hidden layer has hidden_dim={config['hidden_dim']}, not the "
                          "backbone's; TextClassifier's is the backbone's hidden_dim")
        # keras-hub's output activation (serialized by Keras: "softmax", ...) is ours
        return dict(_take(config, "dropout", "activation"),
                    hidden_activation=hidden_activation), None
    return config


def _classifier_weights(pooler=None, hidden=None):
    """keras-hub's `logits` on our head; `pooler`: its dense on the first token (RoBERTa's
    `pooled_dense`, tanh) is our backbone's pooler; `hidden`: its dense with an activation
    (DistilBERT's `pooled_dense`, ReLU) is our hidden layer."""
    def weights(task):
        if (task.hidden_dense is not None) != (hidden is not None):
            _no_head_of(task, f"hidden_activation={task.hidden_activation!r}" if hidden is None
                        else "no hidden layer")
        out = []
        if pooler is not None:
            if task.backbone.pooler_dense is None:
                _no_head_of(task, "a backbone without a pooler")
            out += _pair(task.backbone.pooler_dense, pooler)
        if hidden is not None:
            out += _pair(task.hidden_dense, hidden)
        return out + _pair(task.head, "logits")
    return weights


def _masked_lm_config(activation):
    # keras-hub's MaskedLMHead keeps its own epsilon (1e-5), not the backbone's
    return lambda config: ({"head_activation": activation, "head_layer_norm_epsilon": 1e-5},
                           None)


def _masked_lm_weights(task):
    head = task.mlm_head
    return (_pair(head.dense, "mlm_head/intermediate_dense")
            + _norm(head.layer_norm, "mlm_head/intermediate_layer_norm")
            + [(head.bias, "mlm_head/output_bias", None)])


TASK_HEADS = {
    # BERT and ALBERT: dropout -> logits on the pooled output, as ours
    "BertTextClassifier": KerasHubHead("TextClassifier", _classifier_config(None),
                                       _classifier_weights()),
    "AlbertTextClassifier": KerasHubHead("TextClassifier", _classifier_config(None),
                                         _classifier_weights()),
    # dropout -> tanh dense -> dropout -> logits on <s>: our pooler then dropout -> logits (the
    # same function; in training ours has no dropout before the pooler)
    "RobertaTextClassifier": KerasHubHead("TextClassifier", _classifier_config(None),
                                          _classifier_weights(pooler="pooled_dense")),
    # ReLU dense -> dropout -> logits on [CLS]: ours (no dropout before the hidden layer)
    "DistilBertTextClassifier": KerasHubHead("TextClassifier", _classifier_config("relu"),
                                             _classifier_weights(hidden="pooled_dense")),
    "BertMaskedLM": KerasHubHead("MaskedLM", _masked_lm_config("gelu"), _masked_lm_weights),
    "RobertaMaskedLM": KerasHubHead("MaskedLM", _masked_lm_config("gelu"), _masked_lm_weights),
    "AlbertMaskedLM": KerasHubHead("MaskedLM", _masked_lm_config("gelu_approximate"),
                                   _masked_lm_weights),
    "DistilBertMaskedLM": KerasHubHead("MaskedLM", _masked_lm_config("gelu"),
                                       _masked_lm_weights),
}


def task_head(path, task_cls, warn=True):
    """-> (the KerasHubHead of the keras-hub task saved in `path`, our arguments computing its
    head) when `task_cls` loads it; else None, and with `warn` a warning saying why (no task
    saved: None, silently)."""
    task = saved_task_class(path)
    if task is None:
        return None
    head, reason = TASK_HEADS.get(task), None
    if head is None:
        reason = (f"keras-hub's {task} has no counterpart here (the heads loaded: "
                  f"{sorted(TASK_HEADS)})")
    elif head.task != task_cls.__name__:
        reason = f"its head is a {head.task}'s, not a {task_cls.__name__}'s"
    else:
        arguments, reason = head.config(read_json(path, "task.json").get("config", {}))
        if reason is None:
            return head, arguments
    if warn:
        user_warnings.warn(
            f"{path!r} holds a keras-hub {task}: {task_cls.__name__}.from_preset loads its "
            f"backbone and tokenizer, not its head weights (task.weights.h5): {reason}. The head "
            "starts from its initialization.")
    return None


def load_task_head(path, task, head):
    """Loads keras-hub's head weights (`path/task.weights.h5`, read from the file as Keras laid
    it out: `_stored_arrays`; no keras-hub model is built) into `task`, through
    `checkpoints.assign`: every head weight used, shapes checked, values finite."""
    weights = os.path.join(path, "task.weights.h5")
    if not os.path.exists(weights):
        raise FileNotFoundError(f"The keras-hub task preset {path!r} has no task.weights.h5.")
    try:
        stored = _stored_arrays(weights, skip=("optimizer",))
    except Exception as e:  # not an HDF5 file, truncated
        raise integrity.IntegrityError(
            f"Could not read the keras-hub head weights {weights!r}: the file is damaged "
            f"({type(e).__name__}: {e}).") from e
    name = read_json(path, "task.json").get("class_name")
    mapping = head.weights(task)
    left = sorted(set(stored) - {_stored_key(key) for _, key, _ in mapping})
    if left:
        raise checkpoints.CheckpointError(
            f"The keras-hub {name} head in {weights!r} has weight(s) {type(task).__name__} has "
            f"no place for (layer/variable number): {left}; every stored weight must be used.")
    state = {key: stored[_stored_key(key)] for _, key, _ in mapping if _stored_key(key) in stored}
    try:
        checkpoints.assign(mapping, state, what=f"{type(task).__name__} head", source=weights)
    except integrity.IntegrityError:
        raise
    except checkpoints.CheckpointError as e:
        raise checkpoints.CheckpointError(
            f"{weights!r} does not match task.json (the keras-hub {name} the head was built "
            f"from): {e}") from e


# Keras saves a layer's own variables numbered in the order the layer creates them: a Dense's
# kernel and bias, a LayerNormalization's gamma and beta; keras-hub's MaskedLMHead has one of
# its own, its output_bias (its dense and norm are its sublayers).
_VARIABLE_NUMBER = {"kernel": 0, "bias": 1, "gamma": 0, "beta": 1, "output_bias": 0}


def _stored_key(key):
    """A keras-hub variable path ("logits/kernel") -> its `_stored_arrays` key ("logits/0")."""
    layer, _, variable = key.rpartition("/")
    return f"{layer}/{_VARIABLE_NUMBER[variable]}"


def _stored_arrays(h5_path, skip=()):
    """{"layer path/variable number": array} of a Keras `.weights.h5` file, but for the top-level
    groups `skip` (a compiled model's "optimizer").

    Keras' `H5IOStore` (keras/src/saving/saving_lib.py) writes, for each layer at attribute path
    P in the model ("layers/dense", "layers/masked_lm_head/_intermediate_dense"), a group
    "P/vars" holding the layer's name in its "name" attribute and the layer's own variables as
    datasets "0", "1", .... A layer's path here is the names of it and of the layers enclosing
    it, the model's own left out: how its variables' paths begin ("mlm_head/intermediate_dense").
    """
    import h5py

    out = {}
    with h5py.File(h5_path, "r") as f:
        def visit(name, item):
            parts = name.split("/")
            if not isinstance(item, h5py.Dataset) or parts[0] in skip:
                return
            if len(parts) < 3 or parts[-2] != "vars":  # not Keras' layout: kept, never used
                out[name] = item[()]
                return
            groups = ["/".join(parts[:i] + ["vars"]) for i in range(1, len(parts) - 1)]
            names = [str(f[g].attrs.get("name", g)) for g in groups if g in f]
            out["/".join(names + [parts[-1]])] = _array(item)

        f.visititems(visit)
    return out


def _array(dataset):
    """A dataset's values; Keras marks a bfloat16 array it wrote with the attribute dtype."""
    if dataset.attrs.get("dtype") == "bfloat16":
        import ml_dtypes

        return np.array(dataset, dtype=ml_dtypes.bfloat16)
    return dataset[()]
