"""Longformer (Beltagy et al. 2020): RoBERTa with sliding-window + global attention."""
import keras
from keras import ops

from keras_bertfam.layers import TextEmbedding
from keras_bertfam.layers.encoder import AttentionSublayer, TransformerBlock
from keras_bertfam.layers.longformer_attention import (
    LongformerSelfAttention,
    check_window,
    merge_attention_masks,
)
from keras_bertfam.layers.utils import clone_initializer
from keras_bertfam.models.backbone import Backbone, _check_positive, _unique, bert_initializer
from keras_bertfam.models.roberta import ROBERTA_POSITION_OFFSET

LONGFORMER_INPUTS = ("token_ids", "segment_ids", "padding_mask", "global_attention_mask")


def global_attention_for_task(features, task):
    """The global attention a task puts on its inputs (the paper's choices, HF's defaults).

    - "TextClassifier" (and "MultipleChoice"): the first token (`<s>`).
    - "QuestionAnswerer": the question, `<s>` included: HF's "tokens before the first `</s>`",
      the separator being the token that closes the first segment (one `[SEP]` or RoBERTa's
      `</s></s>`).
    - anything else (MaskedLM, TokenClassifier): none.
    """
    padding = ops.cast(ops.cast(features["padding_mask"], "bool"), "int32")
    if task in ("TextClassifier", "MultipleChoice"):
        first = ops.cast(ops.equal(ops.cumsum(ops.ones_like(padding), axis=1), 1), "int32")
        return padding * first
    if task == "QuestionAnswerer":
        token_ids = ops.cast(features["token_ids"], "int32")
        first_segment = ops.cast(ops.equal(features["segment_ids"], 0), "int32") * padding
        # The last token of the first segment (its next position is not in it): a separator.
        nxt = ops.pad(first_segment[:, 1:], [[0, 0], [0, 1]])
        sep = ops.sum(token_ids * first_segment * (1 - nxt), axis=1, keepdims=True)  # (B, 1)
        seen = ops.cumsum(ops.cast(ops.equal(token_ids, sep), "int32"), axis=1)
        return padding * ops.cast(ops.equal(seen, 0), "int32")
    return ops.zeros_like(padding)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LongformerInputs(keras.layers.Layer):
    """Checks the inputs' lengths and merges the padding and global masks (0 pad, 1 local,
    2 global), the one mask the attention layers read."""

    def __init__(self, max_sequence_length, **kwargs):
        super().__init__(**kwargs)
        self.max_sequence_length = max_sequence_length

    def call(self, token_ids, padding_mask, global_attention_mask):
        shapes = {"token_ids": token_ids.shape, "padding_mask": padding_mask.shape,
                  "global_attention_mask": global_attention_mask.shape}
        for name, shape in shapes.items():
            if len(shape) != 2:
                raise ValueError(f"{name} must be (batch, length), got shape {tuple(shape)}.")
        known = {tuple(s) for s in shapes.values() if None not in tuple(s)}
        if len(known) > 1:
            raise ValueError(
                "global_attention_mask, padding_mask and token_ids must have the same (batch, "
                f"length) shape, got {', '.join(f'{k} {tuple(v)}' for k, v in shapes.items())}.")
        length = token_ids.shape[1]
        if length is not None and length > self.max_sequence_length:
            raise ValueError(
                f"The inputs hold {length} tokens; this Longformer takes at most "
                f"max_sequence_length={self.max_sequence_length}.")
        return merge_attention_masks(padding_mask, global_attention_mask)

    def compute_output_spec(self, token_ids, padding_mask, global_attention_mask):
        return keras.KerasTensor(padding_mask.shape, dtype="int32")

    def get_config(self):
        return dict(super().get_config(), max_sequence_length=self.max_sequence_length)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LongformerBackbone(Backbone):
    """The Longformer encoder (Beltagy et al. 2020) with keras-hub's constructor arguments.

    RoBERTa's embeddings (positions from row 2 of a `max_sequence_length + 2`-row table, one
    token type, LayerNorm epsilon 1e-5) and post-LN blocks whose self-attention is
    `LongformerSelfAttention`: a sliding window of `attention_window` tokens (w/2 each side;
    one even int or one per layer) plus global attention on the tokens marked in
    `global_attention_mask`, with its own query / key / value projections, as HF's
    `LongformerModel`. Memory and time grow linearly in the length; any length up to
    `max_sequence_length` works (padded to a multiple of w/2 inside each layer, cut back).

    Inputs: `{"token_ids", "segment_ids", "padding_mask", "global_attention_mask"}`, each (B, T)
    int. `segment_ids` are not embedded (Longformer has one token type); the tasks read them to
    put global attention on a question. Outputs: `{"sequence_output": (B, T, H),
    "pooled_output": (B, H)}` (tanh pooler over `<s>`, as HF's `LongformerModel`).

    `max_global_tokens` bounds the global tokens of a row (a static size for XLA; see
    `LongformerSelfAttention`). Tasks set the global attention themselves
    (`global_attention_for_task`): `<s>` for classification, the question for QA.

    Example:
    >>> backbone = LongformerBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
    ...                               hidden_dim=16, intermediate_dim=32, attention_window=4,
    ...                               max_sequence_length=64)
    >>> out = backbone({"token_ids": [[0, 5, 6, 7, 8, 2]], "segment_ids": [[0] * 6],
    ...                 "padding_mask": [[1] * 6], "global_attention_mask": [[1, 0, 0, 0, 0, 0]]})
    >>> tuple(out["sequence_output"].shape)
    (1, 6, 16)
    """

    family = "longformer"
    task_global_attention = staticmethod(global_attention_for_task)
    # Segment ids are read (0: question, 1: context), not embedded: the export's check allows 0-1.
    segment_id_count = 2

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        attention_window=512,
        max_global_tokens=128,
        dropout=0.1,
        max_sequence_length=4096,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        _check_positive(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads,
            hidden_dim=hidden_dim, intermediate_dim=intermediate_dim,
            max_sequence_length=max_sequence_length, max_global_tokens=max_global_tokens,
        )
        windows = _layer_windows(attention_window, num_layers)
        initializer = bert_initializer(initializer_range)

        # === Layers ===
        self.embeddings = TextEmbedding(
            vocabulary_size, max_sequence_length, hidden_dim, num_segments=1,
            position_offset=ROBERTA_POSITION_OFFSET, layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout, kernel_initializer=initializer, dtype=dtype, name="embeddings",
        )
        self.input_masks = LongformerInputs(max_sequence_length, dtype=dtype, name="input_masks")
        self.blocks = []
        for i, window in enumerate(windows):
            attention = LongformerSelfAttention(
                num_heads, hidden_dim, attention_window=window,
                max_global_tokens=max_global_tokens, attention_dropout=dropout,
                kernel_initializer=clone_initializer(initializer), dtype=dtype, name="attention",
            )
            sublayer = AttentionSublayer(
                hidden_dim, num_heads, layer_norm_epsilon=layer_norm_epsilon, dropout=dropout,
                kernel_initializer=initializer, attention_layer=attention, dtype=dtype,
                name="self_attention",
            )
            self.blocks.append(TransformerBlock(
                intermediate_dim, num_heads, hidden_dim=hidden_dim,
                layer_norm_epsilon=layer_norm_epsilon,
                dropout=dropout, kernel_initializer=initializer, attention=sublayer, dtype=dtype,
                name=f"block_{i}",
            ))
        self.pooler_dense = keras.layers.Dense(
            hidden_dim, activation="tanh", kernel_initializer=clone_initializer(initializer),
            dtype=dtype, name="pooler",
        )

        # === Functional model ===
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name)
                  for name in LONGFORMER_INPUTS}
        outputs = self._forward(inputs)
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.attention_window = attention_window
        self.max_global_tokens = max_global_tokens
        self.dropout = dropout
        self.max_sequence_length = max_sequence_length
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        # What the shared code reads of an encoder backbone.
        self.num_segments = 1
        self.position_offset = ROBERTA_POSITION_OFFSET
        self.activation = "gelu"

    @property
    def layer_windows(self):
        """The attention window of each layer."""
        return _layer_windows(self.attention_window, self.num_layers)

    def layer_block(self, i):
        return self.blocks[i]

    def _forward(self, inputs, head_mask=None, return_all=False, training=None):
        mask = self.input_masks(inputs["token_ids"], inputs["padding_mask"],
                                inputs["global_attention_mask"])
        # One token type: segment ids are the tasks' (global attention on a question).
        x = self.embeddings(inputs["token_ids"], None, training=training)
        hidden_states, attention_probs = [x], []
        for i, block in enumerate(self.blocks):
            x = block(x, padding_mask=mask, head_mask=None if head_mask is None else head_mask[i],
                      return_attention_scores=return_all, training=training)
            if return_all:
                x, probs = x
                hidden_states.append(x)
                attention_probs.append(probs)
        outputs = {"sequence_output": x, "pooled_output": self.pooler_dense(x[:, 0, :])}
        if return_all:
            outputs["hidden_states"] = hidden_states
            outputs["attention_probs"] = attention_probs
        return outputs

    def inspect(self, inputs, head_mask=None):
        """Forward pass with every layer's hidden states and attention probabilities
        ((B, N, T, G + w + 1) each: global-key columns, then the window; see
        `LongformerSelfAttention`)."""
        inputs = {k: ops.convert_to_tensor(v) for k, v in inputs.items() if k in self.input}
        return self._forward(inputs, head_mask=head_mask, return_all=True, training=False)

    def num_params(self):
        """Distinct parameters."""
        return int(sum(int(ops.size(w)) for w in _unique(self.weights)))

    # === From RoBERTa ===
    @classmethod
    def from_roberta(cls, preset_or_dir, max_sequence_length=4096, attention_window=512,
                     **kwargs):
        """A Longformer initialized from a RoBERTa checkpoint, the paper's recipe (Section 5):
        the learned positions copied repeatedly up to `max_sequence_length`, every other weight
        as RoBERTa's, and each layer's global query / key / value projections initialized from
        its local ones. `preset_or_dir`: a RoBERTa preset name, preset dir or HF dir (or a
        `RobertaBackbone`). Continue with MLM pretraining on long documents (`MaskedLM`)."""
        from keras_bertfam.models.roberta import RobertaBackbone

        roberta = (preset_or_dir if isinstance(preset_or_dir, RobertaBackbone)
                   else RobertaBackbone.from_preset(preset_or_dir))
        if max_sequence_length < roberta.max_sequence_length:
            raise ValueError(
                f"max_sequence_length={max_sequence_length} is shorter than the RoBERTa "
                f"checkpoint's {roberta.max_sequence_length} positions.")
        longformer = cls(
            vocabulary_size=roberta.vocabulary_size, num_layers=roberta.num_layers,
            num_heads=roberta.num_heads, hidden_dim=roberta.hidden_dim,
            intermediate_dim=roberta.intermediate_dim, attention_window=attention_window,
            dropout=roberta.dropout, max_sequence_length=max_sequence_length,
            layer_norm_epsilon=roberta.layer_norm_epsilon,
            initializer_range=roberta.initializer_range, **kwargs)
        copy_from_roberta(roberta, longformer)
        return longformer


