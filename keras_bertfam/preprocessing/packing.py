"""Segment packing (BERT's `[CLS] A [SEP] (B [SEP])`, XLNet's `A <sep> (B <sep>) <cls>`),
RoBERTa's FULL-/DOC-SENTENCES and token blocks, and BERT's NSP / ALBERT's SOP pairing.

All layers are `tf.data` preprocessing layers: they take and return TensorFlow tensors (never backend
tensors), work on a whole batch with vectorized TF ops (loops are `tf.while_loop`s over instances or
blocks that advance every row at once), and use core TensorFlow ops only, so a SavedModel holding
them loads on TF Serving builds whose tf-text lacks newer ops such as `TFText>RoundRobinTrim`.

Documents are ragged token ids `[B, (S sentences), (W tokens)]`, e.g.:

```python
from keras_bertfam.preprocessing import corpus
sentences = corpus.split_sentences(texts)                          # [B, (S)] tf.string
documents = sentences.with_flat_values(tokenizer(sentences.flat_values))  # [B, (S), (W)]
a, b, is_random_next = NextSentencePairer(128, seed=1)(documents)  # [N, (T)], [N, (T)], [N]
```
"""
import keras
import numpy as np
import tensorflow as tf

from keras_bertfam.preprocessing.errors import KeepsTFErrors, _assert_then, _first_or_zero
from keras_bertfam.preprocessing.seeding import SeededStage
from keras_bertfam.preprocessing.ragged import keep_values, merge_rows, rows_and_index

# === Helpers ===


