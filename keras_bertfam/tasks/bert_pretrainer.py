"""BERT pretraining: MLM + next-sentence prediction (Devlin et al. 2019)."""
import keras
from keras import ops

from keras_bertfam.layers import PairHead
from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.preprocessing.preprocessors import MASKING_ARGS
from keras_bertfam.tasks.losses import (
    mean_sparse_ce,
    mlm_targets,
    weight_sum,
    weighted_sparse_ce,
)
from keras_bertfam.tasks.masked_lm import (
    backbone_inputs,
    mask_id_table,
    masked_lm_head,
    masked_sequence,
    serving_mask_positions,
    serving_mlm_outputs,
)
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class BertPretrainer(Task):
    """MLM + a two-way pair head on the pooled output; loss = MLM + pair CE.

    Inputs: backbone inputs + `mask_positions`. Outputs: `{"mlm_logits": (B, P, V),
    "pair_logits": (B, 2)}`. Labels: `{"mask_ids": (B, P), "mask_weights": (B, P), "pair_labels":
    (B,)}` (Keras' array adapter refuses (B, P) sample weights on a two-output model, so the weights
    travel in y; a `sample_weight=mask_weights` tensor from a `tf.data.Dataset` works too). For BERT the pair task is NSP (label 1 = random next); ALBERT's
    SOP reuses this class through `AlbertPretrainer` (label 1 = swapped).

    `masked_rows_only=True` (the default): the backbone's last layer runs at [CLS] and the
    `mask_positions` only, as `MaskedLM`'s (the same logits and gradients; in training, other
    dropout draws in that layer than `masked_rows_only=False`).
    """

    serving_reads_mask_tokens = True

    pair_task = "nsp"
    preprocessor_args = ("sequence_length", "batch_size", "masker", "pairer", "seed",
                         "group_by_length", "pad_to_multiple_of") + MASKING_ARGS

    def __init__(self, backbone, preprocessor=None, masked_rows_only=True, **kwargs):
        if "pooled_output" not in backbone.output:
            raise ValueError(f"{type(backbone).__name__} has no pooler; the pair head needs one.")
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.masked_rows_only = masked_rows_only
        initializer = head_initializer(backbone)
        self.mlm_head = masked_lm_head(backbone)
        self.pair_head = PairHead(kernel_initializer=initializer, name=f"{self.pair_task}_head")
        inputs, features = backbone_inputs(backbone, extra=("mask_positions",))
        outputs = masked_sequence(backbone, features, inputs["mask_positions"], masked_rows_only)
        logits = {
            "mlm_logits": self.mlm_head(outputs["sequence_output"]),
            "pair_logits": self.pair_head(outputs["pooled_output"]),
        }
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        p = self.pair_task
        self._track_losses(["mlm_loss", "mlm_accuracy", f"{p}_loss", f"{p}_accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing import SentencePairPreprocessor

        return SentencePairPreprocessor(tokenizer, sequence_length, **kwargs)

    serving_inputs = ("text_a", "text_b")

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None): `mask_ids` in the vocabulary,
        `pair_labels` 0 or 1."""
        return [mask_id_table(self), ("pair_labels", 2, f"expected labels in [0, 2) (the "
                                                        f"{self.pair_task} head's two classes).")]

    def serving_features(self, features, special_token_ids):
        return serving_mask_positions(features, special_token_ids["mask"])

    def serving_outputs(self, features, outputs):
        """MLM top-k at the input's [MASK] tokens and the pair head's probabilities."""
        pair_logits = ops.cast(outputs["pair_logits"], "float32")
        return dict(serving_mlm_outputs(features, outputs["mlm_logits"]),
                    **{f"{self.pair_task}_probabilities": ops.softmax(pair_logits, axis=-1)})

    def metric_weights(self, y, y_pred, sample_weight):
        n = weight_sum(*mlm_targets(y, sample_weight))
        return {"mlm_loss": n, "mlm_accuracy": n}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        mask_ids, weights = mlm_targets(y, sample_weight)
        mlm_loss, mlm_accuracy = weighted_sparse_ce(mask_ids, y_pred["mlm_logits"], weights)
        pair_loss, pair_accuracy = mean_sparse_ce(y["pair_labels"], y_pred["pair_logits"])
        p = self.pair_task
        return mlm_loss + pair_loss, {
            "mlm_loss": mlm_loss, "mlm_accuracy": mlm_accuracy,
            f"{p}_loss": pair_loss, f"{p}_accuracy": pair_accuracy,
        }
