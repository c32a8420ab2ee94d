"""Token + position + segment embeddings, shared by every encoder family.

BERT, RoBERTa, DistilBERT and SpanBERT use it at `embedding_dim == hidden_dim`; ALBERT and ELECTRA
set a smaller `embedding_dim` and get a Dense projection E -> H after the LayerNorm (Lan et al. 2020,
Clark et al. 2020). RoBERTa counts positions from `position_offset` (fairseq's padding_idx + 1).
"""
import keras
from keras import ops

from keras_bertfam.layers.normalization import LayerNormalization
from keras_bertfam.layers.utils import clone_initializer, serialize_initializer, sublayer_kwargs


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TextEmbedding(keras.layers.Layer):
    """Sum of token, position and (optional) segment embeddings, LayerNorm, dropout, projection.

    Args:
        vocabulary_size: rows of the token table.
        max_sequence_length: positions the model can see (rows of the position table minus
            `position_offset`).
        embedding_dim: width E of the three tables.
        hidden_dim: output width H; a Dense E -> H projection is added when it differs from E.
        num_segments: rows of the segment table; 0 drops segment embeddings (DistilBERT).
        position_offset: index of the first position row (2 for RoBERTa, else 0).
        layer_norm_epsilon, dropout, kernel_initializer: as in BERT.

    Example:
    >>> layer = TextEmbedding(100, 16, embedding_dim=8, hidden_dim=8)
    >>> tuple(layer(ops.zeros((2, 5), "int32"), ops.zeros((2, 5), "int32")).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        vocabulary_size,
        max_sequence_length,
        embedding_dim,
        hidden_dim=None,
        num_segments=2,
        position_offset=0,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_sequence_length = max_sequence_length
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim or embedding_dim
        self.num_segments = num_segments
        self.position_offset = position_offset
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        # === Layers ===
        init = lambda: clone_initializer(self.kernel_initializer)
        common = sublayer_kwargs(self)
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size, embedding_dim, embeddings_initializer=init(), name="token_embedding",
            **common,
        )
        self.position_embedding = keras.layers.Embedding(
            max_sequence_length + position_offset,
            embedding_dim,
            embeddings_initializer=init(),
            name="position_embedding",
            **common,
        )
        self.segment_embedding = (
            keras.layers.Embedding(
                num_segments, embedding_dim, embeddings_initializer=init(), name="segment_embedding",
                **common,
            )
            if num_segments
            else None
        )
        self.layer_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm", **common
        )
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", **common)
        self.projection = (
            keras.layers.Dense(self.hidden_dim, kernel_initializer=init(), name="projection",
                               **common)
            if self.hidden_dim != embedding_dim
            else None
        )

    def build(self, token_ids_shape, segment_ids_shape=None):
        self.token_embedding.build(token_ids_shape)
        self.position_embedding.build((None,))
        if self.segment_embedding is not None:
            self.segment_embedding.build(token_ids_shape)
        self.layer_norm.build(tuple(token_ids_shape) + (self.embedding_dim,))
        if self.projection is not None:
            self.projection.build(tuple(token_ids_shape) + (self.embedding_dim,))
        self.built = True

    # === Call ===
    def call(self, token_ids, segment_ids=None, training=False):
        seq_len = ops.shape(token_ids)[1]
        x = self.token_embedding(token_ids)  # (B, T, E)
        # Positions are the contiguous rows offset..offset+T-1: a slice, whose gradient is a pad,
        # rather than a gather, whose gradient is a scatter-add (slow on CPU/XLA).
        positions = ops.slice(
            ops.convert_to_tensor(self.position_embedding.embeddings), (self.position_offset, 0),
            (seq_len, self.embedding_dim),
        )  # (T, E)
        x = x + ops.expand_dims(ops.cast(positions, x.dtype), 0)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = ops.zeros_like(token_ids)
            x = x + self.segment_embedding(segment_ids)
        x = self.dropout_layer(self.layer_norm(x), training=training)
        if self.projection is not None:
            x = self.projection(x)  # (B, T, H)
        return x

    def compute_output_shape(self, token_ids_shape, segment_ids_shape=None):
        return tuple(token_ids_shape) + (self.hidden_dim,)

    # === Config ===
    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            max_sequence_length=self.max_sequence_length,
            embedding_dim=self.embedding_dim,
            hidden_dim=self.hidden_dim,
            num_segments=self.num_segments,
            position_offset=self.position_offset,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        return config
