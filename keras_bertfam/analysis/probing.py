"""Probing classifiers on frozen per-layer representations (Tenney et al. 2019; Hewitt & Liang
2019): a linear or MLP probe per layer for a token- or sentence-level property, and edge probing
of span pairs with self-attentive span pooling."""
import dataclasses

import keras
import numpy as np
from keras import ops

from keras_bertfam.analysis._common import backbone_of, banded_attention, to_numpy
from keras_bertfam.layers.utils import serialize_initializer


@dataclasses.dataclass
class ProbeResult:
    """`scores[i]`: held-out accuracy of the probe on layer `layers[i]` (0 = embeddings);
    `majority`: the accuracy of always predicting the most frequent training label."""

    layers: list
    scores: list
    train_scores: list
    majority: float
    kind: str

    def table(self):
        return [{"layer": layer, "accuracy": s} for layer, s in zip(self.layers, self.scores)]


def _layers(backbone, layers):
    total = int(backbone.num_layers) + 1  # the embedding output, then every layer
    if isinstance(layers, str) and layers == "all":
        return list(range(total))
    if isinstance(layers, str) or not isinstance(layers, (int, np.integer, list, tuple,
                                                          range, np.ndarray)):
        raise ValueError(f"layers must be 'all' or a list of layer indices, got {layers!r}.")
    layers = [layers] if isinstance(layers, (int, np.integer)) else (
        layers.reshape(-1).tolist() if isinstance(layers, np.ndarray) else list(layers))
    if not layers:
        raise ValueError(f"layers is empty: give 'all' or indices 0 (embeddings) to {total - 1}.")
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
                0 <= layer < total):
            raise ValueError(f"Layer {layer!r} is out of range: representations 0 (embeddings) "
                             f"to {total - 1} exist.")
    return [int(x) for x in layers]


def representations(backbone, features, layers="all", batch_size=32):
    """Frozen hidden states: `{layer: (B, T, H) float32}` for packed model inputs `features`."""
    backbone = backbone_of(backbone, "representations")
    layers = _layers(backbone, layers)
    n = len(features["token_ids"])
    out = {layer: [] for layer in layers}
    if banded_attention(backbone) and "global_attention_mask" not in features:
        # Longformer without global tokens: every token attends in its window (HF's default)
        features = dict(features, global_attention_mask=np.zeros_like(
            np.asarray(features["token_ids"]), "int32"))
    for start in range(0, n, batch_size):
        batch = {k: np.asarray(v)[start:start + batch_size] for k, v in features.items()}
        states = backbone.inspect(batch)["hidden_states"]
        for layer in layers:
            out[layer].append(to_numpy(states[layer]).astype("float32"))
    return {layer: np.concatenate(parts) for layer, parts in out.items()}


def _split(n, validation_split, seed):
    if not 0 < validation_split < 1:
        raise ValueError(f"validation_split must be in (0, 1), got {validation_split!r}.")
    order = np.random.default_rng(seed).permutation(n)
    k = max(1, int(round(n * validation_split)))
    if k >= n:
        raise ValueError(
            f"validation_split={validation_split} of {n} examples leaves no example to train "
            "on: a probe needs at least 2 examples and a split that keeps some for training.")
    return order[k:], order[:k]


def _probe_model(inputs, num_classes, kind, hidden, seed):
    init = keras.initializers.GlorotUniform(seed=seed)
    x = inputs
    if kind == "mlp":
        x = keras.layers.Dense(hidden, activation="relu", kernel_initializer=init)(x)
    elif kind != "linear":
        raise ValueError(f"kind must be 'linear' or 'mlp', got {kind!r}.")
    outputs = keras.layers.Dense(num_classes, kernel_initializer=init)(x)
    return keras.Model(inputs, outputs)


def _compile(model, learning_rate):
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def _fresh_model(models, width, build, learning_rate):
    """A probe's model for representations of `width` (`models`: the call's, by width):
    `build(width)` (its initializers seeded), compiled once, so its train and test steps are
    traced once for every layer of that width rather than once a layer (~1.2 s each on 2 CPU
    cores), and set to the weights and optimizer state a new model has: the seeded initial
    weights, no step taken, zero moments."""
    if width not in models:
        model = build(width)
        _compile(model, learning_rate)
        # Its compiled loss and metrics built before the first fit, as a Task's are: on
        # TensorFlow without a strategy Keras makes them inside the first trace of the train
        # step, which is then traced a second time (a tf.function that creates variables).
        model._symbolic_build(data_batch=(model.input, keras.KerasTensor((None,), "int64")))
        model.optimizer.build(model.trainable_variables)
        models[width] = (model, model.get_weights(),
                         [to_numpy(v) for v in model.optimizer.variables])
    model, weights, state = models[width]
    model.set_weights(weights)
    for variable, value in zip(model.optimizer.variables, state):
        variable.assign(value)
    return model


