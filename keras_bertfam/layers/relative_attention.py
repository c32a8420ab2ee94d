"""XLNet's two-stream relative multi-head attention (Yang et al. 2019, "XLNet"; Dai et al. 2019,
"Transformer-XL"), in keras.ops only.

Pieces, each small and tested alone:

* `relative_positions` / `sinusoid_positions`: the sinusoidal encodings of the relative distances
  `klen, klen-1, ..., -qlen+1` (`attn_type="bi"`), optionally the reversed order for the second half
  of the batch (`bi_data`) and clamped (`clamp_len`).
* `rel_shift`: turns scores against the R = klen + qlen distances into scores against the klen keys.
* `segment_matrix`, `xlnet_attention_masks`: the relative segment matrix and the content / query
  stream masks (pure functions, diagrams in their docstrings).
* `RelativeMultiHeadAttention`: one stream of relative attention with XLNet's post-attention
  residual + LayerNorm:
  `score = ((q + r_w_bias)·k + rel_shift((q + r_r_bias)·k_r) + (q + r_s_bias)·seg_embed[s_ij]) / √d`.
* `TwoStreamRelativeAttention`: the content stream h and the query stream g through one
  `RelativeMultiHeadAttention` (shared weights; keys and values come from the content stream and
  the memory only).
* `XLNetFeedForward`: the shared `FeedForwardSublayer` plus XLNet's dropout after the activation.
* `MaskEmbedding`: the learned vector the query stream starts from.

Layout is batch-first, (B, T, H), unlike the original and HF code (T, B, H).
"""
import math

import keras
from keras import ops

from keras_bertfam.layers.attention import dropout_attention_context
from keras_bertfam.layers.encoder import FeedForwardSublayer
from keras_bertfam.layers.normalization import LayerNormalization
from keras_bertfam.layers.utils import (
    clone_initializer,
    rows_matmul,
    serialize_initializer,
    sublayer_kwargs,
)


