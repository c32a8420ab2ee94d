"""Fine-tuning: multiple choice (SWAG, RACE): one score per (context, choice), softmax over choices."""
import keras
import numpy as np
from keras import ops

from keras_bertfam.preprocessing.finetuning import ONE_CHOICE_LABEL, check_label_shape
from keras_bertfam.tasks.classifier import (
    _mean,
    _shape,
    build_classification_head,
    check_label_values,
    check_one_label_per_example,
    class_outputs,
    classification_logits,
    dataset_label_shape,
    label_weights,
    pooled,
)
from keras_bertfam.tasks.masked_lm import backbone_inputs
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
    """Multiple choice (SWAG, RACE; Zellers et al. 2018): each `[CLS] context [SEP] choice [SEP]`
    is encoded and scored by one unit on its pooled output; the loss is the cross-entropy of the
    softmax over a question's choices.

    The scoring head is that of the family's HF `*ForMultipleChoice`, so those checkpoints
    convert both ways (`from_preset` / `kb.presets.convert_task` of an HF directory,
    `kb.presets.export_to_transformers`): `dropout -> Dense(1)` on the pooled output for BERT,
    SpanBERT, ALBERT, RoBERTa and Longformer (their pooler is the backbone's); with a
    `hidden_activation`, `Dense(hidden_dim, hidden_activation) -> dropout -> Dense(1)` on the
    first-token state, HF's head for DistilBERT (`pre_classifier`, ReLU), ELECTRA
    (`sequence_summary`, GELU) and XLNet (`sequence_summary`, tanh, at `<cls>`, the last
    position: XLNet's rows are packed `context <sep> choice <sep> <cls>`, padded on the left).
    `hidden_activation="auto"` (the default) takes the backbone's
    `classifier_hidden_activation`, as in `TextClassifier`: that head for those three families,
    none (a single Dense) for the others. A Longformer puts global attention where HF's
    `LongformerForMultipleChoice` does by default: on the choice, every token after the
    context's `</s></s>` (its closing `</s>` too), derived in the graph from the token ids.

    Inputs: the backbone's inputs with a choices axis, (B, C, T). Output: (B, C) logits. Raw input:
    `x = (contexts [B], choices [B][C])`, `y` the index of the right choice.

    `cls_only=True` (the default): the backbone's last layer runs at [CLS] only, as in
    `TextClassifier` (same scores; in training, other dropout draws in that layer).

    Example:
    >>> mc = kb.tasks.MultipleChoice.from_preset("bert_tiny_en_uncased")  # doctest: +SKIP
    >>> x = (["She opened the door."], [["She walked in.", "The door ate her."]])  # doctest: +SKIP
    >>> mc.fit(x, [0])  # doctest: +SKIP
    """

    preprocessor_args = ("sequence_length",)
    default_learning_rate = 5e-5
    global_attention_task = "MultipleChoice"
    labels_are_one_array = True

    def __init__(self, backbone, preprocessor=None, dropout=0.1, hidden_activation="auto",
                 cls_only=True, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.dropout = dropout
        self.cls_only = cls_only
        self.fold = FoldChoices(name="fold_choices")
        self.unfold = UnfoldChoices(name="unfold_choices")
        # HF's heads with a hidden layer have no dropout before it
        build_classification_head(self, 1, hidden_activation, name="score", dropout_first=False)
        inputs, features = backbone_inputs(backbone, task=self.global_attention_task,
                                           fold=self.fold)
        scores = classification_logits(self, pooled(backbone, features, cls_only))  # (B*C, 1)
        logits = self.unfold(scores, inputs["token_ids"])  # (B, C)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["accuracy"])

    @classmethod
    def from_config(cls, config):
        # Saved before `hidden_activation` existed: those models have no hidden layer.
        return super().from_config({"hidden_activation": None, **config})

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing.finetuning import MultipleChoicePreprocessor

        return MultipleChoicePreprocessor(tokenizer, sequence_length)

    serving_inputs = ("prompt", "choices")  # choices: (B, C) strings, packed with each prompt
    follows_xlnet_layout = True

    def serving_outputs(self, features, outputs):
        return class_outputs(ops.cast(outputs, "float32"))

    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, training=True, **kwargs):
        # A dataset's labels by their spec: one-hot rows (keras.io's multiple-choice example
        # feeds `to_categorical` labels) failed inside the train step ("Incompatible shapes").
        check_label_shape(_shape(y) if y is not None else dataset_label_shape(x),
                          "MultipleChoice", "choice label", ONE_CHOICE_LABEL)
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
                check_one_label_per_example(y, "MultipleChoice", "choice label")
        return super()._prepare(x, y, sample_weight, batch_size, training, **kwargs)

    def metric_weights(self, y, y_pred, sample_weight):
        return label_weights(self, ops.reshape(y, (-1,)), None if sample_weight is None
                             else ops.reshape(sample_weight, (-1,)))

    def losses_and_metrics(self, y, y_pred, sample_weight):
        logits = ops.cast(y_pred, "float32")
        labels = ops.cast(ops.reshape(y, (-1,)), "int32")
        w = None if sample_weight is None else ops.cast(ops.reshape(sample_weight, (-1,)), "float32")
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32")
        loss = _mean(ce, w)
        return loss, {"accuracy": _mean(correct, w)}
