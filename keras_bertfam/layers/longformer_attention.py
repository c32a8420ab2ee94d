"""Longformer's self-attention: a sliding window plus symmetric global attention.

Beltagy et al. 2020, "Longformer: The Long-Document Transformer". Each token attends to the
`attention_window / 2` tokens on either side of it (the window w counts both sides); a few
task-chosen tokens attend to every token and every token attends to them, with their own
`query_global` / `key_global` / `value_global` projections for the global tokens' own rows.

The window is computed in blocks, never as a masked T x T matrix. With h = w / 2 and the sequence
padded to a multiple of h, the queries of block b (positions [b·h, (b+1)·h)) can only see keys in
blocks b-1, b and b+1, so each block scores h queries against 3h keys:

    queries   (B, T/h, h,  N, D)        keys of blocks b-1 | b | b+1   (B, T/h, 3h, N, D)
    scores    (B, N, T/h, h, 3h)        band: query r sees key c iff r <= c <= r + 2h

Memory and time are O(T·w) (1.5·T·w scores; HF's overlapping chunks compute 2·T·w).

Two paths compute this, with the same numbers (tested to 1e-5 with their gradients):
- fused, whenever nothing needs the probabilities (no attention dropout in this call, no
  head_mask, no scores returned): one `keras.ops.dot_product_attention` over the blocks (the
  B·T/h blocks are its batch: h queries against [G global keys | 3h neighbour keys] with a boolean
  mask), and one for the global tokens' own rows. On torch that is SDPA's fused CPU kernel, on
  JAX `jax.nn.dot_product_attention`, on TF Keras' own; its inputs are the blocks, so it is
  O(T·w) whatever the kernel.
- explicit, op by op (einsum, where, softmax, einsum): it alone can drop probabilities, scale
  heads (`head_mask`) and return them (the analysis tools use both).
"""
import math

import keras
import numpy as np
from keras import ops

from keras_bertfam.layers.attention import HeadsDense, dropout_attention_context
from keras_bertfam.layers.utils import clone_initializer, serialize_initializer

# Marks of the merged mask the layer reads (HF's `attention_mask * (global_attention_mask + 1)`).
PADDING, LOCAL, GLOBAL = 0, 1, 2
NEG_INF = -1e9


def merge_attention_masks(padding_mask, global_attention_mask):
    """(B, T) padding mask and (B, T) global mask -> (B, T) int32: 0 padding, 1 local, 2 global.

    A padding token marked global stays padding (as HF's `_merge_to_attention_mask`)."""
    padding = ops.cast(ops.cast(padding_mask, "bool"), "int32")
    if global_attention_mask is None:
        return padding
    is_global = ops.cast(ops.cast(global_attention_mask, "bool"), "int32")
    return padding * (is_global + 1)


def check_window(attention_window, layer=None):
    """A window must be a positive even int (each side sees half of it)."""
    where = "attention_window" if layer is None else f"attention_window of layer {layer}"
    if (not isinstance(attention_window, (int, np.integer)) or isinstance(attention_window, bool)
            or attention_window <= 0 or attention_window % 2):
        raise ValueError(
            f"{where} must be a positive even integer (w/2 tokens on each side), got "
            f"{attention_window!r}.")
    return int(attention_window)


def _concrete_int(x):
    """The Python int of a scalar tensor when it holds a value (eager), else None (traced)."""
    if isinstance(x, keras.KerasTensor):
        return None
    try:
        return int(ops.convert_to_numpy(x))
    except Exception:  # a symbolic TF tensor, a JAX tracer
        return None


def _blocks_with_neighbours(x, h):
    """(B, T, ...) with T a multiple of h -> (B, T/h, 3h, ...): each block with its neighbours
    (zero / False beyond the ends)."""
    rest = tuple(x.shape[2:])
    is_bool = x.dtype == "bool"
    if is_bool:  # padded as int: not every backend pads booleans
        x = ops.cast(x, "int32")
    x = ops.pad(x, [[0, 0], [h, h]] + [[0, 0]] * len(rest))  # (B, T + 2h, ...)
    if is_bool:
        x = ops.cast(x, "bool")
    x = ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1] // h, h) + rest)  # (B, T/h + 2, h, ...)
    return ops.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)  # (B, T/h, 3h, ...)


def _band(h):
    """(h, 3h) bool: query r of a block sees key column c (block b-1, b, b+1) iff |offset| <= h."""
    r = np.arange(h)[:, None]
    c = np.arange(3 * h)[None, :]
    return (c >= r) & (c <= r + 2 * h)


