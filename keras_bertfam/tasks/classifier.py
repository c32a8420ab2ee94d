"""Fine-tuning: sequence classification and regression on the [CLS] / pooled output."""
import keras
import numpy as np
from keras import ops

from keras_bertfam.models.backbone import complete_inputs, head_initializer
from keras_bertfam.preprocessing.finetuning import (MULTI_LABEL, MULTI_TARGET, NOT_AN_INTEGER,
                                                    NOT_FINITE, TEXT_TARGET, check_label_shape)
from keras_bertfam.tasks.losses import weight_sum
from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


def pooled(backbone, features, cls_only=True):
    """The backbone's pooled (tanh) [CLS] state where the family has a pooler, else its [CLS]
    state (at `backbone.cls_token_index`: XLNet's `<cls>` is last). With `cls_only` and a
    family that `supports_cls_only`, the backbone runs as `backbone(features, cls_only=True)`:
    its last layer computes the [CLS] row alone (the same state); Longformer and XLNet run in
    full."""
    if cls_only and backbone.supports_cls_only:
        outputs = backbone(features, cls_only=True)
    else:
        outputs = backbone(features)
    if "pooled_output" in outputs:
        return outputs["pooled_output"]
    return outputs["sequence_output"][:, backbone.cls_token_index, :]


def build_classification_head(task, units, hidden_activation, name, dropout_first=None):
    """The head TextClassifier and MultipleChoice put on the pooled output, as layers of `task`
    (which has its `backbone` and `dropout`): `dropout_layer -> head`, `Dense(units)` named
    `name`; with a `hidden_activation` ("auto": the backbone's `classifier_hidden_activation`),
    `[dropout_layer ->] hidden_dense -> hidden_dropout -> head`, `hidden_dense` a
    `Dense(hidden_dim, hidden_activation)`; `dropout_first=False` leaves out the dropout before
    it (`dropout_layer` is then None; None: the backbone's `classifier_dropout_first`, HF's
    sequence-classification head). Sets `task.hidden_activation` to the activation resolved.
    `classification_logits` runs it."""
    backbone = task.backbone
    if hidden_activation == "auto":
        hidden_activation = backbone.classifier_hidden_activation
    task.hidden_activation = hidden_activation
    if dropout_first is None:
        dropout_first = backbone.classifier_dropout_first
    task.dropout_layer = None
    if hidden_activation is None or dropout_first:
        task.dropout_layer = keras.layers.Dropout(task.dropout, name="head_dropout")
    # Built only with an activation: the other families keep their weights' names.
    task.hidden_dense = task.hidden_dropout = None
    if hidden_activation is not None:
        task.hidden_dense = keras.layers.Dense(
            backbone.hidden_dim, activation=hidden_activation,
            kernel_initializer=head_initializer(backbone), name="hidden_dense")
        task.hidden_dropout = keras.layers.Dropout(task.dropout, name="hidden_dropout")
    task.head = keras.layers.Dense(units, kernel_initializer=head_initializer(backbone),
                                   name=name)


