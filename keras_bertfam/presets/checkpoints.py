"""Checkpoint conversion from HF-format directories (config.json + safetensors / .bin).

Each family contributes one function `(backbone, state_dict) -> [(variable, key, transform)]`;
`assign` does the checking so that a wrong checkpoint fails loudly and names what is wrong.
"""
import json
import os
import re

import numpy as np

from keras_bertfam.presets import integrity
from keras_bertfam.presets.integrity import CheckpointError  # noqa: F401 - its public home

# In HF's order of preference; an ".index.json" names the shards of a checkpoint saved in parts
# (`save_pretrained(max_shard_size=...)`: model-00001-of-00003.safetensors, ...).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def read_hf_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir!r} has no config.json: not an HF-format model directory.")
    cfg = integrity.read_json_object(path)
    # A decoder's checkpoint (HF's BertLMHeadModel, an encoder-decoder's decoder) attends
    # causally and may cross-attend: loaded here it would run as a bidirectional encoder.
    decoder = {k: cfg[k] for k in ("is_decoder", "add_cross_attention") if cfg.get(k)}
    if decoder:
        raise CheckpointError(f"{path!r} is a decoder's config ({decoder}: causal attention"
                              f"{', cross-attention' if 'add_cross_attention' in decoder else ''}"
                              "); the encoders here attend both ways, so it would load as "
                              "another model.")
    return cfg


def weights_file(model_dir):
    """The weights file `load_state_dict(model_dir)` reads (for messages; a sharded
    checkpoint's index)."""
    for name in WEIGHT_FILES:
        if os.path.exists(os.path.join(model_dir, name)):
            return os.path.join(model_dir, name)
    return model_dir


def load_state_dict(model_dir):
    """Numpy arrays by HF parameter name, from model.safetensors or pytorch_model.bin, or from
    the shards their ".index.json" lists (see `_read_shards`)."""
    for name in WEIGHT_FILES:
        path = os.path.join(model_dir, name)
        if not os.path.exists(path):
            continue
        state = _read_shards(model_dir, path) if name.endswith(".index.json") else _read(path)
        return {_legacy_layer_norm_key(k): v for k, v in state.items()}
    raise FileNotFoundError(f"{model_dir!r} has none of {WEIGHT_FILES}.")


def _read(path):
    """One safetensors or torch .bin file -> {name: numpy array}."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.numpy import load_file

            return dict(load_file(path))
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    except Exception as e:  # a truncated or foreign file
        kind = "safetensors" if path.endswith(".safetensors") else "torch .bin"
        raise CheckpointError(f"Could not read weights file {path!r}: it is corrupt or not a "
                              f"{kind} file ({type(e).__name__}: {e}).") from e


_SHARD_NAME = re.compile(r"^(.*)-(\d+)-of-(\d+)(\.[^-]+)$")


def _numbered_shards(shards):
    """Every shard of a set named `<stem>-<i>-of-<N><ext>` (HF's names): 1 .. N, also those the
    index lists no tensor in; other names as they are."""
    parts = [_SHARD_NAME.match(s) for s in shards]
    if not all(parts) or len({(m[1], m[3], m[4], len(m[2])) for m in parts}) != 1:
        return shards
    stem, total, ext, width = parts[0][1], parts[0][3], parts[0][4], len(parts[0][2])
    return [f"{stem}-{i:0{width}d}-of-{total}{ext}" for i in range(1, int(total) + 1)]


def _read_shards(model_dir, index_path):
    """A sharded checkpoint: its index's `weight_map` ({tensor: shard file}) checked against the
    shards, read one at a time. A shard absent, one the index lists no tensor in, a tensor the
    index lists but its shard lacks, or one a shard holds that the index puts in another, is an
    error naming the file and tensor; each shard's values are checked finite naming it."""
    weight_map = integrity.read_json_object(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path!r} has no \"weight_map\" of tensor names to shard "
                              "files: not the index of a sharded checkpoint.")
    listed = sorted(set(weight_map.values()))
    numbered = _numbered_shards(listed)
    absent = [s for s in numbered if not os.path.exists(os.path.join(model_dir, s))]
    if absent:
        raise FileNotFoundError(
            f"{model_dir!r} lacks {len(absent)} of the {len(numbered)} shards of its sharded "
            f"checkpoint, {absent}, which {index_path!r} lists: copy or download every shard.")
    for i, shard in enumerate(numbered):
        if shard not in listed:
            raise CheckpointError(
                f"{os.path.join(model_dir, shard)!r} is shard {i + 1} of {len(numbered)}, but "
                f"{index_path!r} lists no tensor in it: the index is incomplete or from another "
                "save.")
    state = {}
    for shard in listed:
        path = os.path.join(model_dir, shard)
        part = _read(path)
        lacks = sorted(k for k, s in weight_map.items() if s == shard and k not in part)
        if lacks:
            raise CheckpointError(
                f"{path!r} lacks {len(lacks)} tensor(s) {index_path!r} lists in it, e.g. "
                f"{lacks[:3]}: the shard or the index is from another save.")
        for key, value in part.items():
            owner = weight_map.get(key, shard)
            if owner != shard:
                raise CheckpointError(f"{path!r} holds {key!r}, which {index_path!r} lists in "
                                      f"{owner}: the shard or the index is from another save.")
            integrity.check_finite(key, value, path)
        state.update(part)
        del part
    return state


