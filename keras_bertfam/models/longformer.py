"""Longformer (Beltagy et al. 2020): RoBERTa with sliding-window + global attention."""
import keras
import numpy as np
from keras import ops

from keras_bertfam import preset_hooks
from keras_bertfam.layers import TextEmbedding
from keras_bertfam.layers.encoder import AttentionSublayer, TransformerBlock
from keras_bertfam.layers.longformer_attention import (
    GLOBAL,
    LongformerSelfAttention,
    _concrete_int,
    check_window,
    merge_attention_masks,
)
from keras_bertfam.layers.utils import clone_initializer
from keras_bertfam.models.backbone import (
    Backbone,
    _check_positive,
    _unique,
    bert_initializer,
)
from keras_bertfam.models.input_checks import GLOBAL_TOKEN_HINT, MASK_INPUTS
from keras_bertfam.models.roberta import ROBERTA_POSITION_OFFSET
from keras_bertfam.preprocessing.global_attention import global_attention_for_task

LONGFORMER_INPUTS = ("token_ids", "segment_ids", "padding_mask", "global_attention_mask")


# The tasks whose global attention can overflow max_global_tokens, what it is on and how a row
# gets fewer global tokens: the message of the tasks' check that a row's global tokens fit
# (`kb.tasks.task.check_global_attention`). The others put none, or one (TextClassifier's <s>).
TASK_GLOBAL_ATTENTION = {
    "QuestionAnswerer": "the question and the first token before it: shorter questions (the "
                        "preprocessor's max_question_length cuts them) have fewer",
    "MultipleChoice": "each choice and its closing separator: shorter choices (or a shorter "
                      "sequence_length, which cuts them) have fewer",
}

TASK_TOO_MANY_GLOBAL_TOKENS = (
    "Invalid row for {task}: a row has {{}} global tokens, expected at most max_global_tokens="
    "{limit} (the Longformer backbone's global slots a row). {task} puts global attention on "
    "{where}. Or build the backbone with a larger max_global_tokens (no weight depends on it).")

TOO_MANY_GLOBAL_TOKENS = (
    "A row has {} global tokens (global attention, on tokens that are not padding): expected at "
    "most max_global_tokens={limit}, the Longformer backbone's global slots a row. Mark fewer "
    "tokens global, or build the backbone with a larger max_global_tokens (no weight depends "
    "on it).")


def check_global_tokens(mask, max_global_tokens):
    """The merged (B, T) mask (0 padding, 1 local, 2 global) once no row has more than
    `max_global_tokens` global tokens; else an error naming the count and the cap.

    The attention layers hold global attention in `max_global_tokens` static slots. With
    values at hand (an eager call on any backend) this raises a ValueError; in a traced
    TensorFlow graph (`fit` / `predict` / `evaluate`, a `tf.function`, the SavedModel's
    signatures) a `tf.debugging.Assert` stops the step with an InvalidArgumentError. XLA has no
    assertions (`jax.jit`, TensorFlow's `jit_compile`): there the layers' last resort applies
    (such a row's outputs are NaN, never a silently truncated answer; see
    `LongformerSelfAttention`).
    """
    if max_global_tokens is None:  # a LongformerInputs configured before this check
        return mask
    counts = ops.sum(ops.cast(ops.equal(mask, GLOBAL), "int32"), axis=1)  # (B,)
    count = ops.max(counts, initial=0)
    message = TOO_MANY_GLOBAL_TOKENS.format("{}", limit=max_global_tokens)
    return _refuse_if(mask, count > max_global_tokens, count, message, "check_global_tokens")


MASK_NOT_0_OR_1 = {
    name: f"{name} must hold 0 and 1 only, got {{}} ({meaning})." for name, meaning in
    MASK_INPUTS.items()}
MASK_NOT_0_OR_1["padding_mask"] += " " + GLOBAL_TOKEN_HINT


def check_mask_values(mask, name):
    """`mask` once it holds 0 and 1 only; else an error naming it and a value that is not
    (`_refuse_if`): HF's Longformer reads other values (a padding_mask of 2 is a global token,
    a global_attention_mask of -1 padding), ours would read any nonzero value as 1."""
    flat = ops.reshape(mask, (-1,))
    flat = ops.concatenate([flat, ops.zeros((1,), flat.dtype)])  # an index for an empty batch
    bad = ops.logical_and(ops.not_equal(flat, 0), ops.not_equal(flat, 1))
    value = ops.take(flat, ops.argmax(ops.cast(bad, "int32")))  # the first such value
    return _refuse_if(mask, ops.any(bad), value, MASK_NOT_0_OR_1[name], f"check_{name}")


