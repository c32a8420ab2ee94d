"""DistilBERT (Sanh et al. 2019): BERT's encoder without token types and without a pooler."""
import keras

from keras_bertfam.models.backbone import EncoderBackbone


@keras.saving.register_keras_serializable(package="keras_bertfam")
class DistilBertBackbone(EncoderBackbone):
    """DistilBERT's encoder (HF `DistilBertModel`): token + position embeddings (no segment table,
    so the inputs are `token_ids` and `padding_mask` only), post-LN blocks, no pooler.

    Example:
    >>> backbone = DistilBertBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
    ...                               hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[2, 5, 3]], "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape), sorted(backbone.input)
    ((1, 3, 16), ['padding_mask', 'token_ids'])
    """

    family = "distil_bert"
    # HF DistilBertForSequenceClassification: pre_classifier -> ReLU -> dropout -> classifier.
    classifier_hidden_activation = "relu"
    classifier_dropout_first = False
    takes_segment_ids = False  # no segment table (`num_segments=0`)

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
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
            num_segments=0,
            pooler=False,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
            **kwargs,
        )