def _epochs(train, batch_size, seed):
    """`train` reshuffled every epoch in batches of batch_size (the last one partial), epoch after
    epoch without end: epoch e's order a function of (seed, e) alone, so that every iterator of
    the pipeline starts with the same orders (a seeded `shuffle` draws a new order for each new
    iterator, and Keras opens an extra one in a model's first fit on JAX and torch) and every
    layer's probe and every call with that seed sees the same ones."""
    import tensorflow as tf

    train = tf.nest.map_structure(tf.constant, train)
    n = len(tf.nest.flatten(train)[-1])

    def epoch(e):
        key = tf.random.stateless_uniform([n], seed=tf.stack([tf.constant(seed, tf.int64), e]))
        return tf.data.Dataset.from_tensor_slices(tf.argsort(key)).batch(batch_size)

    return tf.data.Dataset.counter().flat_map(epoch).map(
        lambda rows: tf.nest.map_structure(lambda a: tf.gather(a, rows), train))


def _fit(model, train, val, epochs, batch_size, seed):
    # The examples reshuffled every epoch (`_epochs`), as fit(arrays, shuffle=True), but read
    # from ONE iterator over the endless pipeline: given arrays, Keras opens a new one every
    # epoch (on TensorFlow ~20-50 ms each: the README's 7-layer probe, 30 epochs, spent 58% of
    # its time opening 210 iterators).
    n = len(train[1])
    model.fit(_epochs(train, batch_size, seed), epochs=epochs,
              steps_per_epoch=-(-n // batch_size), shuffle=False, verbose=0)  # shuffled above
    return (float(model.evaluate(*train, verbose=0, batch_size=256)[1]),
            float(model.evaluate(*val, verbose=0, batch_size=256)[1]))


def probe(backbone, data, layers="all", kind="linear", pooling="mean", validation_split=0.25,
          epochs=30, learning_rate=1e-2, hidden_dim=64, batch_size=64, seed=0):
    """Trains a probe on each layer's frozen representations and scores it on held-out examples.

    Args:
        backbone: a backbone of any family (or a task: its backbone). Its weights are not trained.
        data: `(features, labels)`: packed model inputs (`token_ids`, `padding_mask`, ...: (B, T))
            and labels, (B,) for a sentence-level property (the sequence is pooled: `pooling`
            "mean" over real tokens or "first", each row's first real token: [CLS] for
            BERT-like families; XLNet, left-padded, its first text token, as its <cls> summary
            token is last), or (B, T) for a token-level one (-1: ignored,
            e.g. padding and special tokens).
        layers: "all" (0 = the embedding output, then each layer) or a list of indices.
        kind: "linear" (a softmax regression) or "mlp" (one ReLU layer of `hidden_dim`).
        validation_split: the held-out fraction (of sentences, for both levels), seeded.
        seed: the split's, the probe's initial weights' and its examples' order: every layer's
            probe starts from the same weights (one model per representation width, reset
            before each layer) and sees the examples in the same orders; a call repeats its
            results.

    Returns:
        `ProbeResult` (per layer held-out accuracy; compare with a control such as a randomly
        initialized model of the same architecture, Hewitt & Liang 2019).
    """
    backbone = backbone_of(backbone, "probe")
    features, labels = _check_data(data, backbone)
    layers = _layers(backbone, layers)
    if pooling not in ("mean", "first"):
        raise ValueError(f"pooling must be 'mean' or 'first', got {pooling!r}.")
    reps = representations(backbone, features, layers, batch_size)
    token_level = labels.ndim == 2
    mask = np.asarray(features["padding_mask"]).astype(bool)
    train, val = _split(len(labels), validation_split, seed)

    def flatten(rows, x):
        if token_level:
            keep = (labels[rows] >= 0) & mask[rows]
            return x[rows][keep], labels[rows][keep]
        if pooling == "mean":
            m = mask[rows][..., None].astype("float32")
            pooled = (x[rows] * m).sum(1) / np.maximum(m.sum(1), 1.0)
        else:  # "first": the first real token (XLNet left-pads)
            pooled = x[rows][np.arange(len(rows)), mask[rows].argmax(1)]
        return pooled, labels[rows]

    num_classes = int(labels.max()) + 1
    _, y_train = flatten(train, reps[layers[0]])
    majority = float(np.mean(flatten(val, reps[layers[0]])[1] == np.bincount(y_train).argmax()))
    scores, train_scores, models = [], [], {}
    for layer in layers:
        xt, yt = flatten(train, reps[layer])
        xv, yv = flatten(val, reps[layer])
        mean, std = xt.mean(0), xt.std(0) + 1e-6  # standardized features: one lr for all layers
        model = _fresh_model(models, xt.shape[-1], lambda width: _probe_model(
            keras.Input((width,)), num_classes, kind, hidden_dim, seed), learning_rate)
        tr, va = _fit(model, ((xt - mean) / std, yt), ((xv - mean) / std, yv), epochs,
                      batch_size, seed)
        train_scores.append(tr)
        scores.append(va)
    return ProbeResult(layers, scores, train_scores, majority, kind)


def _check_data(data, backbone=None):
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], dict)):
        raise TypeError("data must be (features, labels): a dict of packed model inputs "
                        "(token_ids, padding_mask, ...) and an array of labels.")
    features, labels = data
    missing = [k for k in ("token_ids", "padding_mask") if k not in features]
    if missing:
        raise ValueError(f"features lack {missing}: a probe takes packed model inputs, a dict "
                         f"with token_ids and padding_mask (B, T); got {sorted(features)}.")
    ids = np.asarray(features["token_ids"])
    if ids.ndim != 2 or not ids.size:
        raise ValueError(f"token_ids must be a non-empty (B, T) array, got shape {ids.shape}.")
    vocabulary = getattr(backbone, "vocabulary_size", None)
    if vocabulary and (ids.min() < 0 or ids.max() >= vocabulary):
        bad = ids.max() if ids.max() >= vocabulary else ids.min()
        raise ValueError(f"token_ids hold {bad}, outside the model's vocabulary of "
                         f"{vocabulary} ids (0 to {vocabulary - 1}).")
    positions = getattr(backbone, "max_sequence_length", None)
    if positions and getattr(backbone, "family", None) != "xlnet" and ids.shape[1] > positions:
        raise ValueError(f"The features have {ids.shape[1]} tokens per example, more than the "
                         f"model's max_sequence_length={positions}.")
    labels = np.asarray(labels)
    n = len(ids)
    if labels.ndim not in (1, 2) or len(labels) != n:
        raise ValueError(f"labels must be (B,) or (B, T) with B={n} examples, got shape "
                         f"{labels.shape}.")
    if labels.ndim == 2 and labels.shape != np.asarray(features["token_ids"]).shape:
        raise ValueError(f"token labels {labels.shape} must match token_ids "
                         f"{np.asarray(features['token_ids']).shape}.")
    if not np.issubdtype(labels.dtype, np.integer) or labels.max() < 0:
        raise ValueError("labels must be integer class ids (>= 0; -1 ignores a token).")
    if labels.ndim == 1 and labels.min() < 0:
        i = int(np.argmax(labels < 0))
        raise ValueError(f"sentence labels must be class ids >= 0, got {labels[i]} at example "
                         f"{i} (-1 ignores a token only in (B, T) token labels).")
    return features, labels.astype("int64")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SelfAttentiveSpanPool(keras.layers.Layer):
    """Tenney et al. 2019's span representation: attention weights `softmax(w . h_t)` over the
    tokens of the span, and their weighted sum. Inputs: states (B, T, H), span mask (B, T).
    `kernel_initializer`: the score's (its bias starts at 0)."""

    def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        self.score = keras.layers.Dense(1, kernel_initializer=self.kernel_initializer,
                                        name="span_score")
        self.score.build(input_shape[0])
        self.built = True

    def call(self, inputs):
        states, span = inputs
        logits = self.score(states)[..., 0]  # (B, T)
        logits = ops.where(ops.cast(span, "bool"), logits, ops.cast(-1e9, logits.dtype))
        weights = ops.softmax(logits, axis=-1)  # (B, T)
        return ops.einsum("bt,bth->bh", weights, states)  # (B, H)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[0][-1])

    def get_config(self):
        config = super().get_config()
        config.update(kernel_initializer=serialize_initializer(self.kernel_initializer))
        return config