def _legacy_layer_norm_key(key):
    """`LayerNorm.gamma` / `.beta` -> `.weight` / `.bias`: the names of the first ported BERT
    checkpoints, still those of google-bert/bert-base-uncased's model.safetensors, which HF's
    from_pretrained renames the same way (transformers#11809, #35615)."""
    if "LayerNorm." in key:
        if key.endswith("LayerNorm.gamma"):
            return key[:-len("gamma")] + "weight"
        if key.endswith("LayerNorm.beta"):
            return key[:-len("beta")] + "bias"
    return key


def _base_prefix(state_dict, prefixes):
    """The first of `prefixes` the checkpoint's keys use, or None (a base model saved alone)."""
    return next((p for p in prefixes if any(k.startswith(p) for k in state_dict)), None)


def strip_prefix(state_dict, prefixes):
    """Drops the first of `prefixes` that the keys carry ("bert.", "roberta.", ...)."""
    prefix = _base_prefix(state_dict, prefixes)
    if prefix is None:
        return state_dict
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


def assign(mapping, state_dict, what="model", optional=(), hint=None, source="the checkpoint"):
    """Sets each variable from `state_dict[key]` after `transform`; errors name every problem.

    Keys in `optional` may be absent (their variables keep their values); returns those that were.
    `hint` replaces the default guess of what is wrong when weights are missing. Every value must
    be finite (files without our checksummed manifest: a corrupt one would load as NaN); `source`
    names the file in that error.
    """
    absent = [key for _, key, _ in mapping if key not in state_dict]
    missing = [key for key in absent if key not in optional]
    if missing:
        raise CheckpointError(
            f"The checkpoint lacks {len(missing)} weight(s) the {what} needs, e.g. {missing[:3]}; "
            + (hint or "is it a checkpoint of this family, with the config it was saved with?")
        )
    mapping = [m for m in mapping if m[1] in state_dict]
    values = []
    for variable, key, transform in mapping:
        value = np.asarray(state_dict[key], dtype="float32")
        integrity.check_finite(key, value, source)
        value = transform(value) if transform else value
        if tuple(value.shape) != tuple(variable.shape):
            raise CheckpointError(
                f"Shape mismatch for {key}: the checkpoint has {tuple(state_dict[key].shape)}, the "
                f"{what} expects {tuple(variable.shape)} at {variable.path}. Does the config match "
                "the checkpoint?"
            )
        values.append(value)
    for (variable, _, _), value in zip(mapping, values):
        variable.assign(value)
    return absent


# Buffers some HF checkpoints save with the weights: never weights of ours.
HF_BUFFERS = ("position_ids", "token_type_ids")


def base_model_keys(state_dict, prefixes):
    """The keys of the checkpoint's base model (HF's `BertModel` inside `BertForX`), without the
    prefix: those carrying the first of `prefixes` the checkpoint uses, or all keys when it uses
    none (a base model saved alone). The rest are task heads."""
    prefix = _base_prefix(state_dict, prefixes)
    if prefix is None:
        return set(state_dict)
    return {k[len(prefix):] for k in state_dict if k.startswith(prefix)}


