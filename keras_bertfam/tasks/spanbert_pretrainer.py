"""SpanBERT pretraining: MLM + the span boundary objective, single segment, no NSP
(Joshi et al. 2020)."""
import keras
from keras import ops

from keras_bertfam.layers import SpanBoundaryHead, span_boundary_weights
from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.preprocessing.preprocessors import MASKING_ARGS
from keras_bertfam.tasks.losses import mlm_targets, weight_sum, weighted_sparse_ce
from keras_bertfam.tasks.masked_lm import (
    backbone_inputs,
    mask_id_table,
    masked_lm_head,
    serving_mask_positions,
    serving_mlm_outputs,
)
from keras_bertfam.tasks.task import Task

SPAN_INPUTS = ("mask_positions", "span_starts", "span_ends")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanBertPretrainer(Task):
    """MLM + SBO: each masked token is predicted from its own state (MLM head) and from its
    span's boundary states `h[s-1]`, `h[e+1]` and its offset in the span (`SpanBoundaryHead`);
    both heads are tied to the token table. Loss = MLM + SBO, each averaged over its targets;
    spans touching the sequence edge have no SBO target.

    Inputs: the backbone's inputs + `mask_positions`, `span_starts`, `span_ends` (B, P): the
    first and last token of the span of each prediction slot, as `SpanMasker(...,
    return_span_boundaries=True)` and `SpanBertPreprocessor` produce them. Labels: `y =
    mask_ids`, `sample_weight = mask_weights` (or `y = {"mask_ids", "mask_weights"}`).
    Outputs: `{"mlm_logits", "sbo_logits": (B, P, V), "sbo_weights": (B, P)}`.

    Export: `text` with [MASK] tokens -> MLM top-k at them (as `MaskedLM`'s) and the SBO head's
    top-k (`sbo_top_ids`, `sbo_top_probabilities`, weighted by `sbo_weights`): each run of
    consecutive [MASK] tokens is one span, predicted from the tokens around it.

    Example:
    >>> backbone = kb.models.SpanBertBackbone(100, 2, 2, 32, 64)   # doctest: +SKIP
    >>> model = kb.tasks.SpanBertPretrainer(backbone)              # doctest: +SKIP
    """

    serving_reads_mask_tokens = True

    uses_pooled_output = False  # the pooler is not trained by this task
    # keras-hub's MaskedLMPreprocessor arguments too (`from_preset(..., mask_selection_rate=)`)
    preprocessor_args = Task.preprocessor_args + MASKING_ARGS + ("truncate",)

    def __init__(self, backbone, preprocessor=None, max_span_length=20,
                 position_embedding_dim=200, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.max_span_length = max_span_length
        self.position_embedding_dim = position_embedding_dim
        common = dict(activation=getattr(backbone, "activation", "gelu"),
                      layer_norm_epsilon=backbone.layer_norm_epsilon,
                      kernel_initializer=head_initializer(backbone))
        self.mlm_head = masked_lm_head(backbone)
        self.sbo_head = SpanBoundaryHead(
            backbone.token_embedding, max_span_length=max_span_length,
            position_embedding_dim=position_embedding_dim, name="sbo_head", **common)

        inputs, features = backbone_inputs(backbone, extra=SPAN_INPUTS)
        sequence = backbone(features)["sequence_output"]
        positions = inputs["mask_positions"]
        outputs = {
            "mlm_logits": self.mlm_head(sequence, positions),
            "sbo_logits": self.sbo_head(sequence, positions, inputs["span_starts"],
                                        inputs["span_ends"]),
            "sbo_weights": span_boundary_weights(inputs["span_starts"], inputs["span_ends"],
                                                 features["padding_mask"]),
        }
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._track_losses(["mlm_loss", "mlm_accuracy", "sbo_loss", "sbo_accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing.span_preprocessor import SpanBertPreprocessor

        return SpanBertPreprocessor(tokenizer, sequence_length, **kwargs)

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None: `mask_ids` in the vocabulary)."""
        return [mask_id_table(self)]

    def serving_features(self, features, special_token_ids):
        features = serving_mask_positions(features, special_token_ids["mask"])
        starts, ends = mask_runs(ops.equal(features["token_ids"], special_token_ids["mask"]))
        positions = features["mask_positions"]
        return dict(features, span_starts=ops.take_along_axis(starts, positions, axis=1),
                    span_ends=ops.take_along_axis(ends, positions, axis=1))

    def serving_outputs(self, features, outputs):
        sbo = ops.softmax(ops.cast(outputs["sbo_logits"], "float32"), axis=-1)
        top_probabilities, top_ids = ops.top_k(sbo, k=5)
        return dict(serving_mlm_outputs(features, outputs["mlm_logits"]),
                    sbo_top_ids=ops.cast(top_ids, "int32"), sbo_top_probabilities=top_probabilities,
                    sbo_weights=ops.cast(outputs["sbo_weights"], "float32")
                    * features["mask_weights"])

    def metric_weights(self, y, y_pred, sample_weight):
        mask_ids, weights = mlm_targets(y, sample_weight)
        n = weight_sum(mask_ids, weights)
        sbo = weight_sum(mask_ids, ops.cast(weights, "float32") * ops.cast(
            y_pred["sbo_weights"], "float32"))
        return {"mlm_loss": n, "mlm_accuracy": n, "sbo_loss": sbo, "sbo_accuracy": sbo}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        mask_ids, weights = mlm_targets(y, sample_weight)
        weights = ops.cast(weights, "float32")
        mlm_loss, mlm_accuracy = weighted_sparse_ce(mask_ids, y_pred["mlm_logits"], weights)
        sbo_weights = weights * ops.cast(y_pred["sbo_weights"], "float32")
        sbo_loss, sbo_accuracy = weighted_sparse_ce(mask_ids, y_pred["sbo_logits"], sbo_weights)
        return mlm_loss + sbo_loss, {
            "mlm_loss": mlm_loss, "mlm_accuracy": mlm_accuracy,
            "sbo_loss": sbo_loss, "sbo_accuracy": sbo_accuracy,
        }


def mask_runs(is_mask):
    """(B, T) bool -> the first and last index (B, T) int32 of the run of consecutive True each
    position is in (a position outside every run: itself)."""
    length = ops.shape(is_mask)[1]
    idx = ops.arange(length, dtype="int32")
    run = ops.cumsum(1 - ops.cast(is_mask, "int32"), axis=1)  # constant along a run of masks
    same = ops.logical_and(ops.equal(run[:, :, None], run[:, None, :]),
                           ops.logical_and(is_mask[:, :, None], is_mask[:, None, :]))  # (B, T, T)
    starts = ops.min(ops.where(same, idx[None, None, :], length), axis=-1)
    ends = ops.max(ops.where(same, idx[None, None, :], -1), axis=-1)
    return (ops.cast(ops.where(is_mask, starts, idx[None, :]), "int32"),
            ops.cast(ops.where(is_mask, ends, idx[None, :]), "int32"))