def _edge_model(length, width, num_classes, hidden_dim, projection_dim, seed):
    """Every kernel seeded (`seed`, `seed + 1`, ...: the two span scores start apart)."""
    def init(k):
        return keras.initializers.GlorotUniform(seed + k)

    states = keras.Input((length, width), name="states")
    span1 = keras.Input((length,), name="span1")
    span2 = keras.Input((length,), name="span2")
    projected = keras.layers.Dense(projection_dim, name="projection",
                                   kernel_initializer=init(0))(states)  # (B, T, P)
    a = SelfAttentiveSpanPool(init(1), name="pool1")([projected, span1])
    b = SelfAttentiveSpanPool(init(2), name="pool2")([projected, span2])
    x = keras.layers.Concatenate()([a, b])  # (B, 2P)
    x = keras.layers.Dense(hidden_dim, activation="relu", kernel_initializer=init(3))(x)
    logits = keras.layers.Dense(num_classes, kernel_initializer=init(4))(x)
    return keras.Model({"states": states, "span1": span1, "span2": span2}, logits)


def _span_masks(spans, length, name, n):
    spans = np.asarray(spans)
    if spans.ndim != 2 or spans.shape[1] != 2 or len(spans) != n:
        raise ValueError(f"{name} must be (B, 2) [start, end) token positions with B={n} "
                         f"examples, got shape {spans.shape}.")
    if not np.issubdtype(spans.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token positions, got dtype {spans.dtype} "
                         f"(e.g. {spans.ravel()[:2].tolist()}).")
    if (spans[:, 0] < 0).any() or (spans[:, 1] > length).any() or (
            spans[:, 1] <= spans[:, 0]).any():
        raise ValueError(f"{name} must hold non-empty [start, end) spans within the {length} "
                         "positions.")
    positions = np.arange(length)[None, :]
    return ((positions >= spans[:, :1]) & (positions < spans[:, 1:])).astype("float32")