def head_keys(state_dict, prefixes):
    """The keys outside the checkpoint's base model (see `base_model_keys`): its task heads."""
    prefix = _base_prefix(state_dict, prefixes)
    return set() if prefix is None else {k for k in state_dict if not k.startswith(prefix)}


def check_all_used(mapping, base_keys, spec, what, source, backbone=None):
    """Every base-model tensor of the checkpoint fills a variable of `mapping`, or is declared
    unused (HF's buffers, the family's `hf_unused`): a config with fewer layers than its
    checkpoint is an error naming the tensors it would drop."""
    used = {key for _, key, _ in mapping}
    declared = tuple(getattr(spec, "hf_unused", ()) or ())
    unused_of = getattr(spec, "hf_unused_of", None)
    if unused_of is not None and backbone is not None:
        used = used | set(unused_of(backbone))
    left = sorted(k for k in base_keys if k not in used and not k.endswith(HF_BUFFERS)
                  and not k.startswith(declared))
    if left:
        raise CheckpointError(
            f"{source!r} holds {len(left)} tensor(s) the {what} has no place for, e.g. "
            f"{left[:4]}: its config.json describes a smaller model than its weights (e.g. fewer "
            "layers than the checkpoint has); fix num_hidden_layers / the sizes in config.json "
            "to match the weights.")


# Fine-tuning tasks whose HF heads can share tensor names (`classifier.weight` is BERT's sequence,
# token and multiple-choice head alike): the checkpoint's `architectures` tells them apart. The
# other tasks' heads (MaskedLM's, the pretrainers') are pretraining objectives'.
FINETUNING_TASKS = ("TextClassifier", "TokenClassifier", "QuestionAnswerer", "MultipleChoice")


class _AnyTask:
    """Stands for any task, layer and variable: a family's head mapping called on it lists its HF
    keys with no model built (equal to anything, for `text_classifier_map`'s activation check)."""

    def __getattr__(self, name):
        return self

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def known_head_keys(spec, finetuning=None):
    """Every HF task-head tensor the family knows: the keys of each task's heads (companions'
    too) and its tied ones (`hf_tied_heads`, the MLM decoder's). `finetuning=True`: of the
    `FINETUNING_TASKS`' heads only; False: of the others' (pretraining heads) only."""
    tasks = {t: h for t, h in (spec.hf_task_heads or {}).items()
             if finetuning is None or (t in FINETUNING_TASKS) == finetuning}
    heads = list(tasks.values()) + [
        companion_heads for task, companions in (spec.hf_task_companions or {}).items()
        if task in tasks for _, companion_heads, _ in companions.values()]
    tied = set(spec.hf_tied_heads or ()) if not finetuning else set()
    return {key for h in heads for _, key, _ in h(_AnyTask())} | tied


def keys_of(mapping, layer):
    """The checkpoint keys of `mapping` that fill `layer`'s variables (none for None)."""
    if layer is None:
        return set()
    ids = {id(w) for w in layer.weights}
    return {key for variable, key, _ in mapping if id(variable) in ids}


# === Transforms: torch Linear (out, in) -> Keras kernels ===
# Each transform carries its `inverse` (Keras -> HF), which `export_to_transformers` uses to read
# the same weight maps in reverse.
def invertible(forward, inverse):
    forward.inverse = inverse
    return forward


def _transpose(w):
    return w.T


transpose = invertible(_transpose, _transpose)


def heads_in(num_heads):
    """(H_out, H_in) -> EinsumDense "btd,dnh" kernel (H_in, N, Hd); bias (H) -> (N, Hd)."""
    return invertible(
        lambda w: w.T.reshape(w.shape[1], num_heads, -1) if w.ndim == 2 else w.reshape(num_heads, -1),
        lambda k: k.reshape(k.shape[0], -1).T if k.ndim == 3 else k.reshape(-1),
    )


def heads_out(num_heads):
    """(H_out, H_in) -> EinsumDense "btnh,nhd" kernel (N, Hd, H_out)."""
    return invertible(lambda w: w.T.reshape(num_heads, -1, w.shape[0]),
                      lambda k: k.reshape(-1, k.shape[-1]).T)


def inverse(transform):
    """The Keras -> HF direction of a mapping's transform (identity for None)."""
    if transform is None:
        return lambda v: v
    if not hasattr(transform, "inverse"):
        raise NotImplementedError(f"The weight transform {transform} has no inverse for export.")
    return transform.inverse