class _TFLayer(KeepsTFErrors, keras.layers.Layer):
    """A Keras layer that keeps TensorFlow tensors (inputs are not converted to the backend)
    and TensorFlow errors' messages (`KeepsTFErrors`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True


def _is_id(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _plain_ids(value, name):
    """An id or a list of ids (Python or NumPy integers; not booleans) as Python ints (what a
    config holds), None as None."""
    if value is None or _is_id(value):
        return None if value is None else int(value)
    if isinstance(value, (list, tuple)) and all(_is_id(v) for v in value):
        return [int(v) for v in value]
    raise ValueError(f"`{name}` must be an int id or a list of int ids. Received: {name}={value!r}")


def _one_id(value, name, optional=True):
    """One id (a Python or NumPy integer; not a boolean) as a Python int; None as None where
    `optional`."""
    if _is_id(value):
        return int(value)
    if value is None and optional:
        return None
    raise ValueError(f"`{name}` must be an int id. Received: {name}={value!r}")


def _as_list(ids):
    """What `_plain_ids` returns, as a list."""
    return [] if ids is None else [ids] if isinstance(ids, int) else ids


def _to_ragged(x, name="inputs"):
    """Tensor / RaggedTensor / nested list -> rank-2 RaggedTensor, and whether it was unbatched."""
    if not isinstance(x, (tf.Tensor, tf.RaggedTensor)):
        x = tf.ragged.constant(x) if isinstance(x, (list, tuple)) else tf.convert_to_tensor(x)
    if isinstance(x, tf.Tensor):
        if x.shape.rank == 1:
            return tf.RaggedTensor.from_tensor(x[tf.newaxis]), True
        if x.shape.rank != 2:
            raise ValueError(f"`{name}` must be rank 1 or 2. Received shape {x.shape}")
        return tf.RaggedTensor.from_tensor(x), False
    if x.shape.rank != 2:
        raise ValueError(f"`{name}` must be a rank-2 RaggedTensor [B, (T)]. Received shape {x.shape}")
    return x, False


def _check_documents(documents):
    if isinstance(documents, (list, tuple)):
        documents = tf.ragged.constant(documents, ragged_rank=2)
    if not isinstance(documents, tf.RaggedTensor) or documents.shape.rank != 3:
        raise ValueError(
            "Documents must be a rank-3 RaggedTensor of token ids [batch, (sentences), (tokens)]. "
            f"Received: {documents!r:.200}"
        )
    if documents.ragged_rank != 2:
        documents = tf.RaggedTensor.from_nested_row_lengths(
            tf.reshape(documents.flat_values, [-1]),
            [documents.row_lengths(1), tf.reshape(documents.row_lengths(2), [-1])],
        )
    # Empty sentences carry no text: drop them so every sentence has >= 1 token. They hold no
    # values, so only the partitions change: a document's sentences are the lengths of its
    # non-empty ones (`tf.ragged.boolean_mask` on the documents traced 3x the ops).
    lengths = documents.with_values(documents.values.row_lengths())  # [B, (S)] tokens
    lengths = keep_values(lengths, lengths.values > 0)
    return lengths.with_values(tf.RaggedTensor.from_row_lengths(
        documents.flat_values, lengths.values, validate=False))


def _stateless_seed(seed):
    if isinstance(seed, int):
        return tf.constant([seed, 0], tf.int64)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    return tf.reshape(seed, [2])


def _sub_seed(seed, step, k):
    """Independent stateless seed for draw `k` of loop step `step`."""
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(step, tf.int64) + 1)
    return tf.random.experimental.stateless_fold_in(seed, k)


def _stack_steps(ta, width):
    """TensorArray of [width] vectors -> [width * steps] in row-major (row, step) order."""
    stacked = tf.reshape(ta.concat(), tf.stack([-1, tf.maximum(width, 1)]))  # (steps, width)
    return tf.reshape(tf.transpose(stacked, [1, 0]), [-1])


def _gather_segments(tokens, rows, starts, ends):
    """Ragged [N, (T)]: row `rows[n]` of `tokens` ([B, (L)]) sliced to [starts[n], ends[n])."""
    base = tf.gather(tokens.row_splits, rows)
    offsets = tf.cast(base, tf.int64)
    idx = tf.ragged.range(offsets + tf.cast(starts, tf.int64), offsets + tf.cast(ends, tf.int64))
    return tf.RaggedTensor.from_row_splits(tf.gather(tokens.values, idx.values), idx.row_splits,
                                           validate=False)


# === Trimming (core TF ops only) ===


def round_robin_lengths(lengths, budget):
    """Lengths kept by round-robin trimming: [B, K] int32 lengths -> [B, K] allocations.

    Tokens are handed out one at a time to segments 0, 1, ..., K-1, 0, 1, ... (skipping segments
    already whole) until `budget` tokens are used. Equivalently: the largest level `k` with
    `sum(min(len, k)) <= budget`, plus one token for the first remaining segments longer than `k`.
    One segment keeps `min(len, budget)`; two keep what BERT's `_truncate_seq_pair` keeps
    (`longest_first_lengths`: the same allocation, in closed form); more are computed by a static
    binary search over `k` (about log2(budget) vectorized steps).
    """
    lengths = tf.cast(lengths, tf.int32)
    budget = int(budget)
    if lengths.shape[1] == 1:
        return tf.minimum(lengths, budget)
    if lengths.shape[1] == 2:
        return tf.stack(longest_first_lengths(lengths[:, 0], lengths[:, 1], budget), axis=1)
    lo = tf.zeros_like(lengths[:, 0])  # feasible level
    hi = tf.fill(tf.shape(lo), budget)  # upper bound
    for _ in range(max(budget, 1).bit_length() + 1):
        mid = (lo + hi + 1) // 2
        ok = tf.reduce_sum(tf.minimum(lengths, mid[:, None]), axis=1) <= budget
        lo = tf.where(ok, mid, lo)
        hi = tf.where(ok, hi, mid - 1)
    level = lo[:, None]  # (B, 1)
    base = tf.minimum(lengths, level)
    extra = budget - tf.reduce_sum(base, axis=1, keepdims=True)
    eligible = tf.cast(lengths > level, tf.int32)
    rank = tf.cumsum(eligible, axis=1, exclusive=True)
    return base + eligible * tf.cast(rank < extra, tf.int32)


def waterfall_lengths(lengths, budget):
    """Lengths kept by waterfall trimming: segments fill the budget left to right."""
    lengths = tf.cast(lengths, tf.int32)
    before = tf.cumsum(lengths, axis=1, exclusive=True)
    return tf.minimum(lengths, tf.maximum(int(budget) - before, 0))


def keep_first(segment, keep):
    """Keep the first `keep[b]` (<= the row's length) tokens of each row of ragged `segment`.
    (A gather over a ragged range: `tf.ragged.boolean_mask` builds ~10x the ops.)"""
    starts = segment.row_starts()
    kept = tf.ragged.range(starts, starts + tf.cast(keep, starts.dtype))
    return tf.RaggedTensor.from_row_splits(tf.gather(segment.values, kept.values),
                                           kept.row_splits, validate=False)


# === XLNet packing ===
def longest_first_lengths(len_a, len_b, budget):
    """Lengths kept by BERT's / XLNet's `_truncate_seq_pair` (drop from the longer, ties from b)."""
    len_a, len_b = tf.cast(len_a, tf.int32), tf.cast(len_b, tf.int32)
    over = len_a + len_b > budget
    keep_a = tf.minimum(len_a, tf.maximum(budget - len_b, (budget + 1) // 2))
    return tf.where(over, keep_a, len_a), tf.where(over, budget - keep_a, len_b)


XLNET_PAD_SEGMENT_ID = 3  # HF XLNetTokenizer's segment id of padding


def xlnet_pack(segment_a, segment_b=None, sequence_length=128, sep_token_id=4, cls_token_id=3,
               pad_token_id=5, pad_segment_id=XLNET_PAD_SEGMENT_ID):
    """XLNet's layout: `A <sep> (B <sep>) <cls>`, LEFT padding, truncated longest-first.

    Segment ids: A and its `<sep>` 0, B and its `<sep>` 1, `<cls>` 2, padding `pad_segment_id` (3
    as HF's `XLNetTokenizer`; the original classifier uses 4; only equality matters and padded keys
    are masked). Takes ragged (B, (L)) ids; returns dense (B, T) `token_ids`, `segment_ids`,
    `padding_mask`.
    """
    segments = [tf.cast(s, tf.int32) for s in
                ((segment_a,) if segment_b is None else (segment_a, segment_b))]
    budget = sequence_length - len(segments) - 1
    if budget < 0:
        raise ValueError(f"sequence_length={sequence_length} cannot hold XLNet's "
                         f"{len(segments) + 1} special tokens.")
    # kept: one segment's first `budget` tokens; two longest first (`longest_first_lengths`)
    lengths = stacked_row_lengths(segments, "xlnet_pack")
    closings = [[sep_token_id]] * (len(segments) - 1) + [[sep_token_id, cls_token_id]]
    ids, segment_ids, mask = pack_segments(segments, [], closings,
                                           round_robin_lengths(lengths, budget),
                                           sequence_length, pad_token_id, right_align=True)
    # <cls> (always the last column) is segment 2; padding pad_segment_id
    last = tf.range(sequence_length) == sequence_length - 1
    segment_ids = tf.where(last, 2, tf.where(mask, segment_ids, pad_segment_id))
    return dict(token_ids=ids, segment_ids=segment_ids, padding_mask=tf.cast(mask, tf.int32))


def stacked_row_lengths(segments, who):
    """The (B, K) int32 row lengths of K ragged (B, (L)) segments, once they hold as many rows
    each: else a ValueError where the counts are known, or in a graph an assertion, naming
    them (`tf.stack`'s was "Shapes of all inputs must match": a text pair whose two batches
    differ, e.g. a dataset zipping batches of 2 and of 1)."""
    lengths = [tf.cast(s.row_lengths(), tf.int32) for s in segments]
    message = (f"{who} got segments of different batch sizes: segment 0 has {{}} examples, "
               "segment {} has {} (a text pair's two batches hold as many texts).")
    counts = [s.shape[0] for s in segments]
    if None not in counts:
        for i, n in enumerate(counts[1:], 1):
            if n != counts[0]:
                raise ValueError(message.format(counts[0], i, n))
    elif len(segments) > 1:
        rows = tf.stack([tf.shape(length)[0] for length in lengths])  # (K,)
        other = tf.where(tf.not_equal(rows, rows[0]))[:, 0]
        lengths[0] = _assert_then(lengths[0], tf.equal(tf.size(other), 0), message, rows[:1],
                                  _first_or_zero(other), tf.gather(rows, _first_or_zero(other)))
    return tf.stack(lengths, axis=1)


def left_pad(x, length, value):
    """Ragged (B, (n <= length)) -> dense (B, length), the values flush right."""
    dense = x.to_tensor(value, shape=[None, length])  # right-padded
    shift = length - tf.cast(x.row_lengths(), tf.int32)  # (B,)
    src = tf.range(length)[None, :] - shift[:, None]  # (B, T) source column
    gathered = tf.gather(dense, tf.maximum(src, 0), batch_dims=1)
    return tf.where(src >= 0, gathered, tf.cast(value, dense.dtype))


def pack_segments(segments, start, closings, keep, length, pad_value, right_align=False):
    """Ragged segments [B, (T_k)] (one dtype), the start tokens, each segment's closing tokens
    (lists of ids) and the tokens kept of each segment `keep` [B, K] -> (token_ids [B, length],
    segment_ids [B, length] int32, mask [B, length] bool): `start A closing_A B closing_B ...`,
    padded on the right, or on the left with `right_align`. A token's segment id is its
    segment's, a closing token's the segment it closes, a start token's and padding's 0.

    Every token and special token is scattered to its column in one op (ragged concatenation
    and padding built ~3x the ops, and tracing them dominated a preprocessor's trace); a token
    trimmed off goes to a column past the end, cut after."""
    dtype = segments[0].dtype
    batch = tf.cast(segments[0].nrows(), tf.int32)
    pieces = keep + tf.constant([len(c) for c in closings], tf.int32)  # (B, K)
    first = len(start) + tf.cumsum(pieces, axis=1, exclusive=True)  # each's 1st column
    counts = tf.reduce_sum(pieces, axis=1) + len(start)  # (B,) the row's tokens
    # The special tokens, the same in every row: the start tokens from column 0, each
    # segment's closing tokens from the column after its kept tokens.
    specials = list(start) + [t for c in closings for t in c]
    after = [0] * len(start) + [i + 1 for i, c in enumerate(closings) for _ in c]
    offset = list(range(len(start))) + [j for c in closings for j in range(len(c))]
    closing_at = tf.concat([tf.zeros_like(keep[:, :1]), first + keep], axis=1)  # (B, K + 1)
    special_columns = (tf.gather(closing_at, tf.constant(after, tf.int32), axis=1)
                       + tf.constant(offset, tf.int32))  # (B, S)
    shift = length - counts if right_align else None  # (B,) padding columns on the left
    if right_align:
        special_columns += shift[:, None]
    rows = [tf.reshape(tf.broadcast_to(tf.range(batch)[:, None], tf.shape(special_columns)),
                       [-1])]
    columns = [tf.reshape(special_columns, [-1])]
    values = [tf.tile(tf.constant(specials, dtype), [batch])]
    for i, segment in enumerate(segments):
        splits = tf.cast(segment.row_splits, tf.int32)
        row, index = rows_and_index(splits)  # each token's row, its index in the values
        local = index - tf.gather(splits, row)  # the token's place in its row
        column = tf.gather(first[:, i] if shift is None else first[:, i] + shift, row) + local
        rows.append(row)
        columns.append(tf.where(local < tf.gather(keep[:, i], row), column, length))
        values.append(segment.values)
    scatter = tf.stack([tf.concat(rows, 0), tf.concat(columns, 0)], axis=1)
    token_ids = tf.tensor_scatter_nd_update(
        tf.fill(tf.stack([batch, length + 1]), tf.cast(pad_value, dtype)), scatter,
        tf.concat(values, 0))[:, :length]
    position = tf.range(length)[None, :]  # (1, L): the column in the unshifted row
    if right_align:
        position = position - shift[:, None]  # (B, L)
        mask = (position >= 0) & (position < counts[:, None])
    else:
        mask = position < counts[:, None]
    segment_ids = tf.reduce_sum(tf.cast(position[..., None] >= first[:, None, 1:], tf.int32),
                                axis=2)
    return token_ids, tf.where(mask, segment_ids, 0), mask


# === SegmentPacker ===


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SegmentPacker(_TFLayer):
    """Pack one or more segments into `[CLS] A [SEP] (B [SEP])` fixed-length model inputs.

    Devlin et al., 2018 (BERT). The outputs follow keras-hub's `MultiSegmentPacker`: right padding
    with `pad_value`; the start token has segment id 0 and each separator / end token the id of the
    segment it closes; truncation is `"round_robin"` (one token at a time to each segment still
    wanting some, first segment first) or `"waterfall"` (left to right). Unlike keras-hub's, the
    round-robin trimming is written in core TF ops (no `TFText>RoundRobinTrim`), and the layer also
    returns the padding mask.

    Args:
        sequence_length: int, output length.
        start_value: int or list of ints placed at the start (`[CLS]`).
        end_value: int or list of ints after the last segment (`[SEP]`).
        pad_value: int for the padded positions.
        truncate: `"round_robin"` or `"waterfall"`.
        sep_value: int or list of ints after every other segment; defaults to `end_value`.
        return_dict: return `{"token_ids", "segment_ids", "padding_mask"}` instead of a tuple.

    Call args:
        inputs: a segment or a tuple of segments, each `[B, (T)]` ragged / `[B, T]` dense, or `[T]`
            for a single example.

    Returns: `(token_ids, segment_ids, padding_mask)`: `[B, sequence_length]` int32 (the token dtype
        for `token_ids`), int32 and bool.

    Example:
    >>> packer = SegmentPacker(8, start_value=101, end_value=102)
    >>> ids, seg, mask = packer((tf.ragged.constant([[1, 2, 3, 4]]), tf.ragged.constant([[5, 6, 7]])))
    >>> ids.numpy().tolist()
    [[101, 1, 2, 3, 102, 5, 6, 102]]
    """

    def __init__(
        self,
        sequence_length,
        start_value,
        end_value,
        pad_value=0,
        truncate="round_robin",
        sep_value=None,
        return_dict=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if truncate not in ("round_robin", "waterfall"):
            raise ValueError(f"`truncate` must be 'round_robin' or 'waterfall'. Received: {truncate!r}")
        self.sequence_length = int(sequence_length)
        self.start_value = _plain_ids(start_value, "start_value")
        self.end_value = _plain_ids(end_value, "end_value")
        self.pad_value = _one_id(pad_value, "pad_value", optional=False)
        self.truncate = truncate
        self.sep_value = _plain_ids(sep_value, "sep_value")
        self.return_dict = return_dict
        self._start = _as_list(self.start_value)
        self._end = _as_list(self.end_value)
        self._sep = self._end if sep_value is None else _as_list(self.sep_value)

    # === Call ===

    def call(self, inputs):
        segments = inputs if isinstance(inputs, (tuple, list)) and not _is_id_list(inputs) else (inputs,)
        if not segments:
            raise ValueError("SegmentPacker needs at least one segment.")
        converted = [_to_ragged(s, f"segment {i}") for i, s in enumerate(segments)]
        segments = [s for s, _ in converted]
        unbatched = converted[0][1]
        if any(u != unbatched for _, u in converted):
            raise ValueError("All segments must have the same rank.")
        dtype = segments[0].dtype
        segments = [tf.cast(s, dtype) for s in segments]
        num_special = len(self._start) + (len(segments) - 1) * len(self._sep) + len(self._end)
        budget = self.sequence_length - num_special
        if budget < 0:
            raise ValueError(
                f"sequence_length={self.sequence_length} cannot hold the {num_special} special tokens."
            )
        lengths = stacked_row_lengths(segments, type(self).__name__)  # (B, K)
        if self.truncate == "round_robin":
            keep = round_robin_lengths(lengths, budget)
        else:
            keep = waterfall_lengths(lengths, budget)
        closings = [self._end if i == len(segments) - 1 else self._sep
                    for i in range(len(segments))]
        token_ids, segment_ids, mask = pack_segments(segments, self._start, closings, keep,
                                                     self.sequence_length, self.pad_value)
        if unbatched:
            token_ids, segment_ids, mask = token_ids[0], segment_ids[0], mask[0]
        if self.return_dict:
            return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": mask}
        return token_ids, segment_ids, mask

    # === Config ===

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            start_value=self.start_value,
            end_value=self.end_value,
            pad_value=self.pad_value,
            truncate=self.truncate,
            sep_value=self.sep_value,
            return_dict=self.return_dict,
        )
        return config


def _is_id_list(x):
    """A python list of ints is one unbatched segment, not a tuple of segments."""
    return isinstance(x, list) and all(isinstance(v, int) for v in x)


# === NSP / SOP instances ===


def _truncated_lengths(len_a, len_b, max_tokens):
    """Final lengths after BERT's `truncate_seq_pair` (trim the longer one; on a tie, B)."""
    total = len_a + len_b
    trims = tf.maximum(total - max_tokens, 0)
    longer = tf.maximum(len_a, len_b)
    shorter = tf.minimum(len_a, len_b)
    # Case 1: only the longer segment is trimmed.
    only_longer = longer - trims >= shorter
    # Case 2: both reach the shorter's length, then B, A, B, A, ... lose one token each.
    rest = trims - (longer - shorter)
    fa_both = shorter - rest // 2
    fb_both = shorter - (rest + 1) // 2
    a_is_longer = len_a > len_b
    fa = tf.where(only_longer, tf.where(a_is_longer, len_a - trims, len_a), fa_both)
    fb = tf.where(only_longer, tf.where(a_is_longer, len_b, len_b - trims), fb_both)
    return fa, fb


def _chunk_end(cum, start, num, target):
    """Index of the last sentence of a chunk starting at `start`, vectorized over rows.

    cum: [R, S+1] tokens before each sentence; start, num, target: [R]. The chunk grows one sentence
    at a time until it holds >= target tokens or the document ends.
    """
    s_max = tf.shape(cum)[1] - 1
    j = tf.range(s_max)[tf.newaxis]  # (1, S)
    before = tf.gather(cum, start[:, None], batch_dims=1)  # (R, 1)
    run = cum[:, 1:] - before  # tokens in sentences [start, j]
    reach = (j >= start[:, None]) & (j < num[:, None]) & (run >= target[:, None])
    first = tf.cast(tf.argmax(tf.cast(reach, tf.int32), axis=1), tf.int32)
    return tf.where(tf.reduce_any(reach, axis=1), first, num - 1)


def _randint(seed, low, high):
    """Uniform ints in [low, high] (inclusive, per element; requires high >= low)."""
    u = tf.random.stateless_uniform(tf.shape(low), seed=seed)
    span = tf.cast(high - low + 1, tf.float32)
    return low + tf.minimum(tf.cast(tf.floor(u * span), tf.int32), high - low)


def create_pair_instances(
    documents,
    *,
    objective="nsp",
    sequence_length=128,
    short_seq_prob=0.1,
    seed=0,
    single_sentence=None,
    return_details=False,
):
    """Sentence-pair instances of a batch of documents (BERT NSP / ALBERT SOP), stateless.

    The engine of `NextSentencePairer` and `SentenceOrderPairer`; see their docstrings for the
    algorithm. `seed` is a stateless seed (int or [2] ints): the same seed and input give the same
    instances.

    Args:
        documents: ragged token ids `[B, (S), (W)]`.
        objective: `"nsp"` or `"sop"`.
        sequence_length, short_seq_prob: as in the layers.
        seed: stateless seed.
        single_sentence: what a one-sentence chunk gives: `"random_document"` (an instance whose B
            comes from another document, label 1: the original, NSP's default) or `"skip"` (no
            instance: SOP's default). `None` picks the objective's default.
        return_details: also return a dict describing every instance: `document_index`
            (document of A), `b_document_index`, token offsets into the document's concatenated
            tokens `a_start, a_end, b_start, b_end` (after truncation), `target_length` (the
            document's target), `chunk_start`, `chunk_end` (sentence indices, inclusive end) and
            `num_a_sentences`.

    Returns: `(segment_a, segment_b, labels)`, ragged `[N, (T)]` x2 and int32 `[N]`, instances in
        document order; plus the details dict if asked.
    """
    if objective not in ("nsp", "sop"):
        raise ValueError(f"`objective` must be 'nsp' or 'sop'. Received: {objective!r}")
    if single_sentence is None:
        single_sentence = "random_document" if objective == "nsp" else "skip"
    if single_sentence not in ("skip", "random_document"):
        raise ValueError(
            f"`single_sentence` must be 'skip' or 'random_document'. Received: {single_sentence!r}"
        )
    if sequence_length < 5:
        raise ValueError(f"`sequence_length` must be >= 5 (3 special tokens). Got {sequence_length}")
    documents = _check_documents(documents)
    seed = _stateless_seed(seed)
    out = _pair_instances(
        documents, seed, objective, int(sequence_length), float(short_seq_prob), single_sentence
    )
    segment_a, segment_b, labels, details = out
    if return_details:
        return segment_a, segment_b, labels, details
    return segment_a, segment_b, labels


@tf.function(reduce_retracing=True, autograph=False)
def _pair_instances(documents, seed, objective, sequence_length, short_seq_prob, single_sentence):
    """The graph of `create_pair_instances` (a tf.function, so eager calls run fast too)."""
    max_tokens = sequence_length - 3

    sent_lens = tf.cast(documents.row_lengths(axis=2), tf.int32)  # (B, (S))
    num = tf.cast(sent_lens.row_lengths(), tf.int32)  # (B,)
    dense_lens = sent_lens.to_tensor(0)  # (B, S)
    cum = tf.pad(tf.cumsum(dense_lens, axis=1), [[0, 0], [1, 0]])  # (B, S+1)
    batch = tf.shape(num)[0]

    # Target length: once per document, as in the original.
    short = tf.random.stateless_uniform([batch], seed=_sub_seed(seed, -1, 0)) < short_seq_prob
    target = tf.where(
        short,
        _randint(_sub_seed(seed, -1, 1), tf.fill([batch], 2), tf.fill([batch], max_tokens)),
        max_tokens,
    )

    # Other non-empty documents of the batch, for "random next" B segments.
    valid = num > 0
    valid_idx = tf.cast(tf.where(valid)[:, 0], tf.int32)  # (V,)
    num_valid = tf.shape(valid_idx)[0]
    rank_in_valid = tf.cumsum(tf.cast(valid, tf.int32), exclusive=True)  # (B,)
    rows = tf.range(batch)

    fields = (
        "emit", "label", "b_doc", "a0", "a1", "b0", "b1", "chunk_start", "chunk_end", "num_a",
    )

    def body(step, pos_in, arrays):
        active = pos_in < num
        pos = tf.where(active, pos_in, 0)  # finished rows compute a dummy instance, not emitted
        end = _chunk_end(cum, pos, num, target)
        chunk_len = end - pos + 1
        num_a = tf.where(
            chunk_len >= 2, _randint(_sub_seed(seed, step, 0), tf.ones_like(pos), chunk_len - 1), 1
        )
        coin = tf.random.stateless_uniform([batch], seed=_sub_seed(seed, step, 1)) < 0.5
        single = chunk_len == 1
        keep_single = single_sentence == "random_document"
        if objective == "nsp":
            use_random = (single & keep_single) | (coin & ~single)
            swap = tf.zeros_like(coin)
        else:
            use_random = single & keep_single
            swap = coin & ~single
        emit = active if keep_single else active & ~single

        # A = first num_a sentences of the chunk; "next" B = the rest.
        a0 = tf.gather(cum, pos[:, None], batch_dims=1)[:, 0]
        a1 = tf.gather(cum, (pos + num_a)[:, None], batch_dims=1)[:, 0]
        rest1 = tf.gather(cum, (end + 1)[:, None], batch_dims=1)[:, 0]

        # Random B: another non-empty document of the batch, from a random sentence, filled up to
        # target - len(A) tokens (at least one sentence). With no other document: this one.
        others = num_valid - 1
        r = tf.cast(
            tf.floor(
                tf.random.stateless_uniform([batch], seed=_sub_seed(seed, step, 2))
                * tf.cast(tf.maximum(others, 1), tf.float32)
            ),
            tf.int32,
        )
        r = tf.minimum(r, tf.maximum(others - 1, 0))
        r = r + tf.cast(r >= rank_in_valid, tf.int32)
        other = tf.gather(valid_idx, tf.clip_by_value(r, 0, tf.maximum(num_valid - 1, 0)))
        other = tf.where(others > 0, other, rows)
        other_num = tf.gather(num, other)
        other_cum = tf.gather(cum, other)
        r_start = _randint(_sub_seed(seed, step, 3), tf.zeros_like(pos), tf.maximum(other_num - 1, 0))
        r_end = _chunk_end(other_cum, r_start, other_num, target - (a1 - a0))
        rb0 = tf.gather(other_cum, r_start[:, None], batch_dims=1)[:, 0]
        rb1 = tf.gather(other_cum, (r_end + 1)[:, None], batch_dims=1)[:, 0]

        b_doc = tf.where(use_random, other, rows)
        b0 = tf.where(use_random, rb0, a1)
        b1 = tf.where(use_random, rb1, rest1)
        a_doc_swap = swap  # SOP swap: A <- rest of the chunk, B <- first part
        a0, a1, b0, b1 = (
            tf.where(a_doc_swap, b0, a0),
            tf.where(a_doc_swap, b1, a1),
            tf.where(a_doc_swap, a0, b0),
            tf.where(a_doc_swap, a1, b1),
        )
        label = tf.cast(use_random | swap, tf.int32)

        # truncate_seq_pair: final lengths are deterministic; each removed token comes from the
        # front or the back with p=0.5, so the front count is Binomial(removed, 0.5).
        len_a, len_b = a1 - a0, b1 - b0
        fa, fb = _truncated_lengths(len_a, len_b, max_tokens)
        cut_a, cut_b = len_a - fa, len_b - fb
        front_a = tf.random.stateless_binomial(
            [batch], _sub_seed(seed, step, 4), tf.cast(cut_a, tf.float32), 0.5, tf.int32
        )
        front_b = tf.random.stateless_binomial(
            [batch], _sub_seed(seed, step, 5), tf.cast(cut_b, tf.float32), 0.5, tf.int32
        )
        a0, a1 = a0 + front_a, a1 - (cut_a - front_a)
        b0, b1 = b0 + front_b, b1 - (cut_b - front_b)

        # Random B: the chunk's unused sentences go back to the stream.
        new_pos = tf.where(use_random, pos + num_a, end + 1)
        new_pos = tf.ensure_shape(tf.where(active, new_pos, pos_in), pos_in.shape)
        values = (emit, label, b_doc, a0, a1, b0, b1, pos, end, num_a)
        arrays = tuple(ta.write(step, tf.cast(v, ta.dtype)) for ta, v in zip(arrays, values))
        return step + 1, new_pos, arrays

    arrays = tuple(
        tf.TensorArray(tf.bool if f == "emit" else tf.int32, size=0, dynamic_size=True,
                       element_shape=tf.TensorShape([None]))
        for f in fields
    )
    _, _, arrays = tf.while_loop(
        lambda step, pos, arrays: tf.reduce_any(pos < num),
        body,
        (tf.constant(0), tf.zeros_like(num), arrays),
    )
    # (steps, B) -> (B, steps) so that each document's instances stay together and in order.
    stacked = {f: _stack_steps(ta, batch) for f, ta in zip(fields, arrays)}
    emit = stacked.pop("emit")
    doc = tf.reshape(tf.tile(rows[:, None], [1, tf.size(emit) // tf.maximum(batch, 1)]), [-1])
    out = {k: tf.boolean_mask(v, emit) for k, v in stacked.items()}
    a_doc = tf.boolean_mask(doc, emit)
    target_out = tf.gather(target, a_doc)
    tokens = merge_rows(documents)  # (B, (L)) each document's tokens
    segment_a = _gather_segments(tokens, a_doc, out["a0"], out["a1"])
    segment_b = _gather_segments(tokens, out["b_doc"], out["b0"], out["b1"])
    labels = out["label"]
    details = {
        "document_index": a_doc,
        "b_document_index": out["b_doc"],
        "a_start": out["a0"],
        "a_end": out["a1"],
        "b_start": out["b0"],
        "b_end": out["b1"],
        "target_length": target_out,
        "chunk_start": out["chunk_start"],
        "chunk_end": out["chunk_end"],
        "num_a_sentences": out["num_a"],
    }
    return segment_a, segment_b, labels, details


class _Pairer(_TFLayer, SeededStage):
    """What the pairers share: arguments, the call, config, and seeding (`SeededStage`, as the
    maskers of `masking.py`). A subclass names its `objective` and its defaults."""

    seed_salt = 0x5A1F

    objective = None  # "nsp" | "sop"

    def __init__(self, sequence_length, short_seq_prob, seed, single_sentence, **kwargs):
        super().__init__(**kwargs)
        if single_sentence not in ("skip", "random_document"):
            raise ValueError(
                f"`single_sentence` must be 'skip' or 'random_document'. Received: {single_sentence!r}"
            )
        if sequence_length < 5:
            raise ValueError(f"`sequence_length` must be >= 5. Received: {sequence_length}")
        self.sequence_length = int(sequence_length)
        self.short_seq_prob = float(short_seq_prob)
        self._init_seed(seed)
        self.single_sentence = single_sentence

    def call(self, documents, seed=None):
        return create_pair_instances(
            documents,
            objective=self.objective,
            sequence_length=self.sequence_length,
            short_seq_prob=self.short_seq_prob,
            seed=self._call_key(seed),
            single_sentence=self.single_sentence,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            short_seq_prob=self.short_seq_prob,
            seed=self.seed,
            single_sentence=self.single_sentence,
        )
        return config

    # Seeding: `SeededStage` (`_call_key`, `map_dataset`), as the maskers.


@keras.saving.register_keras_serializable(package="keras_bertfam")
class NextSentencePairer(_Pairer):
    """BERT's next-sentence-prediction instances (`create_instances_from_document`), vectorized.

    Devlin et al., 2018. For every document of the batch, independently:

    - `max_num_tokens = sequence_length - 3`; the document's target length is `max_num_tokens`, or
      with probability `short_seq_prob` `randint(2, max_num_tokens)` (drawn once per document, as in
      the original);
    - sentences accumulate into a chunk until it holds >= target tokens or the document ends;
    - A = the first `randint(1, len(chunk) - 1)` sentences of the chunk (1 if it has one sentence);
    - with p=0.5, or always when the chunk has one sentence, B is a "random next": label 1. B starts
      at a random sentence of another document and takes sentences until it holds
      `target - len(A)` tokens (at least one sentence) or that document ends; the chunk's unused
      sentences go back to the stream. Otherwise B is the rest of the chunk: label 0 (is next);
    - `truncate_seq_pair`: while `len(A) + len(B) > max_num_tokens`, the longer segment (B on a tie)
      loses one token, from its front or back with p=0.5.

    Deviation from the original: the "random" document is drawn uniformly from the *other non-empty
    documents of the same batch*, not from the whole corpus (shuffle the documents before batching).
    Fallback: when the batch has no other non-empty document (e.g. a batch of one), B is drawn from
    the same document, as the original does for a one-document corpus; such a B may then overlap A.

    Documented behaviours: empty sentences are ignored; empty documents produce no instance; a
    document with one sentence produces one random-next instance.

    Label balance: the forced random-next of one-sentence chunks (mostly a document's last sentence
    left alone, often after a random-next instance put sentences back) makes the original's labels
    lean towards "random": on the IMDB corpus at sequence_length 128 about 57% of instances are
    random-next (measured by `tests/test_packing.py`). `single_sentence="skip"` (an option, not the
    original) makes no instance of one-sentence chunks, so every label is a fair coin: 50%.

    Args:
        sequence_length: the packed length the instances must fit (`[CLS] A [SEP] B [SEP]`).
        short_seq_prob: probability of a shorter target length.
        seed: the layer seed (int; None draws one from NumPy's global generator, so
            `keras.utils.set_random_seed` makes it reproducible).
        single_sentence: `"random_document"` (the original: a one-sentence chunk always gets a
            random B, label 1) or `"skip"` (no instance from a one-sentence chunk; balanced labels).

    Call args:
        documents: `tf.RaggedTensor` of token ids `[B, (S sentences), (W tokens)]`.
        seed: optional call seed (int or static-length int vector such as `(epoch, index)`): the
            output is then a pure function of (layer seed, call seed, documents). Without it each
            call draws fresh randomness. `map_dataset(ds)` passes a per-element seed from
            `tf.data.Dataset.random(seed)`.

    Returns: `(segment_a, segment_b, labels)`: ragged `[N, (T)]`, ragged `[N, (T)]`, int32 `[N]`
        (1 = random next). N varies per batch: follow with `.unbatch().batch(...)` and a
        `SegmentPacker`.

    Example:
    >>> docs = tf.ragged.constant([[[1, 2, 3], [4, 5], [6, 7, 8]], [[9, 10], [11, 12]]], ragged_rank=2)
    >>> a, b, labels = NextSentencePairer(sequence_length=16, seed=1)(docs)
    """

    objective = "nsp"

    def __init__(
        self,
        sequence_length=128,
        short_seq_prob=0.1,
        seed=None,
        single_sentence="random_document",
        **kwargs,
    ):
        super().__init__(sequence_length, short_seq_prob, seed, single_sentence, **kwargs)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SentenceOrderPairer(_Pairer):
    """ALBERT's sentence-order-prediction instances, vectorized.

    Lan et al., 2019. Documents are cut into chunks exactly as in `NextSentencePairer` (target
    length, `randint(1, len(chunk) - 1)` split point, `truncate_seq_pair`). A is the first part of a
    chunk and B the rest, two consecutive segments of one document; with p=0.5 they are swapped
    (label 1 = swapped, 0 = in order).

    A chunk of one sentence cannot be split: `single_sentence="skip"` (default) makes no instance of
    it; `"random_document"` reproduces the original ALBERT code, which pairs it with a B from another
    document of the batch (label 1), as `NextSentencePairer` does (same batch-local draw and
    fallback).

    Args:
        sequence_length: the packed length (`[CLS] A [SEP] B [SEP]`).
        short_seq_prob: probability of a shorter target length (per document).
        seed: the layer seed (int; None draws one from NumPy's global generator).
        single_sentence: `"skip"` or `"random_document"`.

    Call args:
        documents: ragged token ids `[B, (S), (W)]`.
        seed: optional call seed, as in `NextSentencePairer`.

    Returns: `(segment_a, segment_b, labels)`: ragged `[N, (T)]` x2 and int32 `[N]`.

    Example:
    >>> docs = tf.ragged.constant([[[1, 2, 3], [4, 5], [6, 7, 8]]], ragged_rank=2)
    >>> a, b, labels = SentenceOrderPairer(sequence_length=16, seed=1)(docs)
    """

    objective = "sop"

    def __init__(
        self, sequence_length=512, short_seq_prob=0.1, seed=None, single_sentence="skip", **kwargs
    ):
        super().__init__(sequence_length, short_seq_prob, seed, single_sentence, **kwargs)


# === DocumentPacker ===


@tf.function(reduce_retracing=True, autograph=False)
def _greedy_blocks(unit_lens, num_units, capacity, is_sep=None):
    """Greedy packing of units into blocks of <= capacity tokens, every row at once.

    unit_lens: [R, U] int32 (each <= capacity); num_units: [R]. A block takes units while they fit.
    With `is_sep` ([R, U] bool), a separator unit at the start of a block is skipped.
    Returns (row, token_start, token_end) per block, row-major, in order.
    """
    # One padding column, so that gathers at a finished row's position stay in range.
    unit_lens = tf.pad(unit_lens, [[0, 0], [0, 1]])
    if is_sep is not None:
        is_sep = tf.pad(is_sep, [[0, 0], [0, 1]])
    cum = tf.pad(tf.cumsum(unit_lens, axis=1), [[0, 0], [1, 0]])  # (R, U+1)
    u_max = tf.shape(unit_lens)[1]
    j = tf.range(u_max)[tf.newaxis]
    rows = tf.shape(num_units)[0]

    def body(step, pos, ta_emit, ta_start, ta_end):
        if is_sep is not None:
            at_sep = tf.gather(is_sep, tf.minimum(pos, u_max - 1)[:, None], batch_dims=1)[:, 0]
            pos = tf.where((pos < num_units) & at_sep, pos + 1, pos)
        active = pos < num_units
        before = tf.gather(cum, pos[:, None], batch_dims=1)  # (R, 1)
        fits = (j >= pos[:, None]) & (j < num_units[:, None]) & (cum[:, 1:] - before <= capacity)
        count = tf.reduce_sum(tf.cast(fits, tf.int32), axis=1)
        end = pos + count
        t0 = before[:, 0]
        t1 = tf.gather(cum, end[:, None], batch_dims=1)[:, 0]
        return (
            step + 1,
            tf.ensure_shape(tf.where(active, end, pos), pos.shape),
            ta_emit.write(step, active),
            ta_start.write(step, t0),
            ta_end.write(step, t1),
        )

    def skip_seps(pos):
        if is_sep is None:
            return pos
        at_sep = tf.gather(is_sep, tf.minimum(pos, u_max - 1)[:, None], batch_dims=1)[:, 0]
        return tf.where((pos < num_units) & at_sep, pos + 1, pos)

    tas = [
        tf.TensorArray(dt, size=0, dynamic_size=True, element_shape=tf.TensorShape([None]))
        for dt in (tf.bool, tf.int32, tf.int32)
    ]
    _, _, ta_emit, ta_start, ta_end = tf.while_loop(
        lambda step, pos, *_: tf.reduce_any(skip_seps(pos) < num_units),
        body,
        (tf.constant(0), tf.zeros_like(num_units), *tas),
    )
    emit = _stack_steps(ta_emit, rows)
    starts = tf.boolean_mask(_stack_steps(ta_start, rows), emit)
    ends = tf.boolean_mask(_stack_steps(ta_end, rows), emit)
    steps = tf.size(emit) // tf.maximum(rows, 1)
    row = tf.boolean_mask(tf.reshape(tf.tile(tf.range(rows)[:, None], [1, steps]), [-1]), emit)
    return row, starts, ends


@keras.saving.register_keras_serializable(package="keras_bertfam")
class DocumentPacker(_TFLayer):
    """RoBERTa's FULL-SENTENCES and DOC-SENTENCES input blocks, and plain token blocks.

    Liu et al., 2019. Each block holds up to `sequence_length` tokens including `start_value` and
    `end_value`, i.e. `capacity = sequence_length - (number of start/end tokens)` content tokens.

    - `"full_sentences"`: the sentences of all documents of the batch form one stream, with a
      `separator_value` token between consecutive documents; blocks take whole sentences greedily
      while they fit, so a block is full (the next sentence would not fit) except the batch's last.
      Blocks cross document boundaries but not batch boundaries; a separator that would start a
      block is dropped (the block boundary already separates).
    - `"doc_sentences"`: the same greedy packing within each document only: blocks never cross a
      document, and a document's last block may be short (fewer blocks per batch).
    - `"token_blocks"`: the same stream as `"full_sentences"` cut every `capacity` tokens, whether
      or not a sentence ends there (fairseq's `--sample-break-mode none`, the blocks of HF's
      `run_mlm.py` without `--line_by_line`): every block but the batch's last is full, so no
      step computes on padding; a sentence may start in one block and end in the next.

    A sentence longer than `capacity` is split into pieces of `capacity` tokens (the last piece
    shorter), each packed like a sentence; nothing is dropped. Empty sentences and documents are
    ignored.

    Args:
        sequence_length: block length including start/end tokens.
        mode: `"full_sentences"`, `"doc_sentences"` or `"token_blocks"`.
        start_value, end_value: int ids (or None) added around each block (`<s>`, `</s>`).
        separator_value: int id between documents in `"full_sentences"` and `"token_blocks"` (or
            None for none).
        pad_value: None to return ragged blocks; an int to return dense padded blocks.

    Call args:
        documents: ragged token ids `[B, (S), (W)]`.

    Returns: ragged `[N, (T)]` token ids with `T <= sequence_length` (`pad_value=None`), or
        `{"token_ids": [N, sequence_length], "padding_mask": [N, sequence_length] bool}`.

    Example:
    >>> docs = tf.ragged.constant([[[5, 6, 7], [8, 9]], [[10, 11]]], ragged_rank=2)
    >>> DocumentPacker(7, start_value=0, end_value=2, separator_value=2)(docs).to_list()
    [[0, 5, 6, 7, 8, 9, 2], [0, 10, 11, 2]]
    >>> DocumentPacker(6, "token_blocks", 0, 2, separator_value=2)(docs).to_list()
    [[0, 5, 6, 7, 8, 2], [0, 9, 2, 10, 11, 2]]
    """

    MODES = ("full_sentences", "doc_sentences", "token_blocks")

    def __init__(
        self,
        sequence_length,
        mode="full_sentences",
        start_value=None,
        end_value=None,
        separator_value=None,
        pad_value=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(f"`mode` must be one of {self.MODES}. Received: {mode!r}")
        self.sequence_length = int(sequence_length)
        self.mode = mode
        self.start_value = _plain_ids(start_value, "start_value")
        self.end_value = _plain_ids(end_value, "end_value")
        self.separator_value = _one_id(separator_value, "separator_value")
        self.pad_value = _one_id(pad_value, "pad_value")
        self._start = _as_list(self.start_value)
        self._end = _as_list(self.end_value)
        self.capacity = self.sequence_length - len(self._start) - len(self._end)
        if self.capacity < 1:
            raise ValueError(f"sequence_length={sequence_length} leaves no room for content tokens.")

    # === Call ===

    def call(self, documents):
        documents = _check_documents(documents)
        dtype = documents.dtype
        if self.mode == "token_blocks":
            blocks = self._token_blocks(merge_rows(documents))
        else:
            blocks = self._sentence_blocks(documents)
        n = blocks.nrows()
        parts = []
        if self._start:
            parts.append(tf.RaggedTensor.from_tensor(
                tf.tile(tf.constant(self._start, dtype)[tf.newaxis], tf.stack([n, 1]))))
        parts.append(blocks)
        if self._end:
            parts.append(tf.RaggedTensor.from_tensor(
                tf.tile(tf.constant(self._end, dtype)[tf.newaxis], tf.stack([n, 1]))))
        blocks = tf.concat(parts, axis=1) if len(parts) > 1 else blocks
        if self.pad_value is None:
            return blocks
        shape = [None, self.sequence_length]
        return {
            "token_ids": blocks.to_tensor(tf.cast(self.pad_value, dtype), shape=shape),
            "padding_mask": tf.ones_like(blocks, tf.bool).to_tensor(False, shape=shape),
        }

    def _token_blocks(self, tokens):
        """[B, (L)] documents -> their stream (separators between documents) cut every `capacity`
        tokens."""
        if self.separator_value is not None:
            one = tf.cast(tokens.row_lengths() > 0, tf.int64)  # a separator after each document
            separators = tf.fill([tf.reduce_sum(one)], tf.cast(self.separator_value, tokens.dtype))
            separators = tf.RaggedTensor.from_row_lengths(separators, one)
            tokens = tf.concat([tokens, separators], axis=1)
        stream = tokens.flat_values
        size = tf.size(stream)
        if self.separator_value is not None:  # none after the last document
            stream = stream[: tf.maximum(size - 1, 0)]
            size = tf.size(stream)
        starts = tf.range(0, size, self.capacity)
        lengths = tf.cast(tf.minimum(self.capacity, size - starts), tf.int64)
        return tf.RaggedTensor.from_row_lengths(stream, lengths)

    def _sentence_blocks(self, documents):
        """FULL-/DOC-SENTENCES: whole sentences (split when longer than `capacity`) packed greedily."""
        dtype = documents.dtype
        cap = self.capacity
        sent_lens = tf.cast(documents.row_lengths(axis=2), tf.int32)  # (B, (S))
        # Split long sentences into pieces of <= capacity tokens: units (B, (U)).
        pieces = (sent_lens + cap - 1) // cap  # (B, (S))
        piece_idx = tf.ragged.range(pieces.flat_values)  # (sum S, (P))
        piece_lens = tf.minimum(cap, sent_lens.flat_values[:, None] - piece_idx * cap)
        units_per_doc = tf.reduce_sum(pieces, axis=1)  # (B,)
        unit_lens = tf.RaggedTensor.from_row_lengths(
            piece_lens.flat_values, tf.cast(units_per_doc, tf.int64)
        )
        tokens = merge_rows(documents)  # (B, (L))
        if self.mode == "doc_sentences":
            row, t0, t1 = _greedy_blocks(unit_lens.to_tensor(0), units_per_doc, cap)
            blocks = _gather_segments(tokens, row, t0, t1)
        else:
            nonempty = units_per_doc > 0
            is_sep = tf.zeros_like(unit_lens, tf.bool)
            if self.separator_value is not None:
                one = tf.cast(nonempty, tf.int64)
                sep_units = tf.RaggedTensor.from_row_lengths(tf.ones([tf.reduce_sum(one)], tf.int32), one)
                unit_lens = tf.concat([unit_lens, sep_units], axis=1)
                is_sep = tf.concat([is_sep, tf.ones_like(sep_units, tf.bool)], axis=1)
                sep_tokens = tf.RaggedTensor.from_row_lengths(
                    tf.fill([tf.reduce_sum(one)], tf.cast(self.separator_value, dtype)), one
                )
                tokens = tf.concat([tokens, sep_tokens], axis=1)
            stream_lens = unit_lens.flat_values[tf.newaxis]  # (1, U)
            stream_sep = is_sep.flat_values[tf.newaxis]
            stream_tokens = tf.RaggedTensor.from_tensor(tokens.flat_values[tf.newaxis])
            num_units = tf.shape(stream_lens)[1]
            if self.separator_value is not None:  # no separator after the last document
                num_units = tf.maximum(num_units - 1, 0)
            row, t0, t1 = _greedy_blocks(stream_lens, num_units[tf.newaxis], cap, stream_sep)
            blocks = _gather_segments(stream_tokens, row, t0, t1)
        return blocks

    # === Config ===

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            mode=self.mode,
            start_value=self.start_value,
            end_value=self.end_value,
            separator_value=self.separator_value,
            pad_value=self.pad_value,
        )
        return config
