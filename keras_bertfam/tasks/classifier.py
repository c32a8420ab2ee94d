"""Fine-tuning: sequence classification and regression on the [CLS] / pooled output."""
import keras
from keras import ops

from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


def pooled(backbone, outputs):
    """The pooled (tanh) [CLS] state where the family has a pooler, else the [CLS] state."""
    if "pooled_output" in outputs:
        return outputs["pooled_output"]
    return outputs["sequence_output"][:, 0, :]


def head_initializer(backbone):
    return keras.initializers.TruncatedNormal(stddev=getattr(backbone, "initializer_range", 0.02))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TextClassifier(Task):
    """Single-sentence or sentence-pair classification (GLUE), regression when `num_classes=1`.

    `dropout -> Dense(num_classes)` on the pooled output (the [CLS] state for families without a
    pooler), as in BERT's `run_classifier`. Loss: mean cross-entropy (MSE for regression).

    Raw strings work in `fit` / `evaluate` / `predict` with the attached preprocessor
    (`TextClassifierPreprocessor`): `x` is a list of strings or a tuple of two lists (pairs).

    Example:
    >>> clf = kb.tasks.TextClassifier.from_preset("bert_tiny_en_uncased", num_classes=2)  # doctest: +SKIP
    >>> clf.fit(["great film", "dull"], [1, 0], epochs=1)  # doctest: +SKIP
    """

    preprocessor_args = ("sequence_length", "pad_to_batch_max")
    preprocessor_shared_args = ("num_classes",)
    default_learning_rate = 5e-5

    def __init__(self, backbone, num_classes=2, preprocessor=None, dropout=0.1, **kwargs):
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
        self.backbone = backbone
        self.num_classes = num_classes
        self.preprocessor = preprocessor
        self.dropout = dropout
        self.dropout_layer = keras.layers.Dropout(dropout, name="head_dropout")
        self.head = keras.layers.Dense(num_classes, kernel_initializer=head_initializer(backbone),
                                       name="logits")
        inputs, features = backbone_inputs(backbone)
        x = pooled(backbone, backbone(features))
        logits = self.head(self.dropout_layer(x))
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["mse" if num_classes == 1 else "accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, num_classes=None,
                             pad_to_batch_max=False, **kwargs):
        from keras_bertfam.preprocessing.finetuning import TextClassifierPreprocessor

        return TextClassifierPreprocessor(tokenizer, sequence_length, num_classes=num_classes,
                                          pad_to_batch_max=pad_to_batch_max)

    def serving_outputs(self, features, outputs):
        logits = ops.cast(outputs, "float32")
        if self.num_classes == 1:
            return {"scores": logits[:, 0]}
        return class_outputs(logits)

    def losses_and_metrics(self, y, y_pred, sample_weight):
        logits = ops.cast(y_pred, "float32")
        w = None if sample_weight is None else ops.cast(ops.reshape(sample_weight, (-1,)), "float32")
        if self.num_classes == 1:
            err = ops.square(logits[:, 0] - ops.cast(ops.reshape(y, (-1,)), "float32"))
            loss = _mean(err, w)
            return loss, {"mse": loss}
        labels = ops.cast(ops.reshape(y, (-1,)), "int32")
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32")
        loss = _mean(ce, w)
        return loss, {"accuracy": _mean(correct, w)}


def class_outputs(logits):
    """Serving outputs of a classification head: logits, softmax probabilities, argmax labels."""
    return {"logits": logits, "probabilities": ops.softmax(logits, axis=-1),
            "labels": ops.cast(ops.argmax(logits, axis=-1), "int32")}


def _mean(values, weights=None):
    if weights is None:
        return ops.mean(values)
    return ops.sum(values * weights) / ops.maximum(ops.sum(weights), 1e-9)
