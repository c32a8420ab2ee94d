"""Masked language modelling (BERT's MLM alone; RoBERTa's whole objective)."""
import keras

from keras_bertfam.layers import MaskedLMHead
from keras_bertfam.tasks.losses import weighted_sparse_ce
from keras_bertfam.tasks.task import Task


def backbone_inputs(backbone, extra=()):
    """Fresh Inputs for the backbone's inputs plus `extra` int (B, P) inputs."""
    inputs = {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in list(backbone.input) + list(extra)
    }
    return inputs, {name: inputs[name] for name in backbone.input}


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskedLM(Task):
    """A backbone + MLM head tied to its token embedding.

    Inputs: the backbone's inputs plus `mask_positions` (B, P). Output: logits (B, P, V).
    Labels: `mask_ids` (B, P) with `sample_weight=mask_weights` (keras-hub's format). Loss:
    `Σ w·CE / (Σ w + 1e-5)`.

    Example:
    >>> backbone = kb.models.BertBackbone(100, 2, 2, 16, 32)  # doctest: +SKIP
    >>> mlm = kb.tasks.MaskedLM(backbone)                     # doctest: +SKIP
    """

    def __init__(self, backbone, preprocessor=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.mlm_head = MaskedLMHead(
            backbone.token_embedding,
            activation=getattr(backbone, "activation", "gelu"),
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            kernel_initializer=keras.initializers.TruncatedNormal(
                stddev=getattr(backbone, "initializer_range", 0.02)),
            name="mlm_head",
        )
        inputs, features = backbone_inputs(backbone, extra=("mask_positions",))
        sequence = backbone(features)["sequence_output"]
        logits = self.mlm_head(sequence, inputs["mask_positions"])
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["mlm_loss", "mlm_accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing import MaskedLMPreprocessor

        return MaskedLMPreprocessor(tokenizer, sequence_length, **kwargs)

    def losses_and_metrics(self, y, y_pred, sample_weight):
        loss, accuracy = weighted_sparse_ce(y, y_pred, sample_weight)
        return loss, {"mlm_loss": loss, "mlm_accuracy": accuracy}