def classification_logits(task, x):
    """`build_classification_head`'s layers of `task` on the pooled output `x` -> logits."""
    if task.dropout_layer is not None:
        x = task.dropout_layer(x)
    if task.hidden_dense is not None:
        x = task.hidden_dropout(task.hidden_dense(x))
    return task.head(x)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TextClassifier(Task):
    """Single-sentence or sentence-pair classification (GLUE), regression when `num_classes=1`.

    `dropout -> Dense(num_classes)` on the pooled output (the [CLS] state for families without a
    pooler), as in BERT's `run_classifier`. With a `hidden_activation`, a hidden layer comes
    first: `dropout -> Dense(hidden_dim, hidden_activation) -> dropout -> Dense(num_classes)`, the
    head of HF's `ElectraForSequenceClassification` (GELU), `DistilBertForSequenceClassification`
    (ReLU, with no dropout before it: the backbone's `classifier_dropout_first`) and
    `XLNetForSequenceClassification` (tanh: its sequence summary; XLNet's rows are packed
    `A <sep> (B <sep>) <cls>`, padded on the left, and read at `<cls>`, the last position).
    `hidden_activation="auto"` takes the backbone's `classifier_hidden_activation`: "relu" for
    DistilBERT, "gelu" for ELECTRA, "tanh" for XLNet, None (no hidden layer) for the others, so
    HF's heads convert both ways (RoBERTa's dense + tanh is the backbone's pooler). Loss: mean
    cross-entropy (MSE for regression).

    Raw strings work in `fit` / `evaluate` / `predict` with the attached preprocessor
    (`TextClassifierPreprocessor`): `x` is a list of strings or a tuple of two lists (pairs).

    `cls_only=True` (the default) runs the backbone's last transformer layer at [CLS] only, where
    the family allows it (`backbone.supports_cls_only`: the `EncoderBackbone` families;
    Longformer and XLNet run in full): its queries, attention output, LayerNorms and
    feed-forward for that one row, keys and values from every position. The logits and
    gradients are those of the full path (to float rounding). On the 6-layer MiniLM
    (`all_minilm_l6_v2`, batch 32 x 31 tokens) that is 13.5% fewer encoder matmul FLOPs, and a
    train step used 10% less CPU time (predict 13%; TensorFlow on a shared 2-core CPU, medians
    of interleaved rounds). In training, dropout in that layer draws masks of the smaller shape,
    so the random draws (not their distribution) differ from those of `cls_only=False`, which
    runs the whole last layer. The weights and their saved paths are the same either way.

    `activation` (keras-hub's): None (the default) returns the logits; a Keras activation (a
    name such as "softmax", or a callable) is applied to them by a weightless
    `Activation` layer named "output_activation" after the `logits` Dense, so the weights, their
    names and the saved files are those of `activation=None`; it runs in float32 (under mixed
    precision too, as Keras advises for a softmax). `predict` and `fit`'s `y_pred` are
    then the activation's outputs, and the parts of the library that need logits read them
    before it (`logits(inputs)`): the SavedModel's `logits` / `probabilities` / `labels` are those
    of `activation=None` on the same weights (a regression's `scores` are its predictions, after
    the activation). The default loss (no `compile(loss=...)`) is the
    cross-entropy of the logits, taken from the outputs: from logits for None and "log_softmax",
    from probabilities for "softmax" (as keras-hub's `from_logits=False`); with `num_classes >
    1` and any other activation (e.g. "sigmoid") it cannot be taken, and `compile()` without a
    loss, `fit` / `evaluate` (which compile with the defaults) and the analysis tools refuse it,
    asking for a loss (keras-hub computes it from logits, silently wrong). Regression
    (`num_classes=1`) takes the MSE of the outputs under any activation.

    Example:
    >>> clf = kb.tasks.TextClassifier.from_preset("bert_tiny_en_uncased", num_classes=2)  # doctest: +SKIP
    >>> clf.fit(["great film", "dull"], [1, 0], epochs=1)  # doctest: +SKIP
    """

    preprocessor_args = ("sequence_length", "pad_to_batch_max", "group_by_length",
                         "pad_to_multiple_of", "truncate")
    preprocessor_shared_args = ("num_classes",)
    default_learning_rate = 5e-5
    global_attention_task = "TextClassifier"
    labels_are_one_array = True
    follows_xlnet_layout = True

    # Constructor arguments that act on the outputs after the logits, not on what the weights
    # compute (`weights_files.function_settings` leaves them out: keras-hub's output
    # `activation` is not the backbone's).
    output_settings = ("activation",)

    def __init__(self, backbone, num_classes=2, preprocessor=None, dropout=0.1,
                 hidden_activation="auto", cls_only=True, activation=None, **kwargs):
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
        self.activation = output_activation(activation, type(self).__name__)
        self.backbone = backbone
        self.num_classes = num_classes
        self.preprocessor = share_num_classes(preprocessor, num_classes)
        self.dropout = dropout
        self.cls_only = cls_only
        build_classification_head(self, num_classes, hidden_activation, name="logits")
        inputs, features = backbone_inputs(backbone, task=self.global_attention_task)
        logits = classification_logits(self, pooled(backbone, features, cls_only))
        outputs = logits
        if self.activation is not None:
            # in float32 under mixed precision (probabilities in float16 round to 1 and 0)
            outputs = keras.layers.Activation(self.activation, dtype="float32",
                                              name="output_activation")(logits)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        # A second functional model on the same layers and weights, out of Keras' sight (its
        # saving walks every attribute: it would save it too).
        object.__setattr__(self, "_logits_model", _Untracked(
            None if self.activation is None else keras.Model(inputs, logits)))
        self._track_losses(["mse" if num_classes == 1 else "accuracy"])

    def logits(self, inputs, training=False):
        """The logits on model inputs (a dict, as the task's call takes): the outputs before
        `activation` (with activation=None, the outputs)."""
        model = self._logits_model.value
        if model is None:
            return self(inputs, training=training)
        return model(complete_inputs(self, inputs), training=training)

    def get_config(self):
        config = super().get_config()
        if self.activation is not None:
            config["activation"] = keras.activations.serialize(self.activation)
        return config

    def compile(self, *args, **kwargs):
        """`Task.compile`; without a `loss`, the default one must be computable from this
        task's outputs (see the class docstring, `activation`)."""
        loss = kwargs.get("loss")
        if loss is None or isinstance(loss, str) and loss == "auto":
            self.default_loss_from_logits()
        super().compile(*args, **kwargs)

    def default_loss_from_logits(self):
        """Whether the default cross-entropy reads the outputs as logits (True: None,
        "log_softmax") or as probabilities (False: "softmax"); a ValueError for any other
        activation of a classifier (its outputs give no cross-entropy of the logits)."""
        activation = self.activation
        if activation is None or activation is keras.activations.log_softmax:
            return True
        if activation is keras.activations.softmax or self.num_classes == 1:
            return False
        name = getattr(activation, "__name__", repr(activation))
        raise ValueError(
            f"{type(self).__name__}(activation={name!r}): the default loss is the softmax "
            f"cross-entropy of the logits, which {name!r} outputs do not give (keras-hub takes "
            f"them for logits). Pass compile(loss=...) a loss for these outputs (e.g. "
            f"keras.losses.BinaryCrossentropy() on one-hot labels for 'sigmoid'), or use "
            f"activation='softmax' or None.")

    def serving_call(self, inputs):
        # A classifier's serving outputs are computed from its logits (not from `activation`'s
        # outputs); a regression's `scores` are its predictions (after `activation`).
        if self.num_classes == 1:
            return super().serving_call(inputs)
        return self.logits({k: inputs[k] for k in self.input}, training=False)

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, num_classes=None,
                             pad_to_batch_max=False, group_by_length=False,
                             pad_to_multiple_of="auto", **kwargs):
        from keras_bertfam.preprocessing.finetuning import TextClassifierPreprocessor

        return TextClassifierPreprocessor(tokenizer, sequence_length, num_classes=num_classes,
                                          pad_to_batch_max=pad_to_batch_max,
                                          group_by_length=group_by_length,
                                          pad_to_multiple_of=pad_to_multiple_of, **kwargs)

    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, training=True, **kwargs):
        # A dataset's labels by their spec (one-hot rows failed inside the train step:
        # "Incompatible shapes").
        shape = _shape(y) if y is not None else dataset_label_shape(x)
        if self.num_classes > 1:
            check_one_label_per_example(y, "TextClassifier", "class id")
            if len(shape) == 2 and shape[1] == self.num_classes and (
                    y is None or not _multi_hot(y)):
                raise ValueError(
                    f"TextClassifier takes one class id per example, labels of shape (N,); got "
                    f"labels of shape {shape}, one-hot or probabilities (num_classes="
                    f"{self.num_classes}). Pass np.argmax(y, axis=-1)" + (
                        "." if y is not None else
                        " (a dataset: ds.map(lambda x, y: (x, tf.argmax(y, axis=-1)))."))
            check_label_shape(shape, "TextClassifier", "class id", MULTI_LABEL)
            check_label_values(y, self.num_classes)
        else:
            check_one_label_per_example(y, "TextClassifier", "regression target")
            check_label_shape(shape, "TextClassifier", "regression target", MULTI_TARGET)
            check_finite_target_values(y)
        return super()._prepare(x, y, sample_weight, batch_size, training, **kwargs)

    def serving_outputs(self, features, outputs):
        logits = ops.cast(outputs, "float32")
        if self.num_classes == 1:
            return {"scores": logits[:, 0]}
        return class_outputs(logits)

    def metric_weights(self, y, y_pred, sample_weight):
        return label_weights(self, ops.reshape(y, (-1,)), None if sample_weight is None
                             else ops.reshape(sample_weight, (-1,)))

    def losses_and_metrics(self, y, y_pred, sample_weight):
        outputs = ops.cast(y_pred, "float32")  # the logits, or `activation`'s outputs
        w = None if sample_weight is None else ops.cast(ops.reshape(sample_weight, (-1,)), "float32")
        if self.num_classes == 1:
            err = ops.square(outputs[:, 0] - ops.cast(ops.reshape(y, (-1,)), "float32"))
            loss = _mean(err, w)
            return loss, {"mse": loss}
        labels = ops.cast(ops.reshape(y, (-1,)), "int32")
        ce = ops.sparse_categorical_crossentropy(labels, outputs,
                                                 from_logits=self.default_loss_from_logits())
        correct = ops.cast(ops.equal(ops.argmax(outputs, axis=-1), labels), "float32")
        loss = _mean(ce, w)
        return loss, {"accuracy": _mean(correct, w)}


