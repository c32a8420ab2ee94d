"""Masked language modelling (BERT's MLM alone; RoBERTa's whole objective)."""
import keras
from keras import ops

from keras_bertfam.layers import MaskedLMHead, gather_positions
from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.preprocessing.preprocessors import MASKING_ARGS
from keras_bertfam.tasks.losses import mlm_targets, weight_sum, weighted_sparse_ce
from keras_bertfam.tasks.task import Task, _id_range


def backbone_inputs(backbone, extra=(), task=None, fold=None):
    """Fresh Inputs for the backbone's inputs plus `extra` int (B, P) inputs.

    A backbone with a `task_global_attention(features, task)` (Longformer) gets its
    `global_attention_mask` from it, computed in the graph from the other inputs for `task` (the
    task class's name), rather than as an input of the task. `fold`: a layer each input goes
    through before the backbone, the Inputs being (B, C, T) (MultipleChoice's choices axis)."""
    derive = getattr(backbone, "task_global_attention", None)
    names = [n for n in backbone.input if not (derive and n == "global_attention_mask")]
    shape = (None,) if fold is None else (None, None)
    inputs = {
        name: keras.Input(shape=shape, dtype="int32", name=name)
        for name in names + list(extra)
    }
    features = {name: inputs[name] if fold is None else fold(inputs[name]) for name in names}
    if derive:
        features["global_attention_mask"] = derive(features, task)
    return inputs, features


def masked_lm_head(backbone, token_embedding=None, name="mlm_head", activation="auto",
                   layer_norm_epsilon="auto"):
    """The MLM head every task builds on `backbone` (MaskedLM, the BERT / ALBERT / SpanBERT
    pretrainers, ELECTRA's generator): tied to `token_embedding` (default the backbone's), the
    backbone's activation and LayerNorm epsilon (unless given: "auto" takes the backbone's),
    initializer and dtype policy; returns logits."""
    return MaskedLMHead(
        token_embedding=token_embedding or backbone.token_embedding,
        intermediate_activation=(getattr(backbone, "activation", "gelu") if activation == "auto"
                                 else activation),
        layer_norm_epsilon=(backbone.layer_norm_epsilon if layer_norm_epsilon == "auto"
                            else layer_norm_epsilon),
        kernel_initializer=head_initializer(backbone),
        dtype=backbone.dtype_policy,
        name=name,
    )


def mask_id_table(task):
    """The table a pretraining task's `mask_ids` labels index, as its `label_id_tables` gives it
    (task.py `_label_tables`): the backbone's vocabulary."""
    size = task.backbone.vocabulary_size
    return ("mask_ids", size, _id_range(task, size, "vocabulary_size"))


def masked_sequence(backbone, features, positions, masked_rows_only=True):
    """The backbone's outputs with `sequence_output` at `positions` (B, P, H) only, what an MLM
    head reads. With `masked_rows_only` and a family that `supports_cls_only`, the backbone runs
    as `backbone(features, positions=positions)`: its last layer computes those rows alone (and
    [CLS]'s for the pooled output), the same states; otherwise (Longformer, XLNet, or
    `masked_rows_only=False`) it runs in full and the rows are gathered after it."""
    if masked_rows_only and backbone.supports_cls_only:
        return backbone(features, positions=positions)
    outputs = backbone(features)
    return dict(outputs, sequence_output=gather_positions(outputs["sequence_output"], positions))


def serving_mask_positions(features, mask_token_id):
    """For export: every position of the input, [MASK] tokens first (in order); weight 1 where the
    input holds [MASK]. -> model inputs with `mask_positions`, and `mask_weights` (B, T)."""
    token_ids = features["token_ids"]
    idx = ops.expand_dims(ops.arange(ops.shape(token_ids)[1], dtype="int32"), 0)  # (1, T)
    is_mask = ops.equal(token_ids, mask_token_id)  # (B, T)
    positions = ops.cast(ops.argsort(ops.where(is_mask, idx, idx + ops.shape(token_ids)[1]),
                                     axis=-1), "int32")  # (B, T): masks first
    weights = ops.take_along_axis(ops.cast(is_mask, "float32"), positions, axis=1)
    return dict(features, mask_positions=positions, mask_weights=weights)


