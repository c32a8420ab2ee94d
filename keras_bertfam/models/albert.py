"""ALBERT (Lan et al. 2020): factorized embeddings (E -> H) and cross-layer parameter sharing."""
import keras

from keras_bertfam.models.backbone import EncoderBackbone


@keras.saving.register_keras_serializable(package="keras_bertfam")
class AlbertBackbone(EncoderBackbone):
    """The ALBERT encoder: BERT's encoder with a factorized embedding and shared layers.

    Token, position and segment embeddings (and their LayerNorm) are `embedding_dim` (E) wide and
    projected to `hidden_dim` (H) by one Dense layer before the encoder (no projection when
    E == H, as in the paper's E=768 rows of Table 4). Layer i runs the block of group
    `int(i / num_layers * num_groups)` (google-research/albert); within a group, `share` says
    what the layers share: "all" (ALBERT's default), only the "attention" sublayers, only the
    "ffn" sublayers, or "none" (the paper's sharing ablation, Table 4). `num_inner_repetitions`
    (keras-hub's name; HF's `inner_group_num`, 1 in every released model) gives each group that
    many distinct blocks, and every layer of the group runs all of them in turn.

    The positional order is keras-hub's (`embedding_dim` before `hidden_dim`); the arguments after
    `dtype` are keyword-only.

    Defaults follow HF's `AlbertConfig`: `gelu_new` (tanh-approximate GELU, "gelu_approximate"),
    no dropout, LayerNorm epsilon 1e-12, 512 positions, 2 segments.

    Args:
        vocabulary_size, num_layers, num_heads: sizes.
        embedding_dim: E, the width of the embedding tables (128 in every released ALBERT).
        hidden_dim, intermediate_dim: sizes.
        num_groups: G, the number of distinct layer groups (1: every layer shares).
        num_inner_repetitions: distinct blocks per group, each run at every layer of the group.
        share: "all" | "attention" | "ffn" | "none".
        dropout, max_sequence_length, num_segments, activation, layer_norm_epsilon,
        initializer_range, dtype: as in BERT.

    Example:
    >>> backbone = AlbertBackbone(vocabulary_size=100, num_layers=4, num_heads=2, embedding_dim=8,
    ...                           hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[2, 5, 3]], "segment_ids": [[0, 0, 0]],
    ...                 "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape), len(backbone.encoder.blocks)
    ((1, 3, 16), 1)
    """

    family = "albert"

    @property
    def transformer_layers(self):
        """keras-hub's layout: per group, its `num_inner_repetitions` blocks."""
        r = self.num_inner_repetitions
        blocks = self.encoder.blocks
        return [blocks[k:k + r] for k in range(0, len(blocks), r)]

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        embedding_dim,
        hidden_dim,
        intermediate_dim,
        num_groups=1,
        num_inner_repetitions=1,
        dropout=0.0,
        max_sequence_length=512,
        num_segments=2,
        dtype=None,
        *,
        share="all",
        activation="gelu_approximate",
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(
            vocabulary_size,
            num_layers,
            num_heads,
            hidden_dim,
            intermediate_dim,
            embedding_dim=embedding_dim,
            dropout=dropout,
            max_sequence_length=max_sequence_length,
            num_segments=num_segments,
            num_groups=num_groups,
            share=share,
            num_inner_repetitions=num_inner_repetitions,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
            **kwargs,
        )