def export_state_dict(mapping):
    """`[(variable, hf_key, transform)]` -> {hf_key: numpy array in HF's layout}."""
    import keras

    return {key: np.ascontiguousarray(inverse(t)(keras.ops.convert_to_numpy(v)).astype("float32"))
            for v, key, t in mapping}


def dense(layer, key):
    return [(layer.kernel, key + ".weight", transpose), (layer.bias, key + ".bias", None)]


def layer_norm(layer, key, names=("weight", "bias")):
    return [(layer.gamma, f"{key}.{names[0]}", None), (layer.beta, f"{key}.{names[1]}", None)]


def attention(mha, keys, num_heads):
    """`keys`: HF names of the query, key, value and output projections."""
    out = []
    for layer, key in zip((mha.query_dense, mha.key_dense, mha.value_dense), keys[:3]):
        out += [(layer.kernel, key + ".weight", heads_in(num_heads)),
                (layer.bias, key + ".bias", heads_in(num_heads))]
    out += [(mha.output_dense.kernel, keys[3] + ".weight", heads_out(num_heads)),
            (mha.output_dense.bias, keys[3] + ".bias", None)]
    return out


# === BERT layout (BERT, RoBERTa, SpanBERT, MiniLM, the ELECTRA encoder) ===
def bert_embeddings_map(embeddings, prefix="embeddings"):
    out = [
        (embeddings.token_embedding.embeddings, f"{prefix}.word_embeddings.weight", None),
        (embeddings.position_embedding.embeddings, f"{prefix}.position_embeddings.weight", None),
    ]
    if embeddings.segment_embedding is not None:
        out.append((embeddings.segment_embedding.embeddings,
                    f"{prefix}.token_type_embeddings.weight", None))
    return out + layer_norm(embeddings.layer_norm, f"{prefix}.LayerNorm")


def bert_layer_map(block, prefix, num_heads):
    p = prefix
    attn = block.attention
    ffn = block.feedforward
    return (
        attention(attn.attention, [f"{p}.attention.self.query", f"{p}.attention.self.key",
                                   f"{p}.attention.self.value", f"{p}.attention.output.dense"],
                  num_heads)
        + layer_norm(attn.layer_norm, f"{p}.attention.output.LayerNorm")
        + dense(ffn.intermediate_dense, f"{p}.intermediate.dense")
        + dense(ffn.output_dense, f"{p}.output.dense")
        + layer_norm(ffn.layer_norm, f"{p}.output.LayerNorm")
    )


def bert_backbone_map(backbone):
    mapping = bert_embeddings_map(backbone.embeddings)
    for i in range(backbone.num_layers):
        mapping += bert_layer_map(backbone.encoder.layer_block(i), f"encoder.layer.{i}",
                                  backbone.num_heads)
    if backbone.pooler_dense is not None:
        mapping += dense(backbone.pooler_dense, "pooler.dense")
    return mapping


def bert_config_from_hf(cfg):
    """HF BertConfig -> BertBackbone arguments."""
    activation = {"gelu": "gelu", "gelu_new": "gelu_approximate",
                  "gelu_pytorch_tanh": "gelu_approximate"}.get(cfg.get("hidden_act", "gelu"))
    if activation is None:
        raise CheckpointError(f"hidden_act={cfg['hidden_act']!r} is not a GELU BERT converts.")
    config = dict(
        vocabulary_size=cfg["vocab_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        hidden_dim=cfg["hidden_size"],
        intermediate_dim=cfg["intermediate_size"],
        dropout=cfg.get("hidden_dropout_prob", 0.1),
        max_sequence_length=cfg["max_position_embeddings"],
        num_segments=cfg.get("type_vocab_size", 2),
        layer_norm_epsilon=cfg.get("layer_norm_eps", 1e-12),
        initializer_range=cfg.get("initializer_range", 0.02),
    )
    if activation != "gelu":
        config["activation"] = activation
    return config


def mlm_head_map(head, transform, norm, bias):
    """A `MaskedLMHead` <- an HF MLM head: its transform Dense, LayerNorm and output bias keys (the
    decoder weight is tied to the word embeddings in every family)."""
    return (dense(head.dense, transform) + layer_norm(head.layer_norm, norm)
            + [(head.bias, bias, None)])


def bert_mlm_head_map(head, prefix="cls.predictions"):
    return mlm_head_map(head, f"{prefix}.transform.dense", f"{prefix}.transform.LayerNorm",
                        f"{prefix}.bias")


HF_ACTIVATION_NAMES = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}