def edge_probe(backbone, data, layers="all", validation_split=0.25, epochs=30,
               learning_rate=3e-3, hidden_dim=64, projection_dim=64, batch_size=64, seed=0):
    """Edge probing (Tenney et al. 2019): per layer, each span pooled by self-attention over its
    tokens (after a learned projection), an MLP on the pair, scored on held-out examples.

    Args:
        data: `(features, spans1, spans2, labels)`: packed inputs (B, T), two (B, 2) arrays of
            `[start, end)` token positions, and (B,) labels.
        seed: the held-out split's, the probe's initial weights' (every kernel seeded) and its
            examples' order: every layer's probe starts from the same weights and a fresh
            optimizer (one model per representation width, reset before each layer, as
            `probe`'s) and sees the examples in the same orders; a call repeats its results.

    Returns:
        `ProbeResult` (kind "edge").
    """
    backbone = backbone_of(backbone, "edge_probe")
    if not (isinstance(data, (tuple, list)) and len(data) == 4):
        raise TypeError("edge_probe data must be (features, spans1, spans2, labels).")
    features, spans1, spans2, labels = data
    features, labels = _check_data((features, labels), backbone)
    if labels.ndim != 1:
        raise ValueError("edge_probe labels are one class per span pair: shape (B,).")
    length = np.asarray(features["token_ids"]).shape[1]
    m1 = _span_masks(spans1, length, "spans1", len(labels))
    m2 = _span_masks(spans2, length, "spans2", len(labels))
    layers = _layers(backbone, layers)
    reps = representations(backbone, features, layers, batch_size)
    train, val = _split(len(labels), validation_split, seed)
    num_classes = int(labels.max()) + 1
    majority = float(np.mean(labels[val] == np.bincount(labels[train]).argmax()))
    scores, train_scores, models = [], [], {}
    for layer in layers:
        x = reps[layer]
        mean, std = x[train].mean((0, 1)), x[train].std((0, 1)) + 1e-6
        x = (x - mean) / std

        def part(rows):
            return {"states": x[rows], "span1": m1[rows], "span2": m2[rows]}, labels[rows]

        model = _fresh_model(models, x.shape[-1], lambda width: _edge_model(
            length, width, num_classes, hidden_dim, projection_dim, seed), learning_rate)
        tr, va = _fit(model, part(train), part(val), epochs, batch_size, seed)
        train_scores.append(tr)
        scores.append(va)
    return ProbeResult(layers, scores, train_scores, majority, "edge")


def plot_probe(results, path, title="probing accuracy by layer"):
    """`results`: `{label: ProbeResult}` (e.g. the model and its random-init control) -> PNG."""
    from keras_bertfam.analysis.plots import plot_curve

    if isinstance(results, ProbeResult):
        results = {results.kind: results}
    series = {label: (r.layers, r.scores) for label, r in results.items()}
    first = next(iter(results.values()))
    series["majority class"] = (first.layers, [first.majority] * len(first.layers))
    return plot_curve(series, path, "layer (0 = embeddings)", "held-out accuracy", title)
