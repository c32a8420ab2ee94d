"""BERT (Devlin et al. 2019): post-LN encoder, exact GELU, two segments, tanh pooler."""
import keras

from keras_bertfam.models.backbone import EncoderBackbone


@keras.saving.register_keras_serializable(package="keras_bertfam")
class BertBackbone(EncoderBackbone):
    """The BERT encoder with keras-hub's constructor arguments.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                         intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[2, 5, 3]], "segment_ids": [[0, 0, 0]],
    ...                 "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 3, 16), (1, 16))
    """

    family = "bert"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        activation="gelu",
        dtype=None,
        **kwargs,
    ):
        # activation: BERT's exact "gelu"; keras-hub's BERT presets use "gelu_approximate".
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
            activation=activation,
            dtype=dtype,
            **kwargs,
        )