def serving_mlm_outputs(features, logits, top_k=5):
    """Top-k predictions (ids, probabilities) at the [MASK] positions of the input (B, T, k)."""
    probabilities = ops.softmax(ops.cast(logits, "float32"), axis=-1)
    top_probabilities, top_ids = ops.top_k(probabilities, k=top_k)
    return {"mask_positions": features["mask_positions"], "mask_weights": features["mask_weights"],
            "mlm_top_ids": ops.cast(top_ids, "int32"), "mlm_top_probabilities": top_probabilities}


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskedLM(Task):
    """A backbone + MLM head tied to its token embedding.

    Inputs: the backbone's inputs plus `mask_positions` (B, P). Output: logits (B, P, V).
    Labels: `mask_ids` (B, P) with `sample_weight=mask_weights` (keras-hub's format). Loss:
    `Σ w·CE / (Σ w + 1e-5)`.

    `masked_rows_only=True` (the default) runs the backbone's last transformer layer at the
    `mask_positions` only (and at [CLS], for the pooled output), where the family allows it
    (`backbone.supports_cls_only`; Longformer and XLNet run in full): its queries, attention
    output, LayerNorms and feed-forward for those rows, keys and values from every position,
    as `TextClassifier(cls_only=True)` does for [CLS]. The logits and gradients are those of
    the full path (to float rounding), padded slots and repeated positions included. In
    training, dropout in that layer draws masks of the smaller shape, so the random draws (not
    their distribution) differ from those of `masked_rows_only=False`, which runs the whole
    last layer. The weights and their saved paths are the same either way.

    `head_activation` and `head_layer_norm_epsilon`: the head's transform activation and
    LayerNorm epsilon; "auto" (the default) takes the backbone's `activation` and
    `layer_norm_epsilon`. keras-hub's `*MaskedLM` heads use their own (exact GELU, ALBERT's
    tanh-approximate one, and epsilon 1e-5 for every family): a keras-hub task directory
    loads with those.

    Example:
    >>> backbone = kb.models.BertBackbone(100, 2, 2, 16, 32)  # doctest: +SKIP
    >>> mlm = kb.tasks.MaskedLM(backbone)                     # doctest: +SKIP
    """

    serving_reads_mask_tokens = True

    uses_pooled_output = False  # the pooler is not trained by this task
    # keras-hub's MaskedLMPreprocessor arguments too (`from_preset(..., mask_selection_rate=)`)
    preprocessor_args = Task.preprocessor_args + MASKING_ARGS + ("truncate",)

    def __init__(self, backbone, preprocessor=None, masked_rows_only=True, head_activation="auto",
                 head_layer_norm_epsilon="auto", **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.masked_rows_only = masked_rows_only
        self.head_activation = head_activation
        self.head_layer_norm_epsilon = head_layer_norm_epsilon
        self.mlm_head = masked_lm_head(backbone, activation=head_activation,
                                       layer_norm_epsilon=head_layer_norm_epsilon)
        inputs, features = backbone_inputs(backbone, extra=("mask_positions",))
        sequence = masked_sequence(backbone, features, inputs["mask_positions"],
                                   masked_rows_only)["sequence_output"]  # (B, P, H)
        logits = self.mlm_head(sequence)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["mlm_loss", "mlm_accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing import MaskedLMPreprocessor

        return MaskedLMPreprocessor(tokenizer, sequence_length, **kwargs)

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None: `y`, the target ids at the mask
        positions, in the vocabulary)."""
        return [mask_id_table(self)]

    def serving_features(self, features, special_token_ids):
        return serving_mask_positions(features, special_token_ids["mask"])

    def serving_outputs(self, features, outputs):
        return serving_mlm_outputs(features, outputs)

    def metric_weights(self, y, y_pred, sample_weight):
        n = weight_sum(*mlm_targets(y, sample_weight))
        return {"mlm_loss": n, "mlm_accuracy": n}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        loss, accuracy = weighted_sparse_ce(y, y_pred, sample_weight)
        return loss, {"mlm_loss": loss, "mlm_accuracy": accuracy}
