"""XLNet (Yang et al. 2019): permutation language modelling on a Transformer-XL encoder.

What differs from the BERT-like families, and why this is not an `EncoderBackbone`:
- no absolute positions: attention gets sinusoidal *relative* positions (Transformer-XL), and
  segments enter as a relative same/different bias inside attention, so the embedding is the token
  table alone (no position / segment tables and no embedding LayerNorm, which `TextEmbedding`
  always has);
- two streams through the same weights for pretraining (content h, query g);
- an optional memory of the previous segment (segment recurrence).
The feed-forward sublayer is the shared `FeedForwardSublayer` (plus XLNet's inner dropout).
"""
import keras
from keras import ops

from keras_bertfam.layers.relative_attention import (
    MaskEmbedding,
    RelativeAttentionInputs,
    RelativeBiases,
    RelativeMultiHeadAttention,
    TwoStreamRelativeAttention,
    XLNetFeedForward,
)
from keras_bertfam.layers.utils import clone_initializer
from keras_bertfam.models.backbone import Backbone, _check_positive, _unique

XLNET_INPUTS = ("token_ids", "segment_ids", "padding_mask")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class XLNetBackbone(Backbone):
    """The XLNet encoder: token embedding -> L x (two-stream relative attention + FFN).

    As a functional model (fine-tuning) it runs the content stream only:
    `{"token_ids", "segment_ids", "padding_mask"}` (B, T) -> `{"sequence_output": (B, T, H)}`.
    Padding may be on either side (XLNet's own convention is left padding); segment ids are
    compared only for equality (XLNet uses 0 / 1 for the segments, 2 for `<cls>`).

    `forward(inputs, mems=...)` is the full entry point: `inputs` may add `perm_mask` (B, T, T),
    1 = cannot attend, and `target_mapping` (B, P, T) one-hot rows of the predicted positions; the
    query stream then starts from the learned mask embedding and its output is `query_output`
    (B, P, H) (HF `XLNetModel` returns this as `last_hidden_state` when given `target_mapping`).
    With `return_mems=True` it also returns `mems`: per layer the (B, M, H) states to feed the next
    segment (layer inputs, stop-gradient, the last `mem_len`, the first `reuse_len` of each
    segment when set); pass them back as `mems=` and every position attends to them.

    Args:
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim: sizes (Base: 32000,
            12, 12, 768, 3072).
        dropout: on embeddings, positions, attention probabilities, sublayer outputs (one rate, as
            XLNet's `dropout` and `dropatt` defaults are both 0.1).
        activation: FFN activation; "gelu" is HF's default (exact erf), the original TF code uses
            the tanh approximation ("gelu_approximate", HF "gelu_new").
        bi_data: the second half of each batch holds reversed sequences and counts relative
            positions backwards (the original pretraining's bidirectional data).
        clamp_len: clip relative distances to [-clamp_len, clamp_len] (-1: no clipping).
        mem_len: how many states of the previous segments `mems` keeps (None / 0: all).
        reuse_len: how many leading tokens of a segment go to the memory (None: all).
        untie_r: one set of `r_w / r_r / r_s` biases per layer (True, HF's default) or one set
            shared by all layers.
        layer_norm_epsilon, initializer_range: 1e-12, normal(0.02) as XLNet.

    Example:
    >>> backbone = XLNetBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                          intermediate_dim=32)
    >>> out = backbone({"token_ids": [[5, 6, 4, 3]], "segment_ids": [[0, 0, 0, 2]],
    ...                 "padding_mask": [[1, 1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape)
    (1, 4, 16)
    """

    family = "xlnet"
    # Fine-tuning reads XLNet's summary at the LAST position: `A <sep> (B <sep>) <cls>`, left
    # padded (HF `XLNetForSequenceClassification`'s `summary_type="last"`), through a tanh
    # projection (its `sequence_summary.summary`: TextClassifier's hidden layer).
    cls_token_index = -1
    _lora_note = (" XLNet's relative attention keeps its q / k / v / o projections as weights "
                  "of one layer (HF's layout), not as EinsumDense layers: its attention takes "
                  "no LoRA (its feed-forward Dense layers do).")
    classifier_hidden_activation = "tanh"
    classifier_dropout_first = False

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        activation="gelu",
        bi_data=False,
        clamp_len=-1,
        mem_len=None,
        reuse_len=None,
        untie_r=True,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        _check_positive(vocabulary_size=vocabulary_size, num_layers=num_layers,
                        num_heads=num_heads, hidden_dim=hidden_dim,
                        intermediate_dim=intermediate_dim)
        if hidden_dim % 2:
            raise ValueError(f"hidden_dim must be even (sin/cos halves), got {hidden_dim}.")
        initializer = keras.initializers.RandomNormal(stddev=initializer_range)
        head_dim = hidden_dim // num_heads

        # === Layers ===
        self.word_embedding = keras.layers.Embedding(
            vocabulary_size, hidden_dim, embeddings_initializer=clone_initializer(initializer),
            dtype=dtype, name="word_embedding")
        self.mask_embedding = MaskEmbedding(hidden_dim, initializer, dtype=dtype,
                                            name="mask_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="dropout")
        self.attention_inputs = RelativeAttentionInputs(
            hidden_dim, bi_data=bi_data, clamp_len=clamp_len, dropout=dropout, dtype=dtype,
            name="attention_inputs")
        self.shared_biases = None if untie_r else RelativeBiases(
            num_heads, head_dim, initializer, dtype=dtype, name="relative_biases")
        self.attention_layers, self.feedforward_layers = [], []
        for i in range(num_layers):
            attention = RelativeMultiHeadAttention(
                num_heads, hidden_dim, dropout=dropout, layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=initializer, biases=self.shared_biases, dtype=dtype,
                name=f"rel_attn_{i}")
            self.attention_layers.append(
                TwoStreamRelativeAttention(attention, dtype=dtype, name=f"two_stream_{i}"))
            self.feedforward_layers.append(XLNetFeedForward(
                hidden_dim, intermediate_dim, dropout=dropout, activation=activation,
                layer_norm_epsilon=layer_norm_epsilon, kernel_initializer=initializer,
                dtype=dtype, name=f"ff_{i}"))

        # Config attributes used by forward() while the functional graph is traced.
        self.hidden_dim = hidden_dim
        self.bi_data = bi_data
        self.clamp_len = clamp_len
        self.mem_len = mem_len
        self.reuse_len = reuse_len

        # The query stream's start vector is not on the content-stream graph: built here (an
        # unbuilt sublayer made Keras warn at every XLNetBackbone) and tracked below.
        self.mask_embedding.build()

        # === Functional model (content stream) ===
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name)
                  for name in XLNET_INPUTS}
        outputs = {"sequence_output": self.forward(inputs)["sequence_output"]}
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)
        self._query_layers = [self.mask_embedding]

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.activation = activation
        self.bi_data = bi_data
        self.clamp_len = clamp_len
        self.mem_len = mem_len
        self.reuse_len = reuse_len
        self.untie_r = untie_r
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range

    @property
    def token_embedding(self):
        return self.word_embedding

    # === Forward ===
    def _cache(self, h, previous):
        """Memory for the next segment from this layer's input h (B, T, H)."""
        current = h if not self.reuse_len else h[:, : self.reuse_len]
        new = current if previous is None else ops.concatenate(
            [ops.cast(previous, h.dtype), current], axis=1)
        if self.mem_len:
            new = new[:, -self.mem_len:]
        return ops.stop_gradient(new)

    def forward(self, inputs, mems=None, return_mems=False, return_all=False, training=None,
                **kwargs):
        """Both streams, memory, all states. See the class docstring.

        Returns a dict: `sequence_output` (B, T, H); `query_output` (B, P, H) when
        `target_mapping` is given; `mems` (list of L (B, M, H)) with `return_mems`; with
        `return_all`: `hidden_states` (L+1 content-stream states), `query_states` (L+1 or None),
        `attention_probs` / `query_attention_probs` (L tensors (B, N, T, M+T)).
        """
        if kwargs:
            # On torch, `backbone(x)` reaches Keras' layer call through torch.nn.Module.forward
            # (with Keras' `mask=`): hand it back to Keras.
            return keras.Operation.__call__(self, inputs, training=training, **kwargs)
        token_ids = inputs["token_ids"]
        segment_ids = inputs.get("segment_ids")
        padding_mask = inputs.get("padding_mask")
        perm_mask = inputs.get("perm_mask")
        target_mapping = inputs.get("target_mapping")
        mlen = 0 if mems is None else int(mems[0].shape[1])

        h = self.embedding_dropout(self.word_embedding(token_ids), training=training)  # (B,T,H)
        g = None
        if target_mapping is not None:
            g = self.embedding_dropout(self.mask_embedding(target_mapping),
                                       training=training)  # (B, P, H)
        shared = self.attention_inputs(token_ids, segment_ids, padding_mask, perm_mask,
                                       mem_len=mlen, training=training)
        positions, seg_mat = shared["positions"], shared.get("seg_mat")
        content_mask, query_mask = shared.get("content_mask"), shared.get("query_mask")

        new_mems, hs, gs, probs_h, probs_g = [], [h], [g], [], []
        for i, (attention, feedforward) in enumerate(
                zip(self.attention_layers, self.feedforward_layers)):
            memory = None if mems is None else mems[i]
            if return_mems:
                new_mems.append(self._cache(h, memory))
            out = attention(h, g, memory=memory, positions=positions, seg_mat=seg_mat,
                            content_mask=content_mask, query_mask=query_mask,
                            target_mapping=target_mapping, training=training,
                            return_attention_scores=return_all)
            h, g_out, p_h, p_g = out if return_all else out + (None, None)
            g = None if g is None else g_out
            probs_h.append(p_h)
            probs_g.append(p_g)
            h = feedforward(h, training=training)
            if g is not None:
                g = feedforward(g, training=training)
            hs.append(h)
            gs.append(g)

        outputs = {"sequence_output": self.embedding_dropout(h, training=training)}
        if g is not None:
            outputs["query_output"] = self.embedding_dropout(g, training=training)
        if return_mems:
            outputs["mems"] = new_mems
        if return_all:
            outputs.update(hidden_states=hs, query_states=gs if g is not None else None,
                           attention_probs=probs_h,
                           query_attention_probs=probs_g if g is not None else None)
        return outputs

    def inspect(self, inputs, mems=None):
        """Forward pass (inference) with every layer's states and attention probabilities."""
        inputs = {k: ops.convert_to_tensor(v) for k, v in inputs.items()}
        return self.forward(inputs, mems=mems, return_mems=mems is not None, return_all=True,
                            training=False)

    def num_params(self):
        """Distinct parameters (shared biases counted once)."""
        return int(sum(int(ops.size(w)) for w in _unique(self.weights)))
