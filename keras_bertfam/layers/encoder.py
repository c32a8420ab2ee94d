"""The one transformer block and the encoder stack every encoder family runs on.

A block is two residual sublayers, self-attention and feed-forward, each followed by (post-LN,
BERT) or preceded by (pre-LN, `norm_first=True`) a LayerNorm. The sublayers are layers of their own
so that ALBERT's sharing ablation can share one without the other: the encoder passes the same
sublayer instance to several blocks, and Keras then tracks its weights once.
"""
import keras
from keras import ops

from keras_bertfam.layers.attention import MultiHeadSelfAttention
from keras_bertfam.layers.utils import clone_initializer, serialize_initializer

SHARE_MODES = ("none", "all", "attention", "ffn")


def gelu_exact(x):
    """BERT's erf GELU (the tanh approximation differs by up to ~1e-3)."""
    return keras.activations.gelu(x, approximate=False)


def get_activation(activation):
    if activation == "gelu":
        return gelu_exact
    if activation == "gelu_approximate":
        return lambda x: keras.activations.gelu(x, approximate=True)
    return keras.activations.get(activation)


class _Residual(keras.layers.Layer):
    """`x + dropout(f(x))` with a LayerNorm after (post-LN) or before f (pre-LN)."""

    def __init__(self, norm_first, layer_norm_epsilon, dropout, **kwargs):
        super().__init__(**kwargs)
        self.norm_first = norm_first
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm"
        )
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout")

    def residual(self, x, f, training):
        if self.norm_first:
            return x + self.dropout_layer(f(self.layer_norm(x)), training=training)
        return self.layer_norm(x + self.dropout_layer(f(x), training=training))