class _Untracked:
    """Holds `value` where Keras' tracking and saving do not look (not a layer, not a list)."""

    def __init__(self, value):
        self.value = value


def output_activation(activation, who):
    """keras-hub's task `activation` -> None (logits: None or "linear") or the Keras activation
    function; a ValueError naming anything else."""
    if activation is None:
        return None
    try:
        function = keras.activations.get(activation)
    except (ValueError, TypeError):
        function = None
    if not callable(function):
        raise ValueError(
            f"{who}(activation={activation!r}): expected None (logits), the name of a Keras "
            f"activation (e.g. 'softmax') or a callable.")
    return None if function is keras.activations.linear else function


def share_num_classes(preprocessor, num_classes):
    """A preprocessor built without `num_classes` takes its task's, so its tf.data label check
    runs (the check of datasets, which the task cannot read in Python)."""
    if preprocessor is not None and getattr(preprocessor, "num_classes", 0) is None:
        preprocessor.num_classes = num_classes
    return preprocessor


def check_label_values(labels, num_classes, what="label", allow_negative=False,
                       count="num_classes"):
    """Labels given as arrays / lists (not in a dataset) -> ValueError naming the first one
    outside `0..num_classes-1`, before any step runs: the loss would otherwise fail with an
    opaque TensorFlow error, or silently give garbage on JAX / PyTorch. `allow_negative`: labels
    < 0 mean 'ignore' (token labels)."""
    if labels is None or isinstance(labels, dict) or type(labels).__name__.endswith("Dataset"):
        return
    flat = _flat_values(labels)
    if flat.size and flat.dtype.kind in "USO":
        i = next((i for i, v in enumerate(flat) if isinstance(v, (str, bytes)) or v is None),
                 None)
        if i is not None:  # NumPy's str_ / bytes_ are str / bytes: item() gives the plain value
            value = flat[i].item() if hasattr(flat[i], "item") else flat[i]
            hint = (" Map text labels to ids first, e.g. {name: i for i, name in "
                    "enumerate(sorted(set(labels)))}." if value is not None else
                    " Drop or fill missing labels first.")
            raise ValueError(
                f"Invalid {what} {value!r} (flat index {i} of the labels): "
                f"expected an integer class id from 0 to {num_classes - 1} ({count}="
                f"{num_classes}).{hint}")
    if flat.size == 0 or not np.issubdtype(flat.dtype, np.number):
        return
    if np.issubdtype(flat.dtype, np.floating):
        fraction = ~(flat == np.round(flat))
        if fraction.any():
            value = flat[int(np.argmax(fraction))]
            raise ValueError(NOT_AN_INTEGER.format(what=what, expected="an integer class id")
                             .format(value))
    bad = flat >= num_classes
    if not allow_negative:
        bad |= flat < 0
    if bad.any():
        i = int(np.argmax(bad))
        value = flat[i].item()
        note = " (negative labels are ignored)" if allow_negative else ""
        raise ValueError(
            f"Invalid {what} {value!r} (flat index {i} of the labels): the valid range is 0 to "
            f"{num_classes - 1} ({count}={num_classes}){note}."
        )