def _refuse_if(tensor, failed, value, message, name):
    """`tensor` unless the scalar `failed` holds: then `message` with the scalar `value` in
    place of its `{}`, as a ValueError with values at hand (an eager call on any backend), in a
    traced TensorFlow graph a `tf.debugging.Assert` that stops the step (an
    InvalidArgumentError). JAX's traces (and XLA, which drops assertions) cannot raise from
    values: the tensor as it is."""
    concrete = _concrete_int(failed)
    if concrete is not None:
        if concrete:
            raise ValueError(message.format(_concrete_int(value)))
        return tensor
    if keras.backend.backend() != "tensorflow":  # traced by JAX (or torch.compile): no assertion
        return tensor
    import tensorflow as tf

    before, after = message.split("{}")
    # The message's parts as the Assert's data (not one tf.strings.format: XLA compiles the
    # Assert away but cannot compile a string op).
    check = tf.debugging.Assert(tf.logical_not(failed), [before.rstrip(), value, after.lstrip()],
                                name=name)
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LongformerInputs(keras.layers.Layer):
    """Checks the inputs' lengths and merges the padding and global masks (0 pad, 1 local,
    2 global), the one mask the attention layers read; checks that no row has more than
    `max_global_tokens` global tokens (`check_global_tokens`; None: not checked here).

    Returns `(mask, token_ids)`: the token ids once their length is checked, for the
    embeddings, which so run after the check (a length past the position table stopped in
    their slice, JAX's predict with a TypeError; an unknown length, TensorFlow's graph traced
    for any length, is checked in the graph)."""

    def __init__(self, max_sequence_length, max_global_tokens=None, **kwargs):
        super().__init__(**kwargs)
        self.max_sequence_length = max_sequence_length
        self.max_global_tokens = max_global_tokens

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
        message = (f"The inputs hold {{}} tokens; this Longformer takes at most "
                   f"max_sequence_length={self.max_sequence_length}.")
        length = token_ids.shape[1]
        if length is not None and length > self.max_sequence_length:
            raise ValueError(message.format(length))
        if length is None:  # a traced TensorFlow graph for any length
            length = ops.shape(token_ids)[1]
            token_ids = _refuse_if(token_ids, length > self.max_sequence_length, length, message,
                                   "check_sequence_length")
        padding_mask = check_mask_values(padding_mask, "padding_mask")
        if global_attention_mask is not None:
            global_attention_mask = check_mask_values(global_attention_mask,
                                                      "global_attention_mask")
        mask = check_global_tokens(merge_attention_masks(padding_mask, global_attention_mask),
                                   self.max_global_tokens)
        return mask, token_ids

    def compute_output_spec(self, token_ids, padding_mask, global_attention_mask):
        return (keras.KerasTensor(padding_mask.shape, dtype="int32"),
                keras.KerasTensor(token_ids.shape, dtype=token_ids.dtype))

    def get_config(self):
        return dict(super().get_config(), max_sequence_length=self.max_sequence_length,
                    max_global_tokens=self.max_global_tokens)


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

    `max_global_tokens` bounds the global tokens of a row (a static number of slots for XLA; HF's
    has no cap). A row with more raises a ValueError eagerly and an InvalidArgumentError in a
    traced TensorFlow graph (`check_global_tokens`); inside `jax.jit` (or TensorFlow's XLA) it
    cannot raise and its outputs are NaN (see `LongformerSelfAttention`). Tasks set the global
    attention themselves (`global_attention_for_task`): `<s>` for classification, the question
    for QA, the choice for multiple choice, and check that their data fits the cap before the
    model, on every backend (`kb.tasks.task.check_global_attention`).

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
        self.input_masks = LongformerInputs(max_sequence_length, max_global_tokens, dtype=dtype,
                                            name="input_masks")
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
        mask, token_ids = self.input_masks(inputs["token_ids"], inputs["padding_mask"],
                                           inputs["global_attention_mask"])
        # One token type: segment ids are the tasks' (global attention on a question).
        x = self.embeddings(token_ids, None, training=training)
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

    # === From RoBERTa / BERT ===
    @classmethod
    def from_roberta(cls, preset_or_dir, max_sequence_length=4096, attention_window=512,
                     **kwargs):
        """A Longformer initialized from a RoBERTa checkpoint, the paper's recipe (Section 5):
        the learned positions copied repeatedly up to `max_sequence_length`, every other weight
        as RoBERTa's, and each layer's global query / key / value projections initialized from
        its local ones. `preset_or_dir`: a RoBERTa preset name, preset dir or HF dir (or a
        `RobertaBackbone`). Continue with MLM pretraining on long documents (`MaskedLM`).

        Example:
        >>> from keras_bertfam.models.roberta import RobertaBackbone
        >>> roberta = RobertaBackbone(100, 2, 2, 16, 32, max_sequence_length=8)
        >>> longformer = LongformerBackbone.from_roberta(roberta, max_sequence_length=64,
        ...                                              attention_window=4)
        >>> longformer.max_sequence_length, longformer.layer_norm_epsilon
        (64, 1e-05)
        """
        from keras_bertfam.models.roberta import RobertaBackbone

        return cls._from_encoder(RobertaBackbone, "RoBERTa", preset_or_dir, max_sequence_length,
                                 attention_window, **kwargs)

    @classmethod
    def from_bert(cls, preset_or_dir, max_sequence_length=4096, attention_window=512, **kwargs):
        """A Longformer initialized from a BERT checkpoint, `from_roberta`'s recipe for BERT.

        BERT's learned positions (rows 0..P-1 of its table) are copied repeatedly into the rows
        the Longformer reads (from row 2, `ROBERTA_POSITION_OFFSET`, up to
        `max_sequence_length`); BERT's segment-0 type embedding becomes the Longformer's one
        token-type row (every token adds it, as every single-segment BERT input does), so
        single-segment inputs embed exactly as in BERT; BERT's `layer_norm_epsilon` (1e-12) is
        kept; global projections start as the local ones. Within a window covering the whole
        input (w >= 2T) the Longformer computes BERT's hidden states on single-segment inputs.
        The vocabulary stays BERT's (WordPiece, `[CLS]` first: the token global attention goes
        to for classification). `preset_or_dir`: a BERT preset name (e.g. the real MiniLM,
        `"all_minilm_l6_v2"`), preset dir or HF dir, or a `BertBackbone`.

        Example:
        >>> from keras_bertfam.models.bert import BertBackbone
        >>> bert = BertBackbone(100, 2, 2, 16, 32, max_sequence_length=8)
        >>> longformer = LongformerBackbone.from_bert(bert, max_sequence_length=64,
        ...                                           attention_window=4)
        >>> longformer.max_sequence_length, longformer.layer_norm_epsilon
        (64, 1e-12)
        """
        from keras_bertfam.models.bert import BertBackbone

        return cls._from_encoder(BertBackbone, "BERT", preset_or_dir, max_sequence_length,
                                 attention_window, **kwargs)

    @classmethod
    def _from_encoder(cls, source_cls, source_name, preset_or_dir, max_sequence_length,
                      attention_window, **kwargs):
        """`from_roberta` / `from_bert`: load the source, check it converts, copy it; built
        and copied as a preset loads (`from_preset`: no initial values drawn for what the copy
        sets)."""
        with preset_hooks.call("deferred_initialization"):
            return cls._copy_encoder(source_cls, source_name, preset_or_dir, max_sequence_length,
                                     attention_window, **kwargs)

    @classmethod
    def _copy_encoder(cls, source_cls, source_name, preset_or_dir, max_sequence_length,
                      attention_window, **kwargs):
        method = f"from_{source_name.lower()}"
        if (not isinstance(max_sequence_length, (int, np.integer))
                or isinstance(max_sequence_length, bool) or max_sequence_length <= 0):
            raise ValueError(f"LongformerBackbone.{method}: max_sequence_length="
                             f"{max_sequence_length!r}; expected a positive integer (the "
                             "Longformer's position table, at least the checkpoint's).")
        if not isinstance(attention_window, (list, tuple)):
            check_window(attention_window)  # before the checkpoint is loaded
        if isinstance(preset_or_dir, Backbone):
            if not isinstance(preset_or_dir, source_cls):
                raise ValueError(
                    f"LongformerBackbone.{method} takes a {source_cls.__name__} (or its preset "
                    f"name or dir), got a {type(preset_or_dir).__name__} (family "
                    f"{preset_or_dir.family!r}).")
            source = preset_or_dir
        else:
            source = source_cls.from_preset(preset_or_dir)  # names the family of a wrong preset
        if max_sequence_length < source.max_sequence_length:
            raise ValueError(
                f"max_sequence_length={max_sequence_length} is shorter than the "
                f"{source_name} checkpoint's {source.max_sequence_length} positions.")
        _check_convertible(source, method)
        longformer = cls(
            vocabulary_size=source.vocabulary_size, num_layers=source.num_layers,
            num_heads=source.num_heads, hidden_dim=source.hidden_dim,
            intermediate_dim=source.intermediate_dim, attention_window=attention_window,
            dropout=source.dropout, max_sequence_length=max_sequence_length,
            layer_norm_epsilon=source.layer_norm_epsilon,
            initializer_range=source.initializer_range, **kwargs)
        copy_encoder_weights(source, longformer)
        return longformer


def _check_convertible(source, method):
    """What a Longformer cannot hold: another activation, pruned heads, shared layers, an
    embedding projection."""
    problems = []
    if source.activation != "gelu":
        problems.append(f"activation={source.activation!r} (the Longformer's is 'gelu')")
    if any(n != source.num_heads for n in source.heads_per_layer or []):
        problems.append(f"pruned heads (heads_per_layer={list(source.heads_per_layer)})")
    if getattr(source, "num_groups", None) not in (None, source.num_layers):
        problems.append(f"shared layers (num_groups={source.num_groups})")
    if getattr(source, "embedding_dim", source.hidden_dim) != source.hidden_dim:
        problems.append(f"an embedding projection (embedding_dim={source.embedding_dim}, "
                        f"hidden_dim={source.hidden_dim})")
    if problems:
        raise ValueError(f"LongformerBackbone.{method} cannot convert this "
                         f"{type(source).__name__}: it has {'; '.join(problems)}.")


def copy_encoder_weights(source, longformer):
    """A BERT or RoBERTa backbone's weights into a Longformer of the same sizes (see
    `from_roberta`, `from_bert`): the source's positions (from its `position_offset`) tiled
    from row `ROBERTA_POSITION_OFFSET` on, its segment-0 type row as the one type row, each
    layer's global projections from its local ones."""
    import numpy as np

    src, dst = source.embeddings, longformer.embeddings
    for a, b in ((src.token_embedding, dst.token_embedding), (src.layer_norm, dst.layer_norm)):
        for wa, wb in zip(a.weights, b.weights):
            wb.assign(wa)
    # The one token type every Longformer input adds: the source's segment 0 (zeros without
    # segment embeddings), so single-segment inputs embed as in the source.
    type_row = (ops.convert_to_numpy(src.segment_embedding.embeddings)[:1]
                if src.segment_embedding is not None
                else np.zeros((1, source.hidden_dim), "float32"))
    dst.segment_embedding.embeddings.assign(type_row)
    table = ops.convert_to_numpy(src.position_embedding.embeddings)
    learned = table[source.position_offset:]  # the source's max_sequence_length positions
    positions = dst.position_embedding.embeddings  # its shape and dtype: its value is not read
    new = np.zeros(positions.shape, keras.backend.standardize_dtype(positions.dtype))
    offset = ROBERTA_POSITION_OFFSET
    if source.position_offset == offset:
        new[:offset] = table[:offset]  # never read; RoBERTa's padding rows, kept for export
    rows = new.shape[0] - offset
    new[offset:] = np.concatenate([learned] * (-(-rows // len(learned))))[:rows]
    dst.position_embedding.embeddings.assign(new)
    for i in range(longformer.num_layers):
        ours, theirs = longformer.blocks[i], source.encoder.layer_block(i)
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
    if source.pooler_dense is not None:
        for wa, wb in zip(source.pooler_dense.weights, longformer.pooler_dense.weights):
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