class AttentionSublayer(_Residual):
    """Residual self-attention: `LN(x + dropout(attention(x)))`.

    `attention_layer`: an attention layer instance to use instead of a `MultiHeadSelfAttention`
    (Longformer's sliding-window attention); it takes the same call arguments.
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        attention_dropout=0.0,
        kernel_initializer="glorot_uniform",
        head_dim=None,
        attention_layer=None,
        **kwargs,
    ):
        super().__init__(norm_first, layer_norm_epsilon, dropout, **kwargs)
        self.attention = attention_layer or MultiHeadSelfAttention(
            num_heads,
            hidden_dim,
            attention_dropout=attention_dropout,
            kernel_initializer=kernel_initializer,
            head_dim=head_dim,
            name="attention",
        )

    def build(self, input_shape):
        self.attention.build(input_shape)
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, head_mask=None, return_attention_scores=False,
             training=False):
        scores = []

        def attend(h):
            out = self.attention(
                h,
                padding_mask=padding_mask,
                head_mask=head_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                out, probs = out
                scores.append(probs)
            return out

        y = self.residual(x, attend, training)
        return (y, scores[0]) if return_attention_scores else y


class FeedForwardSublayer(_Residual):
    """Residual position-wise MLP: `LN(x + dropout(W2 act(W1 x)))`."""

    def __init__(
        self,
        hidden_dim,
        intermediate_dim,
        activation="gelu",
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(norm_first, layer_norm_epsilon, dropout, **kwargs)
        self.activation = get_activation(activation)
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim, kernel_initializer=clone_initializer(kernel_initializer),
            name="intermediate",
        )
        self.output_dense = keras.layers.Dense(
            hidden_dim, kernel_initializer=clone_initializer(kernel_initializer), name="output"
        )

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dense.units,))
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, training=False):
        mlp = lambda h: self.output_dense(self.activation(self.intermediate_dense(h)))
        return self.residual(x, mlp, training)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TransformerBlock(keras.layers.Layer):
    """Self-attention + feed-forward, each residual with LayerNorm (Vaswani et al. 2017).

    Args:
        hidden_dim, num_heads, intermediate_dim: sizes (H, A, 4H in BERT).
        activation: "gelu" (exact erf, BERT's), "gelu_approximate", or any Keras activation.
        norm_first: pre-LN instead of BERT's post-LN.
        layer_norm_epsilon, dropout, attention_dropout, kernel_initializer: as in BERT.
        attention, feedforward: optional sublayer instances to use (and share) instead of new ones.
        head_dim: head width when `num_heads * head_dim != hidden_dim` (structurally pruned heads).

    Example:
    >>> block = TransformerBlock(hidden_dim=8, num_heads=2, intermediate_dim=16)
    >>> block(ops.ones((1, 3, 8)), padding_mask=ops.ones((1, 3))).shape
    (1, 3, 8)
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        intermediate_dim,
        activation="gelu",
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        attention_dropout=None,
        kernel_initializer="glorot_uniform",
        attention=None,
        feedforward=None,
        head_dim=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        common = dict(
            norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            kernel_initializer=self.kernel_initializer,
        )
        self.attention = attention or AttentionSublayer(
            hidden_dim, num_heads, attention_dropout=self.attention_dropout,
            head_dim=head_dim, name="self_attention", **common
        )
        self.feedforward = feedforward or FeedForwardSublayer(
            hidden_dim, intermediate_dim, activation=activation, name="feedforward", **common
        )

    def build(self, input_shape):
        if not self.attention.built:
            self.attention.build(input_shape)
        if not self.feedforward.built:
            self.feedforward.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, head_mask=None, return_attention_scores=False,
             training=False):
        x = self.attention(
            x,
            padding_mask=padding_mask,
            head_mask=head_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if return_attention_scores:
            x, probs = x
            return self.feedforward(x, training=training), probs
        return self.feedforward(x, training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        if self.attention.name != "self_attention" or self.feedforward.name != "feedforward":
            raise NotImplementedError(
                "A TransformerBlock built around shared sublayers is serialized by its "
                "TransformerEncoder, not on its own."
            )
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        if self.head_dim is not None:
            config["head_dim"] = self.head_dim
        return config


def sharing_plan(num_layers, num_groups, share):
    """Which attention and feed-forward sublayer each layer uses.

    Layer i belongs to group `int(i / L * G)` (ALBERT's `int(layer_idx / num_hidden_layers *
    num_hidden_groups)`). A shared kind of sublayer has one instance per group; an unshared kind has
    one per layer. Returns `(attention_index, feedforward_index)`, two lists of length L.

    >>> sharing_plan(4, 2, "attention")
    ([0, 0, 1, 1], [0, 1, 2, 3])
    """
    if share not in SHARE_MODES:
        raise ValueError(f"share must be one of {SHARE_MODES}, got {share!r}.")
    if not 1 <= num_groups <= num_layers:
        raise ValueError(f"num_groups must be in [1, num_layers={num_layers}], got {num_groups}.")
    group = [int(i / num_layers * num_groups) for i in range(num_layers)]
    own = list(range(num_layers))
    return (
        group if share in ("all", "attention") else own,
        group if share in ("all", "ffn") else own,
    )


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TransformerEncoder(keras.layers.Layer):
    """A stack of `num_layers` transformer blocks, optionally sharing weights across layers.

    `share="none"` (BERT) gives every layer its own block. ALBERT's cross-layer sharing (Lan et al.
    2020, Table 4) shares "all" parameters, only the "attention" sublayers, or only the "ffn"
    sublayers among the layers of a group; with `num_groups=1` every layer shares.

    Call returns the last hidden states, or `(last, all_hidden_states, all_attention_probs)` with
    `return_all=True`.

    `heads_per_layer` (a list of L ints, default `num_heads` everywhere) gives each layer its own
    number of heads, all `hidden_dim // num_heads` wide: what `kb.analysis.prune_heads` leaves.
    Layers that share an attention sublayer must keep the same number. `head_mask` is an (L, N)
    tensor, or a list of L per-layer (N_i,) / (B, N_i) multipliers when the counts differ.
    """

    def __init__(
        self,
        num_layers,
        hidden_dim,
        num_heads,
        intermediate_dim,
        activation="gelu",
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        attention_dropout=None,
        kernel_initializer="glorot_uniform",
        num_groups=None,
        share="none",
        heads_per_layer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.num_groups = num_groups or (1 if share != "none" else num_layers)
        self.share = share
        self.heads_per_layer = None if heads_per_layer is None else [int(n) for n in
                                                                        heads_per_layer]

        block_args = dict(
            hidden_dim=hidden_dim,
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            activation=activation,
            norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            attention_dropout=attention_dropout,
            kernel_initializer=self.kernel_initializer,
        )
        attention_index, feedforward_index = sharing_plan(num_layers, self.num_groups, share)
        heads_of = _heads_of_attention(self.heads_per_layer, num_layers, num_heads, hidden_dim,
                                       attention_index)

        def pruned(args, index):
            """Block / sublayer arguments for attention sublayer `index` (its head count)."""
            if heads_of is None:
                return args
            return dict(args, num_heads=heads_of[index], head_dim=hidden_dim // num_heads)

        self.blocks = []
        if share == "all" or self.num_groups == num_layers:
            # One block per distinct index; layer i calls block attention_index[i].
            unique = sorted(set(attention_index))
            self.blocks = [TransformerBlock(name=f"block_{g}", **pruned(block_args, g))
                           for g in unique]
            # The float formula can skip a group (L=22, G=22: layers 14 and 15 share group 14, as
            # in the original code), so index blocks by rank among the groups in use.
            self._block_of_layer = [unique.index(g) for g in attention_index]
        else:
            # Partial sharing: L blocks over shared sublayer instances.
            attn_args = dict(block_args)
            del attn_args["intermediate_dim"], attn_args["activation"]
            attn_args["attention_dropout"] = (
                dropout if attention_dropout is None else attention_dropout
            )
            ffn_args = dict(block_args)
            del ffn_args["num_heads"], ffn_args["attention_dropout"]
            attentions = {
                i: AttentionSublayer(name=f"self_attention_{i}", **pruned(attn_args, i))
                for i in sorted(set(attention_index))
            }
            feedforwards = {
                i: FeedForwardSublayer(name=f"feedforward_{i}", **ffn_args)
                for i in sorted(set(feedforward_index))
            }
            self.blocks = [
                TransformerBlock(
                    name=f"block_{i}",
                    attention=attentions[attention_index[i]],
                    feedforward=feedforwards[feedforward_index[i]],
                    **pruned(block_args, attention_index[i]),
                )
                for i in range(num_layers)
            ]
            self._block_of_layer = list(range(num_layers))

    def layer_block(self, i):
        """The block that layer i runs."""
        return self.blocks[self._block_of_layer[i]]

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, head_mask=None, return_all=False, training=False):
        if head_mask is None:
            # Set by `kb.analysis` around a task's call, to differentiate with respect to it.
            head_mask = getattr(self, "head_mask_override", None)
        hidden_states, attention_probs = [x], []
        for i in range(self.num_layers):
            layer_head_mask = None if head_mask is None else head_mask[i]
            x = self.layer_block(i)(
                x,
                padding_mask=padding_mask,
                head_mask=layer_head_mask,
                return_attention_scores=return_all,
                training=training,
            )
            if return_all:
                x, probs = x
                hidden_states.append(x)
                attention_probs.append(probs)
        if return_all:
            return x, hidden_states, attention_probs
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            hidden_dim=self.hidden_dim,
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
            num_groups=self.num_groups,
            share=self.share,
        )
        if self.heads_per_layer is not None:
            config["heads_per_layer"] = self.heads_per_layer
        return config


def _heads_of_attention(heads_per_layer, num_layers, num_heads, hidden_dim, attention_index):
    """{attention sublayer index: its number of heads}, or None when no layer was pruned.

    Raises when layers sharing one attention sublayer (ALBERT) are given different counts."""
    if heads_per_layer is None:
        return None
    if len(heads_per_layer) != num_layers or any(
            not 0 <= n <= num_heads for n in heads_per_layer):
        raise ValueError(
            f"heads_per_layer must list {num_layers} head counts in [0, num_heads={num_heads}], "
            f"got {heads_per_layer}.")
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}.")
    heads = {}
    for layer, index in enumerate(attention_index):
        if heads.setdefault(index, heads_per_layer[layer]) != heads_per_layer[layer]:
            raise ValueError(
                f"Layers sharing attention sublayer {index} must keep the same number of heads; "
                f"heads_per_layer={heads_per_layer}.")
    return heads
