"""Fine-tuning: multiple choice (SWAG, RACE): one score per (context, choice), softmax over choices."""
import keras
import numpy as np
from keras import ops

from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.tasks.classifier import (
    _mean,
    check_label_values,
    class_outputs,
    pooled,
)
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class FoldChoices(keras.layers.Layer):
    """(B, C, T) -> (B*C, T)."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_shape(self, shape):
        return (None, shape[-1])


@keras.saving.register_keras_serializable(package="keras_bertfam")
class UnfoldChoices(keras.layers.Layer):
    """scores (B*C, 1) and the (B, C, T) ids -> (B, C)."""

    def call(self, scores, token_ids):
        shape = ops.shape(token_ids)
        return ops.reshape(scores, (shape[0], shape[1]))

    def compute_output_shape(self, scores_shape, token_ids_shape):
        return (token_ids_shape[0], token_ids_shape[1])


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MultipleChoice(Task):
    """Each `[CLS] context [SEP] choice [SEP]` is encoded; `dropout -> Dense(1)` on its pooled
    output scores it; the loss is the cross-entropy of the softmax over a question's choices.

    Inputs: the backbone's inputs with a choices axis, (B, C, T). Output: (B, C) logits. Raw input:
    `x = (contexts [B], choices [B][C])`, `y` the index of the right choice.

    `cls_only=True` (the default): the backbone's last layer runs at [CLS] only, as in
    `TextClassifier` (same scores; in training, other dropout draws in that layer).
    """

    preprocessor_args = ("sequence_length",)
    default_learning_rate = 5e-5

    def __init__(self, backbone, preprocessor=None, dropout=0.1, cls_only=True, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.dropout = dropout
        self.cls_only = cls_only
        self.fold = FoldChoices(name="fold_choices")
        self.unfold = UnfoldChoices(name="unfold_choices")
        self.dropout_layer = keras.layers.Dropout(dropout, name="head_dropout")
        self.head = keras.layers.Dense(1, kernel_initializer=head_initializer(backbone),
                                       name="score")
        inputs = {name: keras.Input(shape=(None, None), dtype="int32", name=name)
                  for name in backbone.input}
        features = {name: self.fold(value) for name, value in inputs.items()}  # (B*C, T)
        scores = self.head(self.dropout_layer(pooled(backbone, features, cls_only)))  # (B*C, 1)
        logits = self.unfold(scores, inputs["token_ids"])  # (B, C)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing.finetuning import MultipleChoicePreprocessor

        return MultipleChoicePreprocessor(tokenizer, sequence_length)

    serving_inputs = ("prompt", "choices")  # choices: (B, C) strings, packed with each prompt
    follows_xlnet_layout = True

    def serving_outputs(self, features, outputs):
        return class_outputs(ops.cast(outputs, "float32"))

    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, training=True, **kwargs):
        if y is not None and isinstance(x, dict):  # model inputs (B, C, T)
            check_label_values(y, int(x["token_ids"].shape[1]), what="choice label",
                               count="number of choices")
        elif isinstance(x, (tuple, list)) and len(x) == 2 and len(x[1]):  # (contexts, choices)
            if isinstance(x[1], list):
                counts = [len(c) if isinstance(c, (list, tuple, np.ndarray)) else None
                          for c in x[1]]
                if len(set(counts)) > 1:
                    i = next(i for i, c in enumerate(counts) if c != counts[0])
                    raise ValueError(
                        f"MultipleChoice needs the same number of choices in every example: "
                        f"example 0 has {counts[0]}, example {i} has {counts[i]}.")
            if y is not None:
                check_label_values(y, len(x[1][0]), what="choice label",
                                   count="number of choices")
        return super()._prepare(x, y, sample_weight, batch_size, training, **kwargs)

    def losses_and_metrics(self, y, y_pred, sample_weight):
        logits = ops.cast(y_pred, "float32")
        labels = ops.cast(ops.reshape(y, (-1,)), "int32")
        w = None if sample_weight is None else ops.cast(ops.reshape(sample_weight, (-1,)), "float32")
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32")
        loss = _mean(ce, w)
        return loss, {"accuracy": _mean(correct, w)}