def _diagonals(block_probs, h):
    """(B, N, T/h, h, 3h) block probabilities -> (B, N, T, 2h + 1), HF's layout: column j is the
    key at offset j - h of the query."""
    b, n, blocks = (ops.shape(block_probs)[i] for i in range(3))
    x = ops.reshape(block_probs, (b, n, blocks, h * 3 * h))
    x = ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, h]])  # (B, N, T/h, h·(3h + 1))
    x = ops.reshape(x, (b, n, blocks, h, 3 * h + 1))[..., : 2 * h + 1]  # row r: columns r..r+2h
    return ops.reshape(x, (b, n, blocks * h, 2 * h + 1))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LongformerSelfAttention(keras.layers.Layer):
    """Sliding-window + global multi-head self-attention (Beltagy et al. 2020), HF's
    `LongformerSelfAttention` in keras.ops.

    Args:
        num_heads: N; `hidden_dim` must be divisible by it.
        hidden_dim: H.
        attention_window: the whole window w (positive, even): each token sees w/2 on each side.
        max_global_tokens: how many global tokens a row can have (a static number of slots, so
            that the layer compiles with XLA; HF's Longformer sizes them per batch, without a
            cap). A row with more is refused before it gets here wherever it can be:
            - eagerly (any backend, torch's `fit` / `predict`): a ValueError, here and in
              `LongformerBackbone`'s input layer;
            - a traced TensorFlow graph (`fit` / `predict` / `evaluate`, a `tf.function`, every
              SavedModel signature): `LongformerBackbone`'s input layer asserts it in the
              graph (an InvalidArgumentError naming the count; `check_global_tokens`);
            - the tasks' data (raw text through their preprocessor, or model inputs, in memory
              or as a `tf.data.Dataset`), on every backend: the global attention the task will
              derive is counted in `tf.data` before the step (`kb.tasks.task.
              check_global_attention`; its message says how to get fewer, e.g. shorter choices).
            What is left is a traced call that no check reaches and that cannot raise from
            values: the backbone (or this layer) inside `jax.jit` (e.g. `backbone.predict` on
            JAX, a model of your own around it) or XLA-compiled on TensorFlow (`jit_compile`,
            which drops assertions). There, by design, such a row's outputs are all NaN (its
            loss NaN), never an answer with some of its global tokens left local; the other
            rows of the batch are exact. Give such rows a backbone with a larger
            `max_global_tokens` (no weight depends on it).
        attention_dropout: dropout on the attention probabilities.
        kernel_initializer: for the seven projections.

    Call args:
        x: (B, T, H), any T (padded to a multiple of w/2 inside, cut back on return).
        padding_mask: (B, T) merged mask: 0 padding, 1 local, 2 global
            (`merge_attention_masks`); any nonzero/zero (B, T) mask gives local attention only.
        head_mask: optional (N,) or (B, N) multipliers of each head's probabilities.
        return_attention_scores: also return (B, N, T, G + w + 1) probabilities: G global-key
            columns (the global tokens in order), then the window (offsets -w/2..w/2), as HF's
            `attentions`.

    Example:
    >>> layer = LongformerSelfAttention(num_heads=2, hidden_dim=8, attention_window=4)
    >>> tuple(layer(ops.ones((1, 10, 8)), padding_mask=ops.ones((1, 10), "int32")).shape)
    (1, 10, 8)
    """

    def __init__(self, num_heads, hidden_dim, attention_window=512, max_global_tokens=128,
                 attention_dropout=0.0, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if hidden_dim % num_heads:
            raise ValueError(
                f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}.")
        self.attention_window = check_window(attention_window)
        if not isinstance(max_global_tokens, int) or max_global_tokens < 1:
            raise ValueError(
                f"max_global_tokens must be a positive integer, got {max_global_tokens!r}.")
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // num_heads
        self.max_global_tokens = max_global_tokens
        self.attention_dropout = attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        # === Layers ===
        def projection(name):
            return HeadsDense(
                "btd,dnh->btnh",
                output_shape=(None, num_heads, self.head_dim),
                bias_axes="nh",
                kernel_initializer=clone_initializer(self.kernel_initializer),
                name=name,
            )

        self.query_dense = projection("query")
        self.key_dense = projection("key")
        self.value_dense = projection("value")
        self.query_global_dense = projection("query_global")
        self.key_global_dense = projection("key_global")
        self.value_global_dense = projection("value_global")
        self.output_dense = HeadsDense(
            "btnh,nhd->btd",
            output_shape=(None, hidden_dim),
            bias_axes="d",
            kernel_initializer=clone_initializer(self.kernel_initializer),
            name="attention_output",
        )
        self.dropout_layer = keras.layers.Dropout(attention_dropout, name="attention_dropout")

    def build(self, input_shape):
        for layer in (self.query_dense, self.key_dense, self.value_dense,
                      self.query_global_dense, self.key_global_dense, self.value_global_dense):
            layer.build(input_shape)
        self.output_dense.build(tuple(input_shape[:2]) + (self.num_heads, self.head_dim))
        self.built = True

    # === Call ===
    def call(self, x, padding_mask=None, head_mask=None, return_attention_scores=False,
             training=False):
        h = self.attention_window // 2
        n, d = self.num_heads, self.head_dim
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        if padding_mask is None:
            padding_mask = ops.ones((batch, length), "int32")
        mask = ops.cast(padding_mask, "int32")
        if len(mask.shape) != 2:
            raise ValueError(
                "LongformerSelfAttention takes a (batch, length) mask (0 padding, 1 local, 2 "
                f"global), got shape {tuple(mask.shape)}.")
        # Pad T to a multiple of h; padded positions are padding, cut off at the end.
        pad = (-length) % h
        padded_length = length + pad
        x_pad = ops.pad(x, [[0, 0], [0, pad], [0, 0]])  # (B, Tp, H)
        mask = ops.pad(mask, [[0, 0], [0, pad]])  # (B, Tp)
        valid = ops.greater(mask, PADDING)
        is_global = ops.greater(mask, LOCAL)

        num_global, exact = self._num_global_slots(is_global, padded_length)
        overflow = global_idx = slot_ok = None
        if num_global:
            rank = ops.cumsum(ops.cast(is_global, "int32"), axis=1)  # (B, Tp)
            if not exact:
                # G static slots: a row marking more than G tokens (possible only when traced)
                # is poisoned with NaN below rather than answered with some of its tokens left
                # local. (Eagerly G is the exact count: such a row raised an error.)
                overflow = ops.greater(rank[:, -1], num_global)  # (B,)
                is_global = ops.logical_and(is_global, rank <= num_global)
            t_idx = ops.arange(padded_length, dtype="int32")[None, :]  # (1, Tp)
            keys = ops.where(is_global, t_idx, t_idx + padded_length)  # global tokens sort first
            # G spare keys after all tokens keep G columns when Tp < G (a traced, unknown T).
            spare = 2 * padded_length + ops.arange(num_global, dtype="int32")[None, :]
            keys = ops.concatenate([keys, ops.broadcast_to(spare, (batch, num_global))], axis=1)
            order = ops.cast(ops.argsort(keys, axis=1)[:, :num_global], "int32")
            global_idx = ops.minimum(order, padded_length - 1)  # (B, G)
            slot_ok = ops.arange(num_global, dtype="int32")[None, :] < ops.sum(
                ops.cast(is_global, "int32"), axis=1, keepdims=True)  # (B, G)

        # The fused path (one dot_product_attention per part: torch's SDPA, jax.nn's, Keras' own
        # on TF) gives the same numbers as the explicit one, which alone can drop probabilities,
        # mask heads or return them.
        dropout_active = bool(training) and self.attention_dropout > 0
        fused = not (dropout_active or head_mask is not None or return_attention_scores)
        q = self.query_dense(x_pad)  # (B, Tp, N, D)
        k = self.key_dense(x_pad)
        v = self.value_dense(x_pad)
        # Global keys leave the window: every query reaches them through the global columns.
        key_ok = ops.logical_and(valid, ops.logical_not(is_global)) if num_global else valid
        if fused:
            context, probs = self._window_fused(q, k, v, global_idx, num_global, valid,
                                                key_ok, slot_ok), None  # (B, Tp, N, D)
        else:
            context, probs = self._window_explicit(q, k, v, global_idx, num_global, valid,
                                                   key_ok, slot_ok, head_mask, training)

        # --- Global tokens' own rows: their global query against every token ---
        if num_global:
            x_global = ops.take_along_axis(x_pad, global_idx[:, :, None], axis=1)  # (B, G, H)
            q_g = self.query_global_dense(x_global)  # (B, G, N, D)
            if fused:
                row_context = self._global_rows_fused(q_g, num_global, x_pad, valid)
            else:
                row_context = self._global_rows_explicit(q_g, x_pad, valid, head_mask, training)
            # Token t's row is slot rank(t) - 1 of the global tokens: a row of the flattened
            # (B·G, N, D) rows (an index per token, not per element).
            slot = ops.clip(rank - 1, 0, num_global - 1)  # (B, Tp)
            slot = ops.arange(batch, dtype="int32")[:, None] * num_global + slot
            row_context = ops.take(ops.reshape(row_context, (batch * num_global, n, d)),
                                   ops.reshape(slot, (batch * padded_length,)), axis=0)
            row_context = ops.reshape(row_context, (batch, padded_length, n, d))  # (B, Tp, N, D)
            context = ops.where(is_global[:, :, None, None], row_context, context)

        output = self.output_dense(context[:, :length])  # (B, T, H)
        if overflow is not None:
            output = ops.where(overflow[:, None, None], ops.cast(float("nan"), output.dtype),
                               output)
        if not return_attention_scores:
            return output
        if num_global:
            g_probs, local_probs = probs[..., :num_global], probs[..., num_global:]
        else:
            local_probs = probs
        windows = _diagonals(local_probs, h)[:, :, :length]  # (B, N, T, w + 1)
        if num_global:
            g_cols = ops.reshape(g_probs, (batch, n, padded_length, num_global))[:, :, :length]
            windows = ops.concatenate([g_cols, windows], axis=-1)
        return output, windows

    def _window_explicit(self, q, k, v, global_idx, num_global, valid, key_ok, slot_ok,
                         head_mask, training):
        """The sliding window (+ the global key columns) op by op: scores, mask, softmax,
        dropout, head mask, context. Returns the (B, Tp, N, D) context and the
        (B, N, Tp/h, h, G + 3h) probabilities."""
        h = self.attention_window // 2
        n, d = self.num_heads, self.head_dim
        batch, padded_length = ops.shape(q)[0], ops.shape(q)[1]
        q = q * ops.cast(1.0 / math.sqrt(d), q.dtype)
        q_blocks = ops.reshape(q, (batch, padded_length // h, h, n, d))  # (B, Tp/h, h, N, D)
        k_blocks = _blocks_with_neighbours(k, h)  # (B, Tp/h, 3h, N, D)
        v_blocks = _blocks_with_neighbours(v, h)
        key_ok = _blocks_with_neighbours(key_ok, h)  # (B, Tp/h, 3h)
        band = ops.convert_to_tensor(_band(h))  # (h, 3h)
        local_ok = ops.logical_and(band[None, None, None], key_ok[:, None, :, None, :])
        scores = ops.einsum("bcqnd,bcknd->bncqk", q_blocks, k_blocks)  # (B, N, Tp/h, h, 3h)
        scores = ops.where(local_ok, scores, ops.cast(NEG_INF, scores.dtype))
        if num_global:
            # Every query against the global tokens' (local-projection) keys.
            k_global = ops.take_along_axis(k, global_idx[:, :, None, None], axis=1)  # (B, G, N, D)
            v_global = ops.take_along_axis(v, global_idx[:, :, None, None], axis=1)
            g_scores = ops.einsum("bcqnd,bgnd->bncqg", q_blocks, k_global)  # (B, N, Tp/h, h, G)
            g_scores = ops.where(slot_ok[:, None, None, None, :], g_scores,
                                 ops.cast(NEG_INF, g_scores.dtype))
            scores = ops.concatenate([g_scores, scores], axis=-1)

        probs = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), q.dtype)
        # Padding queries attend nowhere (HF zeroes their rows).
        query_ok = ops.reshape(valid, (batch, 1, padded_length // h, h, 1))
        probs = ops.where(query_ok, probs, ops.zeros_like(probs))
        probs = self.dropout_layer(probs, training=training)
        probs = self._apply_head_mask(probs, head_mask)
        local_probs = probs[..., num_global:] if num_global else probs
        context = ops.einsum("bncqk,bcknd->bcqnd", local_probs, v_blocks)  # (B, Tp/h, h, N, D)
        if num_global:
            context = context + ops.einsum("bncqg,bgnd->bcqnd", probs[..., :num_global],
                                           v_global)
        return ops.reshape(context, (batch, padded_length, n, d)), probs  # (B, Tp, N, D)

    def _window_fused(self, q, k, v, global_idx, num_global, valid, key_ok, slot_ok):
        """The same window as one `dot_product_attention` over the blocks: the B·Tp/h blocks
        are its batch, each with h queries against [G global keys | 3h neighbour keys] and a
        boolean (h, G + 3h) mask (keys past either end are masked: their probability is exactly
        0). A padding query sees itself (never an
        all-masked row, so no NaN on any backend) and its context is zeroed, as the explicit
        path's."""
        h = self.attention_window // 2
        n, d = self.num_heads, self.head_dim
        batch, padded_length = ops.shape(q)[0], ops.shape(q)[1]
        blocks = padded_length // h
        # Block c's neighbour keys are positions (c - 1)·h .. (c + 2)·h - 1.
        position = (ops.arange(blocks, dtype="int32")[:, None] * h - h
                    + ops.arange(3 * h, dtype="int32")[None, :])  # (Tp/h, 3h)
        inside = ops.logical_and(position >= 0, position < padded_length)
        position = ops.clip(position, 0, padded_length - 1)
        key_ok = ops.logical_and(
            ops.take(ops.cast(key_ok, "int32"), position, axis=1) > 0, inside)  # (B, Tp/h, 3h)
        band = ops.convert_to_tensor(_band(h))  # (h, 3h)
        itself = ops.convert_to_tensor(np.eye(h, 3 * h, h, dtype=bool))  # (h, 3h): c == r + h
        query_pad = ops.reshape(ops.logical_not(valid), (batch, blocks, h, 1))  # (B, Tp/h, h, 1)
        allowed = ops.logical_or(ops.logical_and(band[None, None], key_ok[:, :, None, :]),
                                 ops.logical_and(itself[None, None], query_pad))  # (B, Tp/h, h, 3h)
        # Keys and values of block c: its G global keys, then blocks c - 1, c, c + 1 (rolled:
        # block 0's previous and the last block's next wrap around, outside and masked), built
        # head-major so that torch's SDPA gets them contiguous (Keras' transpose is then a view).
        width = num_global + 3 * h

        def neighbourhoods(x):  # (B, Tp, N, D) -> (B·Tp/h, G + 3h, N, D)
            x_blocks = ops.transpose(ops.reshape(x, (batch, blocks, h, n, d)),
                                     (0, 1, 3, 2, 4))  # (B, Tp/h, N, h, D)
            parts = [ops.roll(x_blocks, 1, axis=1), x_blocks, ops.roll(x_blocks, -1, axis=1)]
            if num_global:
                x_global = ops.take_along_axis(x, global_idx[:, :, None, None], axis=1)
                x_global = ops.transpose(x_global, (0, 2, 1, 3))[:, None]  # (B, 1, N, G, D)
                parts.insert(0, ops.broadcast_to(x_global, (batch, blocks, n, num_global, d)))
            x_blocks = ops.concatenate(parts, axis=3)  # (B, Tp/h, N, G + 3h, D)
            return ops.transpose(ops.reshape(x_blocks, (batch * blocks, n, width, d)),
                                 (0, 2, 1, 3))

        if num_global:
            slots = ops.broadcast_to(slot_ok[:, None, None, :], (batch, blocks, h, num_global))
            allowed = ops.concatenate([slots, allowed], axis=-1)  # (B, Tp/h, h, G + 3h)
        k_blocks, v_blocks = neighbourhoods(k), neighbourhoods(v)
        context = ops.dot_product_attention(
            ops.reshape(q, (batch * blocks, h, n, d)),  # (B·Tp/h, h, N, D)
            k_blocks,  # (B·Tp/h, G + 3h, N, D)
            v_blocks,
            mask=ops.reshape(allowed, (batch * blocks, 1, h, width)),
            scale=1.0 / math.sqrt(d),
            flash_attention=False,  # Keras' TPU flash path reads one mask for the whole batch
        )  # (B·Tp/h, h, N, D)
        context = ops.reshape(context, (batch, padded_length, n, d))  # (B, Tp, N, D)
        # Padding queries attend nowhere (HF zeroes their rows).
        return ops.where(valid[:, :, None, None], context, ops.zeros_like(context))

    def _global_rows_explicit(self, q_g, x_pad, valid, head_mask, training):
        """(B, G, N, D) global queries against every token's global key, op by op."""
        k_g = self.key_global_dense(x_pad)  # (B, Tp, N, D)
        v_g = self.value_global_dense(x_pad)
        q_g = q_g * ops.cast(1.0 / math.sqrt(self.head_dim), q_g.dtype)
        row_scores = ops.einsum("bgnd,btnd->bngt", q_g, k_g)  # (B, N, G, Tp)
        row_scores = ops.where(valid[:, None, None, :], row_scores,
                               ops.cast(NEG_INF, row_scores.dtype))
        row_probs = ops.cast(ops.softmax(ops.cast(row_scores, "float32"), axis=-1), q_g.dtype)
        if training and self.attention_dropout > 0 and head_mask is None:
            # The backward pass keeps row_probs and a bool mask, not the dropped probabilities.
            return dropout_attention_context(row_probs, v_g, self.dropout_layer)  # (B, G, N, D)
        row_probs = self.dropout_layer(row_probs, training=training)
        row_probs = self._apply_head_mask(row_probs, head_mask)
        return ops.einsum("bngt,btnd->bgnd", row_probs, v_g)  # (B, G, N, D)

    def _global_rows_fused(self, q_g, num_global, x_pad, valid):
        """The same rows through `dot_product_attention`. A row of only padding has no global
        token, so its (unused) slots' rows are fully masked: every backend fills masked scores
        with a finite large negative (uniform, never NaN).

        With few global tokens (G·N < H) the global keys and values of all Tp tokens (two
        H x H projections, 1/7 of a layer's dense FLOPs) are not computed: the key projection
        moves to the G queries, q·(x·Wk + bk) = (q·Wkᵀ)·x + q·bk; the value projection is
        applied after the probabilities (they sum to 1): Σ p·(x·Wv + bv) = (Σ p·x)·Wv + bv.
        The (G·N, Tp) scores are small, computed op by op (a kernel call of width H with one
        head is slower). q·bk is one shift per row, which its softmax ignores, but it is added
        as HF adds bk to every key: left out, bk was on no path, and Keras warned in every fit
        that it had no gradient (HF's, and this one's, is rounding: ~1e-10, neither 0 nor None)."""
        n, d = self.num_heads, self.head_dim
        key, value = self.key_global_dense, self.value_global_dense
        scale = 1.0 / math.sqrt(d)
        if (num_global * n >= self.hidden_dim or key.quantization_mode is not None
                or value.quantization_mode is not None):
            return ops.dot_product_attention(
                q_g, key(x_pad), value(x_pad), mask=valid[:, None, None, :], scale=scale,
                flash_attention=False)  # (B, G, N, D)
        q_x = ops.einsum("bgnd,hnd->bgnh", q_g, ops.cast(key.kernel, q_g.dtype))  # (B, G, N, H)
        q_b = ops.einsum("bgnd,nd->bgn", q_g, ops.cast(key.bias, q_g.dtype))  # (B, G, N)
        scores = (ops.einsum("bgnh,bth->bgnt", q_x, x_pad) + q_b[..., None]) * ops.cast(
            scale, q_x.dtype)  # (B, G, N, Tp)
        scores = ops.where(valid[:, None, None, :], scores,
                           ops.cast(NEG_INF, scores.dtype))  # (B, G, N, Tp)
        probs = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), q_x.dtype)
        mixed = ops.einsum("bgnt,bth->bgnh", probs, x_pad)  # (B, G, N, H)
        return ops.einsum("bgnh,hnd->bgnd", mixed, ops.cast(value.kernel, mixed.dtype)) + ops.cast(
            value.bias, mixed.dtype)  # (B, G, N, D)

    def _num_global_slots(self, is_global, padded_length):
        """(G, exact): G the static number of global slots: the exact maximum count in eager
        calls (0 when there is no global token; exact=True), else min(max_global_tokens, padded
        length)."""
        counts = ops.sum(ops.cast(is_global, "int32"), axis=1)  # (B,)
        count = _concrete_int(ops.max(ops.pad(counts, [[0, 1]])))  # 0 for an empty batch
        if count is not None:
            if count > self.max_global_tokens:
                raise ValueError(
                    f"A row has {count} global tokens; {self.name} takes at most "
                    f"max_global_tokens={self.max_global_tokens}.")
            return count, True
        static_length = padded_length if isinstance(padded_length, int) else None
        if static_length is None:
            return self.max_global_tokens, False
        return min(self.max_global_tokens, static_length), False

    def _apply_head_mask(self, probs, head_mask):
        if head_mask is None:
            return probs
        head_mask = ops.cast(head_mask, probs.dtype)
        shape = (-1, self.num_heads) + (1,) * (len(probs.shape) - 2)
        return probs * ops.reshape(head_mask, shape)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    # === Config ===
    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            attention_window=self.attention_window,
            max_global_tokens=self.max_global_tokens,
            attention_dropout=self.attention_dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        return config
