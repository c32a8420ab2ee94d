"""SpanBERT (Joshi et al. 2020): BERT's architecture with the cased vocabulary (28996 pieces).

What makes SpanBERT is its pretraining (span masking + the span boundary objective, see
`kb.tasks.SpanBertPretrainer`); the encoder is BERT's.
"""
import keras

from keras_bertfam.models.backbone import EncoderBackbone


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanBertBackbone(EncoderBackbone):
    """The BERT encoder under SpanBERT's name and presets (`spanbert_{base,large}_en`).

    Example:
    >>> backbone = SpanBertBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
    ...                             hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[2, 5, 3]], "segment_ids": [[0, 0, 0]],
    ...                 "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape)
    (1, 3, 16)
    """

    family = "spanbert"

    def __init__(
        self,
        vocabulary_size=28996,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        super().__init__(
            vocabulary_size,
            num_layers,
            num_heads,
            hidden_dim,
            intermediate_dim,
            dropout=dropout,
            max_sequence_length=max_sequence_length,
            num_segments=num_segments,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
            **kwargs,
        )