def check_finite_target_values(targets):
    """Regression targets given as arrays / lists: NaN or inf is a ValueError before any step
    (in a dataset, the preprocessor's graph check stops the pipeline with the same message)."""
    if targets is None or isinstance(targets, dict) or type(targets).__name__.endswith("Dataset"):
        return
    flat = _flat_values(targets)
    missing = [i for i, v in enumerate(flat[:100000]) if v is None] if flat.dtype == object else []
    if missing:
        raise ValueError(NOT_FINITE.format(f"None (flat index {missing[0]})"))
    text = next((i for i, v in enumerate(flat[:100000]) if isinstance(v, (str, bytes))), None) \
        if flat.dtype.kind in "USO" else None
    if text is not None:  # TensorFlow's message was "None values not supported"
        value = flat[text].item() if hasattr(flat[text], "item") else flat[text]
        raise ValueError(
            f"Invalid regression target {value!r} (flat index {text}): {TEXT_TARGET}; e.g. "
            f"np.asarray(y, dtype='float32').")
    if flat.size == 0 or not np.issubdtype(flat.dtype, np.number):
        return
    bad = ~np.isfinite(flat.astype("float64"))
    if bad.any():
        raise ValueError(NOT_FINITE.format(flat[int(np.argmax(bad))]))


def check_one_label_per_example(labels, task_name, what):
    """Labels as nested Python lists (or an object array of rows) of different lengths, e.g.
    [[0], [1, 0]]: named with the first row whose length differs (TensorFlow's message was
    "Can't convert non-rectangular Python sequence to Tensor")."""
    if not isinstance(labels, (list, tuple, np.ndarray)) or getattr(labels, "ndim", 1) == 0 or \
            _shape(labels) != () or not len(labels):
        return  # (a 0-d array: named by check_example_counts)
    lengths = [len(row) if isinstance(row, (list, tuple, np.ndarray)) else None for row in labels]
    i = next((i for i, n in enumerate(lengths) if n != lengths[0]), None)
    if i is None:
        return
    describe = ["a scalar" if n is None else f"{n} value(s)" for n in (lengths[0], lengths[i])]
    raise ValueError(
        f"{task_name} takes one {what} per example (labels of shape (N,) or (N, 1)); got labels "
        f"as rows of different lengths: row 0 has {describe[0]} ({labels[0]!r:.40}), row {i} has "
        f"{describe[1]} ({labels[i]!r:.40}).")