def hf_activation(backbone):
    """Our activation name -> HF's `hidden_act`."""
    activation = getattr(backbone, "activation", "gelu")
    if activation not in HF_ACTIVATION_NAMES:
        raise NotImplementedError(f"activation={activation!r} has no HF hidden_act to export.")
    return HF_ACTIVATION_NAMES[activation]


def bert_config_to_hf(backbone, model_type="bert", architecture="BertModel"):
    """BertBackbone -> HF BertConfig dict (the reverse of `bert_config_from_hf`); the BERT-layout
    families (RoBERTa, ALBERT, ELECTRA, SpanBERT) start from it."""
    return dict(
        model_type=model_type,
        architectures=[architecture],
        vocab_size=backbone.vocabulary_size,
        num_hidden_layers=backbone.num_layers,
        num_attention_heads=backbone.num_heads,
        hidden_size=backbone.hidden_dim,
        intermediate_size=backbone.intermediate_dim,
        hidden_act=hf_activation(backbone),
        hidden_dropout_prob=backbone.dropout,
        attention_probs_dropout_prob=backbone.dropout,
        max_position_embeddings=backbone.max_sequence_length,
        type_vocab_size=backbone.num_segments,
        layer_norm_eps=backbone.layer_norm_epsilon,
        initializer_range=backbone.initializer_range,
        pad_token_id=0,
    )


def bert_pair_head_map(head, key="cls.seq_relationship"):
    return dense(head.dense, key)


def classifier_head_map(task, key="classifier"):
    """`*ForTokenClassification` (every BERT-layout family): one Linear after dropout, HF's
    `classifier` -> our TokenClassifier `head`."""
    return dense(task.head, key)


def question_answerer_map(task, key="qa_outputs"):
    """`*ForQuestionAnswering` (every BERT-layout family and Longformer) and XLNet's
    `XLNetForQuestionAnsweringSimple`: one Linear to (start, end) logits, HF's `qa_outputs` -> our
    QuestionAnswerer `span_head`."""
    return dense(task.span_head.dense, key)


def sequence_summary_config(summary_type, activation):
    """`FamilySpec.hf_head_config` of a family whose HF heads summarize with `SequenceSummary`
    (ELECTRA's multiple choice, XLNet's classifiers): one token (`summary_type` "first" or
    "last") through the `summary` Linear and `activation`, the settings our hidden layer
    computes."""
    return {"sequence_summary.": {"summary_type": summary_type, "summary_use_proj": True,
                                  "summary_activation": activation}}


def text_classifier_map(task, key="classifier", hidden=None, activation=None):
    """`*ForSequenceClassification` -> TextClassifier and `*ForMultipleChoice` -> MultipleChoice
    (their `build_classification_head`): the Linear `key` into the task's `head` and, where HF's
    head has a hidden layer on the first-token state (`hidden`, then `activation`), that Linear
    into its `hidden_dense`. BERT / ALBERT: `classifier` alone."""
    if task.hidden_activation != activation:
        theirs = f"{hidden} -> {activation} -> {key}" if hidden else key
        raise CheckpointError(
            f"{type(task).__name__}(hidden_activation={task.hidden_activation!r}) has no "
            f"counterpart in HF's head ({theirs}); the family's default ('auto') is "
            f"{activation!r}.")
    return (dense(task.hidden_dense, hidden) if hidden else []) + dense(task.head, key)


# === Tokenizer files for export ===
def write_tokenizer_config(model_dir, tokenizer_class, **options):
    """`tokenizer_config.json`: which HF tokenizer class reads the files, with its options."""
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class=tokenizer_class, **options), f, indent=2)


def save_asset_as(tokenizer, model_dir, renames):
    """The tokenizer's `save_assets` files (keras-hub's names) under HF's `{ours: hf}` names."""
    tokenizer.save_assets(model_dir)
    for ours, hf in renames.items():
        if not os.path.exists(os.path.join(model_dir, ours)):
            raise FileNotFoundError(f"{type(tokenizer).__name__}.save_assets wrote no {ours}.")
        os.replace(os.path.join(model_dir, ours), os.path.join(model_dir, hf))
