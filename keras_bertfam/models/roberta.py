"""RoBERTa (Liu et al. 2019): BERT's encoder with fairseq's position offset and one token type."""
import keras

from keras_bertfam.models.backbone import EncoderBackbone

# fairseq counts positions from padding_idx + 1, with `<pad>` = 1: the first token uses row 2 of
# the position table, which has max_sequence_length + 2 rows (514 for 512 positions).
ROBERTA_PADDING_ID = 1
ROBERTA_POSITION_OFFSET = ROBERTA_PADDING_ID + 1


@keras.saving.register_keras_serializable(package="keras_bertfam")
class RobertaBackbone(EncoderBackbone):
    """The RoBERTa encoder with keras-hub's constructor arguments.

    Same architecture as BERT (post-LN, exact GELU, tanh pooler over `<s>` as HF's
    `RobertaModel`), with RoBERTa's differences: positions start at row `padding_idx + 1 = 2` of a
    `max_sequence_length + 2`-row table, the token-type table has a single row (RoBERTa has no
    segments: as keras-hub's, the inputs are `token_ids` and `padding_mask`; a `segment_ids` given
is ignored), LayerNorm epsilon 1e-5.

    Inputs must be right-padded (HF derives positions from the non-pad tokens; for right padding
    the two agree on every real token).

    Example:
    >>> backbone = RobertaBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                            intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[0, 5, 2]], "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 3, 16), (1, 16))
    """

    family = "roberta"
    takes_segment_ids = False

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
        layer_norm_epsilon=1e-5,
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
            num_segments=1,
            position_offset=ROBERTA_POSITION_OFFSET,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
            **kwargs,
        )