# === Positions ===
def relative_positions(qlen, klen, bi_data=False, clamp_len=-1, batch_size=None):
    """Relative distances `klen, klen-1, ..., -qlen+1` (length R = klen + qlen), as float32.

    Query i (at key index `klen - qlen + i`) and key j are `klen - qlen + i - j` apart; that
    distance sits at index `qlen - i + j` of this list, which is what `rel_shift` picks. With
    `bi_data`, the second half of the batch (the reversed copies of the original data pipeline)
    counts the other way (`-distance`): returns (B, R), else (1, R). `clamp_len > 0` clips the
    distances to [-clamp_len, clamp_len].
    """
    pos = ops.cast(klen, "float32") - ops.cast(ops.arange(klen + qlen), "float32")  # (R,)
    pos = pos[None, :]  # (1, R)
    if bi_data:
        if batch_size is None:
            raise ValueError("bi_data needs the batch size.")
        rows = ops.arange(batch_size)
        sign = ops.where(rows < batch_size // 2, 1.0, -1.0)  # (B,)
        pos = pos * ops.cast(sign, "float32")[:, None]  # (B, R)
    if clamp_len is not None and clamp_len > 0:
        pos = ops.clip(pos, -float(clamp_len), float(clamp_len))
    return pos


def sinusoid_positions(pos, hidden_dim):
    """(B, R) distances -> (B, R, H) `[sin(pos·f), cos(pos·f)]`, `f_k = 1 / 10000^(2k/H)`."""
    freq = ops.cast(ops.arange(0, hidden_dim, 2), "float32")
    inv_freq = 1.0 / ops.power(10000.0, freq / hidden_dim)  # (H/2,)
    angles = pos[:, :, None] * inv_freq[None, None, :]  # (B, R, H/2)
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # (B, R, H)


def rel_shift(x, klen):
    """(B, N, T, R) scores against the R distances -> (B, N, T, klen) scores against the keys.

    Entry (i, j) of the result is entry (i, qlen - i + j) of the input (Transformer-XL's shift:
    a reshape that offsets row i by one more column than row i - 1, then a crop).
    """
    shape = ops.shape(x)
    n, t, r = x.shape[1], shape[2], shape[3]
    x = ops.reshape(x, (-1, n, r, t))  # (B, N, R, T)
    x = x[:, :, 1:, :]  # (B, N, R-1, T)
    x = ops.reshape(x, (-1, n, t, r - 1))  # (B, N, T, R-1)
    return x[:, :, :, :klen]


# === Masks ===
def segment_matrix(segment_ids, mem_len=0):
    """(B, T) segment ids -> (B, T, M+T) int: 1 where query i and key j are in different segments.

    XLNet encodes only same / different segment. Memory keys count as segment 0 (as the original
    `mem_pad`). E.g. segments [0, 0, 1] and no memory:

        key   0 1 2
      q 0   [ 0 0 1 ]
        1   [ 0 0 1 ]
        2   [ 1 1 0 ]
    """
    segment_ids = ops.cast(segment_ids, "int32")
    keys = segment_ids
    if mem_len:
        mem = ops.repeat(ops.zeros_like(segment_ids[:, :1]), mem_len, axis=1)  # (B, M)
        keys = ops.concatenate([mem, segment_ids], axis=1)  # (B, M+T)
    return ops.cast(ops.not_equal(segment_ids[:, :, None], keys[:, None, :]), "int32")


def xlnet_attention_masks(padding_mask=None, perm_mask=None, mem_len=0):
    """Content- and query-stream masks, (B, T, M+T) bool, True = may attend.

    `perm_mask[b, i, j] = 1`: i cannot attend to j (the factorization order puts j at or after i).
    `padding_mask[b, j] = 0`: key j is padding. A key is blocked if either says so; memory keys
    (the first M columns) are never blocked. The query stream g_i uses exactly that; the content
    stream h_i may in addition always see itself (its own content). For the factorization order
    2 -> 0 -> 1 of three targets (perm_mask rows: 0 sees 2; 1 sees 0, 2; 2 sees nothing):

        perm_mask       query mask (g)    content mask (h)      (1 = may attend)
        [ 1 1 0 ]       [ 0 0 1 ]         [ 1 0 1 ]
        [ 0 1 0 ]       [ 1 0 1 ]         [ 1 1 1 ]
        [ 1 1 1 ]       [ 0 0 0 ]         [ 0 0 1 ]

    Returns None, None when there is nothing to block (no padding mask and no perm mask): every
    position attends everywhere, as the original's `attn_type="bi"`.
    """
    if padding_mask is None and perm_mask is None:
        return None, None
    blocked = None
    if padding_mask is not None:
        blocked = ops.logical_not(ops.cast(padding_mask, "bool"))[:, None, :]  # (B, 1, T)
    if perm_mask is not None:
        perm = ops.cast(perm_mask, "bool")  # (B, T, T)
        blocked = perm if blocked is None else ops.logical_or(blocked, perm)
    if perm_mask is None:  # (B, 1, T) | (B, T, 1) -> (B, T, T)
        blocked = ops.logical_or(blocked, ops.transpose(ops.zeros_like(blocked), (0, 2, 1)))
    t = ops.shape(blocked)[1]
    if mem_len:
        mem = ops.zeros_like(blocked[:, :, :1])  # (B, T, 1) False
        mem = ops.repeat(mem, mem_len, axis=2)  # (B, T, M)
        blocked = ops.concatenate([mem, blocked], axis=2)  # (B, T, M+T)
    query = ops.logical_not(blocked)
    # Query i is key M + i: the diagonal of the (T, M+T) block.
    eye = ops.equal(ops.arange(t)[:, None] + mem_len, ops.arange(t + mem_len)[None, :])
    content = ops.logical_or(query, eye[None])
    return content, query


# === Layers ===
@keras.saving.register_keras_serializable(package="keras_bertfam")
class RelativeBiases(keras.layers.Layer):
    """XLNet's per-head biases `r_w_bias` (content), `r_r_bias` (position), `r_s_bias` (segment).

    One instance per layer (`untie_r=True`, HF's default) or one shared by every layer
    (`untie_r=False`: the backbone passes the same instance to all attention layers).
    """

    def __init__(self, num_heads, head_dim, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape=None):
        shape = (self.num_heads, self.head_dim)
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
            setattr(self, name, self.add_weight(
                name=name, shape=shape, initializer=clone_initializer(self.kernel_initializer)))
        self.built = True

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, head_dim=self.head_dim,
                      kernel_initializer=serialize_initializer(self.kernel_initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """One stream of XLNet / Transformer-XL relative attention, with residual + LayerNorm.

    Projections have no biases and keep HF's (H, N, Dh) layout (`q, k, v, o, r`). For queries x
    (B, T, H), keys/values from `cat = [memory; h]` (B, K, H) and relative encodings (B, R, H):

        ac = (q + r_w_bias)·k_j                         content
        bd = rel_shift((q + r_r_bias)·(W_r r))          position
        ef = (q + r_s_bias)·seg_embed[s_ij]             segment (s_ij = 1 if different segments)
        out = LN(x + dropout(W_o softmax((ac + bd + ef)/√Dh) v))

    Args:
        num_heads, hidden_dim: N and H (head width Dh = H / N).
        dropout: on attention probabilities and on the output (XLNet uses one rate for both).
        layer_norm_epsilon, kernel_initializer: as XLNet (1e-12, normal(0.02)).
        biases: an optional shared `RelativeBiases` instance (`untie_r=False`).

    Call args: `x` (B, T, H); `cat` (B, K, H) keys/values source (default x); `positions`
    (B|1, R, H) sinusoid encodings; `seg_mat` (B, T, K) int or None; `mask` (B, T, K) bool (True
    = may attend) or None; `target_mapping` (B, P, T): x holds P query-stream vectors, attended at
    the positions the one-hot rows name (the original's two-stream trick).

    Example:
    >>> layer = RelativeMultiHeadAttention(num_heads=2, hidden_dim=8)
    >>> x = ops.ones((1, 3, 8))
    >>> pos = sinusoid_positions(relative_positions(3, 3), 8)
    >>> tuple(layer(x, positions=pos).shape)
    (1, 3, 8)
    """

    def __init__(self, num_heads, hidden_dim, dropout=0.0, layer_norm_epsilon=1e-12,
                 kernel_initializer="glorot_uniform", biases=None, **kwargs):
        super().__init__(**kwargs)
        if hidden_dim % num_heads:
            raise ValueError(
                f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}.")
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // num_heads
        self.dropout = dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.shared_biases = biases is not None
        self.biases = biases or RelativeBiases(num_heads, self.head_dim, self.kernel_initializer,
                                               name="biases", **sublayer_kwargs(self))
        self.layer_norm = LayerNormalization(epsilon=layer_norm_epsilon,
                                                          name="layer_norm",
                                                          **sublayer_kwargs(self))
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", **sublayer_kwargs(self))

    def build(self, input_shape=None):
        shape = (self.hidden_dim, self.num_heads, self.head_dim)
        init = lambda: clone_initializer(self.kernel_initializer)
        self.q = self.add_weight(name="q", shape=shape, initializer=init())
        self.k = self.add_weight(name="k", shape=shape, initializer=init())
        self.v = self.add_weight(name="v", shape=shape, initializer=init())
        self.o = self.add_weight(name="o", shape=shape, initializer=init())
        self.r = self.add_weight(name="r", shape=shape, initializer=init())
        self.seg_embed = self.add_weight(name="seg_embed", shape=(2, self.num_heads,
                                                                  self.head_dim),
                                         initializer=init())
        if not self.biases.built:
            self.biases.build()
        self.layer_norm.build((None, None, self.hidden_dim))
        self.built = True

    # === Pieces (the two-stream layer calls them once for both streams) ===
    def keys_values(self, cat):
        """(B, K, H) -> keys, values (B, K, N, Dh)."""
        k = rows_matmul(cat, ops.cast(self.k, cat.dtype))
        v = rows_matmul(cat, ops.cast(self.v, cat.dtype))
        return k, v

    def position_keys(self, positions, batch_size):
        """(B|1, R, H) encodings -> (B, R, N, Dh)."""
        kr = rows_matmul(positions, ops.cast(self.r, positions.dtype))  # (B|1, R, N, Dh)
        if positions.shape[0] == 1:
            kr = ops.repeat(kr, batch_size, axis=0)
        return kr

    def attend(self, x, k, v, kr, seg_mat=None, mask=None, target_mapping=None, training=False,
               return_attention_scores=False):
        """Queries from x; keys, values, position keys precomputed. Returns LN(x + attn)."""
        q = rows_matmul(x, ops.cast(self.q, x.dtype))  # (B, T|P, N, Dh)
        if target_mapping is not None:
            tm = ops.cast(target_mapping, q.dtype)
            q = ops.einsum("bpnd,bpt->btnd", q, tm)  # (B, T, N, Dh) queries at their positions
        b = self.biases
        klen = ops.shape(k)[1]
        ac = ops.einsum("btnd,bknd->bntk", q + b.r_w_bias, k)  # (B, N, T, K)
        bd = ops.einsum("btnd,brnd->bntr", q + b.r_r_bias, kr)  # (B, N, T, R)
        bd = rel_shift(bd, klen)  # (B, N, T, K)
        score = ac + bd
        if seg_mat is not None:
            ef = ops.einsum("btnd,snd->btns", q + b.r_s_bias, self.seg_embed)  # (B, T, N, 2)
            onehot = ops.one_hot(seg_mat, 2, dtype=ef.dtype)  # (B, T, K, 2)
            score = score + ops.einsum("btks,btns->bntk", onehot, ef)
        score = score / math.sqrt(self.head_dim)
        if mask is not None:
            big = 65500.0 if score.dtype == "float16" else 1e30
            score = ops.where(mask[:, None, :, :], score, ops.cast(-big, score.dtype))
        probs = ops.softmax(score, axis=-1)  # (B, N, T, K)
        if training and self.dropout > 0:
            # The backward pass keeps probs (kept by softmax's gradient anyway), v and a bool
            # mask, not the dropped probabilities (attention.dropout_attention_context).
            context = dropout_attention_context(probs, v, self.dropout_layer)  # (B, T, N, Dh)
        else:
            context = ops.einsum("bntk,bknd->btnd", probs, v)  # (B, T, N, Dh)
        if target_mapping is not None:
            context = ops.einsum("btnd,bpt->bpnd", context, tm)  # (B, P, N, Dh)
        out = rows_matmul(context, ops.cast(self.o, context.dtype), 2,
                          transpose_kernel=True)  # "btnd,hnd->bth": (B, T, H)
        out = self.layer_norm(x + self.dropout_layer(out, training=training))
        return (out, probs) if return_attention_scores else out

    # === Call ===
    def call(self, x, cat=None, positions=None, seg_mat=None, mask=None, target_mapping=None,
             training=False, return_attention_scores=False):
        cat = x if cat is None else cat
        k, v = self.keys_values(cat)
        kr = self.position_keys(positions, ops.shape(x)[0])
        return self.attend(x, k, v, kr, seg_mat, mask, target_mapping, training,
                           return_attention_scores)

    def compute_output_spec(self, x, cat=None, return_attention_scores=False, **kwargs):
        out = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return out
        klen = (cat if cat is not None else x).shape[1]
        return out, keras.KerasTensor((x.shape[0], self.num_heads, x.shape[1], klen),
                                      dtype=self.compute_dtype)

    def get_config(self):
        if self.shared_biases:
            raise NotImplementedError(
                "A RelativeMultiHeadAttention with shared biases is serialized by its backbone.")
        config = super().get_config()
        config.update(num_heads=self.num_heads, hidden_dim=self.hidden_dim, dropout=self.dropout,
                      layer_norm_epsilon=self.layer_norm_epsilon,
                      kernel_initializer=serialize_initializer(self.kernel_initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TwoStreamRelativeAttention(keras.layers.Layer):
    """XLNet's two-stream attention: content stream h and query stream g with shared weights.

    Keys and values come from `[memory; h]` only, so g_i never sees x_i's content: the query stream
    knows the position of the token it predicts (through the relative encodings of its row) but not
    the token. h uses the content mask (sees itself), g the query mask (does not). With
    `target_mapping` (B, P, T), g holds P vectors, one per predicted position. Without g this is
    plain relative attention (fine-tuning).

    Call args: `h` (B, T, H), `g` (B, P, H) or None, `memory` (B, M, H) or None, `positions`,
    `seg_mat`, `content_mask`, `query_mask`, `target_mapping` as in `RelativeMultiHeadAttention`.
    Returns (h', g'); with `return_attention_scores=True` (h', g', probs_h, probs_g). Without g,
    g' and probs_g are empty slices (P = 0): a Keras layer must return one structure whatever the
    call (a functional graph reads the structure of a layer's first call).
    """

    def __init__(self, attention, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention

    def build(self, input_shape=None):
        if not self.attention.built:
            self.attention.build(input_shape)
        self.built = True

    def call(self, h, g=None, memory=None, positions=None, seg_mat=None, content_mask=None,
             query_mask=None, target_mapping=None, training=False, return_attention_scores=False):
        cat = h if memory is None else ops.concatenate(
            [ops.cast(memory, h.dtype), h], axis=1)  # (B, M+T, H)
        k, v = self.attention.keys_values(cat)
        kr = self.attention.position_keys(positions, ops.shape(h)[0])
        out_h = self.attention.attend(h, k, v, kr, seg_mat, content_mask, None, training,
                                      return_attention_scores)
        out_g = None
        if g is not None:
            out_g = self.attention.attend(g, k, v, kr, seg_mat, query_mask, target_mapping,
                                          training, return_attention_scores)
        if return_attention_scores:
            out_h, probs_h = out_h
            if g is None:
                out_g, probs_g = out_h[:, :0], probs_h[:, :, :0]
            else:
                out_g, probs_g = out_g
            return out_h, out_g, probs_h, probs_g
        return out_h, (out_h[:, :0] if g is None else out_g)

    def compute_output_spec(self, h, g=None, memory=None, return_attention_scores=False,
                            **kwargs):
        # Written out: the backends cannot infer the cropped shapes of rel_shift symbolically.
        out_h = keras.KerasTensor(h.shape, dtype=self.compute_dtype)
        klen = None if memory is None or h.shape[1] is None else memory.shape[1] + h.shape[1]
        probs = keras.KerasTensor((h.shape[0], self.attention.num_heads, h.shape[1], klen),
                                  dtype=self.compute_dtype)
        if g is None:
            out_g = keras.KerasTensor((h.shape[0], 0, h.shape[2]), dtype=self.compute_dtype)
            probs_g = keras.KerasTensor(probs.shape[:2] + (0, klen), dtype=self.compute_dtype)
        else:
            out_g = keras.KerasTensor(g.shape, dtype=self.compute_dtype)
            probs_g = keras.KerasTensor(probs.shape, dtype=self.compute_dtype)
        return (out_h, out_g, probs, probs_g) if return_attention_scores else (out_h, out_g)

    def get_config(self):
        raise NotImplementedError("TwoStreamRelativeAttention is serialized by its backbone.")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class RelativeAttentionInputs(keras.layers.Layer):
    """What every layer's attention shares, computed once per forward pass: relative segment
    matrix, content / query masks and the (dropped-out) sinusoid relative encodings.

    Call args: `token_ids` (B, T); `segment_ids`, `padding_mask` (B, T) or None; `perm_mask`
    (B, T, T) or None; `mem_len` (int) the memory length. Returns a dict with `positions`
    (B|1, M+2T, H) and, when they exist, `seg_mat`, `content_mask`, `query_mask`.
    """

    def __init__(self, hidden_dim, bi_data=False, clamp_len=-1, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.bi_data = bi_data
        self.clamp_len = clamp_len
        self.dropout = dropout
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", **sublayer_kwargs(self))
        self.built = True

    def call(self, token_ids, segment_ids=None, padding_mask=None, perm_mask=None, mem_len=0,
             training=False):
        batch, qlen = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        pos = relative_positions(qlen, qlen + mem_len, self.bi_data, self.clamp_len, batch)
        positions = sinusoid_positions(pos, self.hidden_dim)  # (B|1, R, H)
        out = {"positions": self.dropout_layer(ops.cast(positions, self.compute_dtype),
                                               training=training)}
        if segment_ids is not None:
            out["seg_mat"] = segment_matrix(segment_ids, mem_len)
        content, query = xlnet_attention_masks(padding_mask, perm_mask, mem_len)
        if content is not None:
            out["content_mask"], out["query_mask"] = content, query
        return out

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, bi_data=self.bi_data,
                      clamp_len=self.clamp_len, dropout=self.dropout)
        return config


class XLNetFeedForward(FeedForwardSublayer):
    """The shared post-LN `FeedForwardSublayer` with XLNet's extra dropout after the activation.

    HF `XLNetFeedForward` (and the original `positionwise_ffn`):
    `LN(x + dropout(W2 dropout(act(W1 x))))`; the shared sublayer (BERT's) has no dropout between
    the two projections. Weights, names, LayerNorm placement and inference outputs are identical,
    only training-time dropout differs, so this subclass adds that one dropout.
    """

    def __init__(self, hidden_dim, intermediate_dim, dropout=0.0, **kwargs):
        super().__init__(hidden_dim, intermediate_dim, dropout=dropout, **kwargs)
        self.inner_dropout = keras.layers.Dropout(dropout, name="inner_dropout",
                                                  **sublayer_kwargs(self))

    def call(self, x, training=False):
        def mlp(h):
            h = self.inner_dropout(self.activation(self.intermediate_dense(h)), training=training)
            return self.output_dense(h)

        return self.residual(x, mlp, training)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskEmbedding(keras.layers.Layer):
    """The learned vector (`mask_emb`, (1, 1, H)) every query-stream position starts from.

    Call: `target_mapping` (B, P, T) -> (B, P, H).
    """

    def __init__(self, hidden_dim, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape=None):
        self.mask_emb = self.add_weight(name="mask_emb", shape=(1, 1, self.hidden_dim),
                                        initializer=clone_initializer(self.kernel_initializer))
        self.built = True

    def call(self, target_mapping):
        zeros = ops.zeros_like(ops.cast(target_mapping[:, :, :1], self.compute_dtype))  # (B,P,1)
        return zeros + ops.cast(self.mask_emb, self.compute_dtype)  # (B, P, H)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim,
                      kernel_initializer=serialize_initializer(self.kernel_initializer))
        return config