def copy_from_roberta(roberta, longformer):
    """RoBERTa's weights into a Longformer of the same sizes (see `from_roberta`)."""
    import numpy as np

    src, dst = roberta.embeddings, longformer.embeddings
    for a, b in ((src.token_embedding, dst.token_embedding),
                 (src.segment_embedding, dst.segment_embedding), (src.layer_norm, dst.layer_norm)):
        for wa, wb in zip(a.weights, b.weights):
            wb.assign(wa)
    offset = ROBERTA_POSITION_OFFSET
    table = ops.convert_to_numpy(src.position_embedding.embeddings)
    learned = table[offset:]  # RoBERTa's max_sequence_length learned positions
    new = np.array(ops.convert_to_numpy(dst.position_embedding.embeddings))
    new[:offset] = table[:offset]
    rows = new.shape[0] - offset
    new[offset:] = np.concatenate([learned] * (-(-rows // len(learned))))[:rows]
    dst.position_embedding.embeddings.assign(new)
    for i in range(longformer.num_layers):
        ours, theirs = longformer.blocks[i], roberta.encoder.layer_block(i)
        ours_attn, theirs_attn = ours.attention.attention, theirs.attention.attention
        for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
            for wa, wb in zip(getattr(theirs_attn, name).weights, getattr(ours_attn, name).weights):
                wb.assign(wa)
        for local, glob in (("query_dense", "query_global_dense"), ("key_dense", "key_global_dense"),
                            ("value_dense", "value_global_dense")):
            for wa, wb in zip(getattr(theirs_attn, local).weights,
                              getattr(ours_attn, glob).weights):
                wb.assign(wa)
        for a, b in ((theirs.attention.layer_norm, ours.attention.layer_norm),
                     (theirs.feedforward, ours.feedforward)):
            for wa, wb in zip(a.weights, b.weights):
                wb.assign(wa)
    for wa, wb in zip(roberta.pooler_dense.weights, longformer.pooler_dense.weights):
        wb.assign(wa)


def _layer_windows(attention_window, num_layers):
    """One even window per layer, from an int or a list of `num_layers`."""
    if isinstance(attention_window, (list, tuple)):
        if len(attention_window) != num_layers:
            raise ValueError(
                f"attention_window has {len(attention_window)} entries for num_layers="
                f"{num_layers} layers; give one int or one window per layer.")
        return [check_window(w, layer=i) for i, w in enumerate(attention_window)]
    return [check_window(attention_window)] * num_layers
