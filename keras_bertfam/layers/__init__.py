"""Backend-agnostic building blocks (keras.ops only)."""
from keras_bertfam.layers.attention import MultiHeadSelfAttention
from keras_bertfam.layers.embeddings import TextEmbedding
from keras_bertfam.layers.encoder import (
    AttentionSublayer,
    FeedForwardSublayer,
    TransformerBlock,
    TransformerEncoder,
    TransformerStack,
    sharing_plan,
)
from keras_bertfam.layers.heads import MaskedLMHead, PairHead, gather_positions
from keras_bertfam.layers.longformer_attention import LongformerSelfAttention
from keras_bertfam.layers.heads import ReplacedTokenHead, SpanBoundaryHead, span_boundary_weights
from keras_bertfam.layers.relative_attention import (
    MaskEmbedding,
    RelativeAttentionInputs,
    RelativeMultiHeadAttention,
    TwoStreamRelativeAttention,
    XLNetFeedForward,
)