def _multi_hot(labels):
    """Whether label rows (an array or lists [N, K]) hold several labels: a row summing to more
    than 1 (one-hot rows and probabilities sum to 1)."""
    try:
        values = np.asarray(labels, dtype="float64")
    except (TypeError, ValueError):
        return False
    return bool((values.sum(axis=-1) > 1 + 1e-6).any())


def _shape(values):
    """The shape of labels given as an array or (nested) lists; () for anything else or ragged."""
    if not isinstance(values, (list, np.ndarray)):
        return ()
    try:
        return np.shape(values)
    except ValueError:  # ragged lists
        return ()


def dataset_label_shape(x):
    """The labels' shape (batched: its first dim None) of a dataset of model inputs and labels,
    `(features dict, labels[, sample_weight])`; () for anything else (labels given apart, raw
    text, whose preprocessor checks its labels) and for labels of a width the spec leaves
    unknown (a generator's or `padded_batch`'s: their values are checked as they come)."""
    spec = getattr(x, "element_spec", None)
    if isinstance(spec, tuple) and len(spec) > 1 and isinstance(spec[0], dict) and \
            getattr(getattr(spec[1], "shape", None), "rank", None) is not None and \
            None not in tuple(spec[1].shape)[1:]:
        return tuple(spec[1].shape)
    return ()


def _flat_values(labels):
    """Every value of an array, a tensor, a ragged tensor or nested (ragged) lists, flattened."""
    if hasattr(labels, "flat_values"):  # tf.RaggedTensor
        labels = labels.flat_values
    try:
        values = np.asarray(labels)
    except ValueError:  # ragged nested lists
        values = None
    if values is None or values.dtype == object:
        if values is not None and values.ndim == 0:  # one item that is not a number (None)
            return values.reshape(1)
        parts = [_flat_values(row) for row in labels]
        return np.concatenate(parts) if parts else np.zeros(0)
    return values.ravel()


def class_outputs(logits):
    """Serving outputs of a classification head: logits, softmax probabilities, argmax labels."""
    return {"logits": logits, "probabilities": ops.softmax(logits, axis=-1),
            "labels": ops.cast(ops.argmax(logits, axis=-1), "int32")}


def label_weights(task, labels, sample_weight):
    """`metric_weights` of a classifier, whose tracked metrics are all means over its labels
    weighted by `sample_weight`: each batch counts for their sum."""
    n = weight_sum(labels, sample_weight)
    return {name: n for name in task._trackers}


def _mean(values, weights=None):
    if weights is None:
        return ops.mean(values)
    return ops.sum(values * weights) / ops.maximum(ops.sum(weights), 1e-9)
