"""The one masking engine of keras_bertfam, and its four strategies.

Every masker runs the same pipeline, written once in `_Masker`:

    candidate units  ->  non-overlapping greedy selection within a budget  ->
    80/10/10 replacement  ->  gather of (sorted) positions

A strategy only says how it forms candidates:

* `TokenMasker`      (BERT / RoBERTa)   every selectable token is a unit.
* `WholeWordMasker`  (BERT wwm)         every word (a start piece + its continuation pieces).
* `NgramMasker`      (ALBERT)           every word start, with a sampled n-gram length in words.
* `SpanMasker`       (SpanBERT)         a sampled span length in words and an anchor word.

All code is TensorFlow ops, vectorized over the batch (no per-example or per-token Python, no
`tf.py_function`), so the maskers run inside `tf.data` whatever the Keras backend is. The only
loops are `tf.while_loop`s whose every step handles all rows at once: the greedy selection's walk
over the visited candidates (see `_greedy_select`), SpanMasker's span rounds and the lexicon
maskers' leftmost-longest rounds. Those loops and the small ops around them run as XLA functions
(`jit_compile=True`, compiled once per input shape): TF's executor pays a per-op cost that
dominates ops on [128, 128] tensors; the random draws stay TF ops. The XLA functions are
module-level and take a masker's settings that are *data* as tensors (the rates, the mask token
id, the unselectable ids, the n-gram and span length distributions; made once by the masker),
and only its *structure* as Python arguments (`mask_selection_length`, `rounding`, the longest
n-gram or span, ...): maskers that differ in data only (ERNIE's schedule, a rate sweep) share one
trace and one compilation per input shape.

Seeding (all maskers)
---------------------
All random ops are *stateless* (`tf.random.stateless_*`). The key of one call is derived from
`(seed, call_seed)` with `stateless_fold_in`:

* `masker(token_ids, seed=s)` -- explicit per-call seed `s` (an int or int tensor, scalar or a
  vector of ints, e.g. `(epoch, index)`): the mask is a pure function of `(masker seed, s, input)`.
  This is fairseq's seed-per-(seed, epoch, index) scheme; it is what makes masks reproducible under
  `Dataset.map(..., num_parallel_calls=AUTOTUNE)`, where calls run in any order.
* `masker(token_ids)` -- uses an internal call counter (a `tf.Variable`): call number k uses the
  key `fold_in((seed, 0x5EED), k)`. Masks differ from call to call and the sequence repeats exactly for the same seed when
  calls run in order (eager code, or a `map` without parallel calls). With parallel calls the *set*
  of masks is the same but which element gets which mask depends on scheduling.
* `masker.map_dataset(ds)` -- the recommended tf.data entry point: zips `ds` with
  `tf.data.Dataset.random(seed, rerandomize_each_iteration=True)` and passes that element's draw as
  `s`. Masks are fresh every epoch (RoBERTa's dynamic masking), reproducible for the same masker
  seed, and independent of `num_parallel_calls` and scheduling.

`seed=None` at construction draws the masker seed from NumPy's global generator (so
`keras.utils.set_random_seed` makes it reproducible too). The draws have the shape of the padded
batch, so a row's mask depends on the key, its batch and the padded width: a ragged batch and
its dense version padded to the longest row give identical results.

Exactness in one line per strategy (details in each class): TokenMasker and WholeWordMasker and
NgramMasker make *the same decisions as the original sequential loops* for the same visiting
order and draws (tested against NumPy transcriptions); the visiting order is a uniformly random
permutation from 24-bit random keys with ties (probability ~T**2 / 2**25 per row) broken by
position. SpanMasker keeps spans disjoint and whole-word, which the original does not (see its
docstring).
"""
import functools
import numbers
import os

import keras
import numpy as np
import tensorflow as tf

from keras_bertfam.preprocessing.seeding import SeededStage
from keras_bertfam.user_warnings import warn

__all__ = [
    "TokenMasker",
    "WholeWordMasker",
    "NgramMasker",
    "SpanMasker",
    "PhraseMasker",
    "EntityMasker",
    "MaskingSchedule",
    "span_boundaries",
    "word_continuation_table",
    "load_vocabulary",
]

_MASK_TOKEN_NAMES = ("[MASK]", "<mask>", "[mask]", "<MASK>")
_INT32_MAX = 2**31 - 1
_GREEDY_FIRST_CANDIDATES = 32  # candidates per row in the greedy selection's first walk
_ID_SET_SIZE = 8  # id sets go to the XLA functions padded to a multiple of this (one shape)


# === Vocabulary helpers ===


def load_vocabulary(vocabulary):
    """A list of token strings from a list/tuple, or from a vocabulary file (one token a line).

    SentencePiece `.vocab` files (`piece<TAB>score`) are accepted: the first column is the piece.
    """
    if isinstance(vocabulary, (str, os.PathLike)):
        path = os.fspath(vocabulary)
        if not os.path.isfile(path):
            raise ValueError(f"Vocabulary file not found: {path!r}")
        with open(path, encoding="utf-8") as f:
            tokens = [line.rstrip("\n").rstrip("\r") for line in f]
        if tokens and tokens[-1] == "":
            tokens.pop()
        return [t.split("\t")[0] if "\t" in t else t for t in tokens]
    if isinstance(vocabulary, dict):  # token -> id
        tokens = [None] * len(vocabulary)
        for token, index in vocabulary.items():
            tokens[int(index)] = token
        return tokens
    return [str(t) for t in vocabulary]


def _looks_special(token):
    return len(token) >= 3 and (
        (token[0] == "[" and token[-1] == "]") or (token[0] == "<" and token[-1] == ">")
    )


def word_continuation_table(vocabulary, style="wordpiece"):
    """A boolean `[V]` table: True where the piece *continues* the previous piece's word.

    Args:
        vocabulary: list of token strings, or a path to a vocabulary file.
        style: `"wordpiece"` (BERT: a `##` prefix continues), `"sentencepiece"` (ALBERT: pieces
            that do not start with `▁` continue, except special tokens such as `[CLS]`, `<pad>`),
            or `"bpe"` (RoBERTa byte-level BPE: pieces that do not start with `Ġ` continue, except
            special tokens such as `<s>`).

    Special tokens are never continuations here, and the maskers never put an unselectable token
    in a word whatever this table says.
    """
    tokens = load_vocabulary(vocabulary)
    if style == "wordpiece":
        table = [t.startswith("##") and len(t) > 2 for t in tokens]
    elif style == "sentencepiece":
        table = [not (t.startswith("\u2581") or _looks_special(t)) for t in tokens]
    elif style == "bpe":
        table = [not (t.startswith("\u0120") or _looks_special(t)) for t in tokens]
    else:
        raise ValueError(
            f"word_style must be 'wordpiece', 'sentencepiece' or 'bpe'; got {style!r}"
        )
    return np.asarray(table, dtype=bool)


# === Small TF helpers ===


def _split_seeds(key, num):
    """`num` independent stateless seeds (each shape [2]) from one key."""
    seeds = tf.random.experimental.stateless_split(key, num=num)
    return [seeds[i] for i in range(num)]


def _triangular(n, exclusive=False):
    """[n, n] float32 0/1 matrix m with m[j, i] = 1 iff j <= i (j < i when exclusive)."""
    ones = tf.ones([n, n], tf.float32)
    tri = tf.linalg.band_part(ones, 0, -1)
    return tri - tf.linalg.band_part(ones, 0, 0) if exclusive else tri


def _cumsum(x, exclusive=False, tri=None):
    """Cumulative sum of a [B, N] bool/int tensor along axis 1, as int32.

    A matmul with a triangular 0/1 matrix (pass `tri` to reuse one inside a loop): several times
    faster than `tf.cumsum` for our small rows on CPU, and exact (float32 holds integers up to
    2**24).
    """
    if tri is None:
        tri = _triangular(tf.shape(x)[1], exclusive)
    return tf.cast(tf.matmul(tf.cast(x, tf.float32), tri), tf.int32)


def _flat_index(index, width):
    """Row-major flat indices of index [B, ...] into a [B, width] tensor (for `_gather_flat`)."""
    B = tf.shape(index)[0]
    rank = index.shape.rank
    if rank is not None:  # static rank (always, here): no shape arithmetic in the graph
        return index + tf.reshape(tf.range(B) * width, [-1] + [1] * (rank - 1))
    shape = tf.concat([[B], tf.ones([tf.rank(index) - 1], tf.int32)], axis=0)
    return index + tf.reshape(tf.range(B) * width, shape)


def _gather_flat(x, flat_index):
    """x[b, index[b, ...]] given `_flat_index(index, x.shape[1])`: one reshape and one gather."""
    return tf.gather(tf.reshape(x, [-1]), flat_index)


def _take(x, index):
    """x[b, index[b, ...]] for x [B, N]: one flat gather (faster than batch_dims=1)."""
    return _gather_flat(x, _flat_index(index, tf.shape(x)[1]))


def _shift_left(x, d, fill):
    """out[:, w] = x[:, w + d] (fill past the end). d is a Python int >= 0."""
    if d == 0:
        return x
    # A pad with static paddings: no batch-size-dependent fill tensor to build (inside a loop
    # body that is several kernels per shift and per round).
    # Pad, then slice: the width stays x's even when d exceeds it.
    return tf.pad(x, [[0, 0], [0, d]], constant_values=tf.cast(fill, x.dtype))[:, d:]


def _shift_right(x, d, fill):
    """out[:, w] = x[:, w - d] (fill before the start). d is a Python int >= 0."""
    if d == 0:
        return x
    width = x.shape[1] if x.shape[1] is not None else tf.shape(x)[1]
    return tf.pad(x, [[0, 0], [d, 0]], constant_values=tf.cast(fill, x.dtype))[:, :width]


def _compact(flags, values, width, fill=0):
    """Values at the True flags of each row, in order, packed into [B, width] (fill after).

    Returns (packed [B, width], count [B]). Rows with more than `width` flags keep the first.
    """
    B = tf.shape(flags)[0]
    rank = _cumsum(flags) - 1  # (B, N): slot of each flagged entry
    keep = flags & (rank < width)
    seg = tf.where(keep, tf.range(B)[:, tf.newaxis] * width + rank, B * width)
    packed = tf.math.unsorted_segment_sum(
        tf.reshape(tf.where(keep, values - fill, 0), [-1]),
        tf.reshape(seg, [-1]),
        num_segments=B * width + 1,
    )[: B * width]
    packed = tf.reshape(packed, [B, width]) + fill
    count = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    return packed, count


def _id_set(ids, fill=None):
    """The int ids `ids` as a 1-D int32 tensor, ascending, padded to a multiple of
    `_ID_SET_SIZE` entries with `fill` (None: the first id again), so that the id sets of
    different maskers have one shape in the XLA functions. Empty stays empty."""
    ids = sorted(set(int(i) for i in ids))
    if ids:
        ids += [ids[0] if fill is None else fill] * (-len(ids) % _ID_SET_SIZE)
    return tf.constant(ids, tf.int32, shape=[len(ids)])


def _cdf_of(probs):
    """The thresholds of `_categorical_from` for `probs`: a [len(probs) - 1] float32 tensor
    (the float64 CDF, rounded to float32 as a compare with a float32 draw rounds it)."""
    cdf = np.cumsum(probs) / np.sum(probs)
    return tf.constant(cdf[:-1].astype(np.float32), tf.float32, shape=[len(cdf) - 1])


def _sample_categorical(seed, cdf, shape):
    """Values 1..len(cdf) + 1 drawn with the CDF `cdf` (`_cdf_of`): inverse CDF with
    elementwise compares."""
    return _categorical_from(tf.random.stateless_uniform(shape, seed, dtype=tf.float32), cdf)


def _categorical_from(u, cdf):
    """`_sample_categorical` from its uniform draw `u` (no random op: XLA functions take it)."""
    n = tf.ones_like(u, tf.int32)
    for i in range(cdf.shape[0]):
        n += tf.cast(u >= cdf[i], tf.int32)
    return n


def _random_order_keys(seed, valid, priority=None):
    """Distinct int32 keys giving a uniformly random order of the valid entries of each row.

    24 random bits then the column (ties of the 24 random bits -- probability ~N**2 / 2**25 per
    row -- are broken by position). Invalid entries get INT32_MAX. With `priority` ([B, N] bool)
    the prioritized entries come first (each group in uniformly random order; 23 random bits).
    """
    bits = _order_bits(seed, tf.shape(valid), priority is not None)
    return _order_keys(bits, valid, priority)


def _order_bits(seed, shape, priority):
    """The random draw of `_random_order_keys` (23 bits with a priority, else 24)."""
    return tf.random.stateless_uniform(
        shape, seed, minval=0, maxval=(1 << (23 if priority else 24)) - 1, dtype=tf.int32)


def _order_keys(bits, valid, priority=None):
    """`_random_order_keys` from its random draw (no random op: XLA functions take it)."""
    N = tf.shape(valid)[1]
    key = bits * 128 + tf.range(N) % 128
    if priority is not None:
        key = key + tf.where(priority, 0, 1 << 30)
    return tf.where(valid, key, _INT32_MAX)


def _selectable_of(ids, valid, unselectable):
    """[B, T] bool: valid tokens whose id is not in `unselectable`: a tuple of ints, or (inside
    the XLA functions) an `_id_set`. A compare per id (static unrolled compares)."""
    special = tf.zeros_like(valid)
    for i in (unselectable if isinstance(unselectable, tuple) else
              [unselectable[j] for j in range(unselectable.shape[0])]):
        special = special | tf.equal(ids, i)
    return valid & ~special


def _budget_of(valid, selectable, u, rate, rounding, limit, count_special_tokens):
    """Number of tokens to predict per row, [B] int32 (`_Masker._budget`; `u` its draw, `rate`
    a float64 scalar tensor; `rounding`, `limit` and `count_special_tokens` are Python)."""
    counted = valid if count_special_tokens else selectable
    n = tf.reduce_sum(tf.cast(counted, tf.float64), axis=1)
    x = n * rate
    if rounding == "round":  # Python 3 round(): half to even, like tf.round
        num = tf.maximum(tf.round(x), 1.0)
    elif rounding == "ceil":
        num = tf.math.ceil(x)
    else:  # fairseq: int(rate * n + U(0, 1))
        num = tf.floor(x + u)
    num = tf.minimum(num, float(limit))
    num = tf.where(n > 0, num, 0.0)
    return tf.cast(num, tf.int32)


def _positions_of(selected, P):
    """[B, T] bool -> ascending positions [B, P] int32 (zero padded), weights [B, P]."""
    T = tf.shape(selected)[1]
    t = tf.broadcast_to(tf.range(T)[tf.newaxis, :], tf.shape(selected))
    positions, count = _compact(selected, t, P)
    weights = tf.range(P)[tf.newaxis, :] < count[:, tf.newaxis]
    positions = tf.ensure_shape(positions, [None, P])
    weights = tf.ensure_shape(tf.cast(weights, tf.float32), [None, P])
    return positions, weights


def _pool_ids(index, skipped):
    """The `index`-th ids ([B, P] int32) of the random tokens' pool, the vocabulary without the
    ids `skipped` (an `_id_set` padded with INT32_MAX): each skipped id at or below the id so far
    moves it up by one, in ascending order. No pool of the vocabulary's size to gather from (its
    size would be an XLA function's shape)."""
    for i in range(skipped.shape[0]):
        index += tf.cast(skipped[i] <= index, tf.int32)
    return index


def _replace_at(ids, positions, weights, unit_u, random_ids, skipped, mask_token_id,
                thresholds):
    """`_Masker._replace` after its random draw: 80/10/10 at the positions. One XLA function
    (`_replace_xla`; its gather and scatter are small: faster than TF's ops, measured on the
    benchmark's batches). `random_ids` are indices into the pool (`_pool_ids`) unless `skipped`
    is None; `mask_token_id` an int32 scalar tensor and `thresholds` [2] float32 (the mask token
    rate, and that plus the random token rate): tensors, so that maskers share its
    compilations whatever their settings."""
    B = tf.shape(ids)[0]
    T = tf.shape(ids)[1]
    if skipped is not None:
        random_ids = _pool_ids(random_ids, skipped)
    real = weights > 0
    mask_ids = tf.where(real, _take(ids, positions), 0)
    new = tf.where(
        unit_u < thresholds[0],
        mask_token_id,
        tf.where(unit_u < thresholds[1], random_ids, mask_ids),
    )
    # Scatter into [B, T + 1]; padding entries go to the dummy last column.
    cols = tf.where(real, positions, T)
    rows = tf.broadcast_to(tf.range(B)[:, tf.newaxis], tf.shape(positions))
    index = tf.stack([rows, cols], axis=-1)  # (B, P, 2)
    padded = tf.pad(ids, [[0, 0], [0, 1]])
    masked = tf.tensor_scatter_nd_update(padded, index, new)[:, :T]
    return masked, mask_ids


_replace_xla = tf.function(_replace_at, jit_compile=True, autograph=False)


def _word_starts_of(ids, selectable, continuation):
    """[B, T] bool: selectable tokens that start a word (`continuation`: the [V] table of
    `word_continuation_table`, or None: every token is a word)."""
    if continuation is None:
        return selectable
    cont = tf.gather(continuation, ids)
    prev_sel = _shift_right(selectable, 1, False)
    return selectable & ~(cont & prev_sel)


def _words_of(ids, selectable, start):
    """Word structure of each row, in *word space* (words numbered 0.. in order), from the
    word starts `start` [B, T]. Returns `word` [B, T] (word index of each token, -1 if
    unselectable), `num_words` [B] and `ctok` [B, T + 1]: pieces before word w, so that the
    pieces of words w..w+n-1 are ctok[w+n] - ctok[w] (ctok[w] = total for w >= num_words).
    """
    B = tf.shape(ids)[0]
    T = tf.shape(ids)[1]
    both = _cumsum(tf.concat([start, selectable], axis=0))  # (2B, T)
    word = tf.where(selectable, both[:B] - 1, -1)
    sel_before = both[B:] - 1  # selectable tokens before t (t selectable)
    num_words = both[:B, -1]
    total = both[B:, -1]
    # ctok[w] for w < num_words: the selectable count before word w's start token.
    seg = tf.where(start, tf.range(B)[:, tf.newaxis] * (T + 1) + word, B * (T + 1))
    ctok = tf.math.unsorted_segment_sum(
        tf.reshape(tf.where(start, sel_before, 0), [-1]),
        tf.reshape(seg, [-1]),
        num_segments=B * (T + 1) + 1,
    )[: B * (T + 1)]
    ctok = tf.reshape(ctok, [B, T + 1])
    w_range = tf.range(T + 1)[tf.newaxis, :]
    ctok = tf.where(w_range < num_words[:, tf.newaxis], ctok, total[:, tf.newaxis])
    return word, num_words, ctok


def _tokens_of_words(word, covered_w):
    """Word-level selection [B, W] -> token-level selection [B, T]."""
    return (word >= 0) & _take(covered_w, tf.maximum(word, 0))


def _word_positions(word, covered, P):
    """The ascending positions of the covered words' tokens and their weights, as one XLA
    function (`_word_positions_xla`)."""
    return _positions_of(_tokens_of_words(word, covered), P)


_word_positions_xla = tf.function(_word_positions, jit_compile=True, autograph=False)


def _word_units(ids, selectable, bits, u, continuation, ngram_cdf):
    """WholeWord/Ngram's words (word [B, T], ctok [B, T + 1], see `_words_of`), their
    visiting-order keys and n-gram lengths (drawn with `ngram_cdf`, see `_cdf_of`, or None: all
    1), from the random draws `bits` and `u`. One XLA function (`_word_units_xla`): a few dozen
    small ops."""
    word, num_words, ctok = _words_of(ids, selectable,
                                      _word_starts_of(ids, selectable, continuation))
    shape = tf.shape(ids)
    w_range = tf.range(shape[1])[tf.newaxis, :]
    key = _order_keys(bits, w_range < num_words[:, tf.newaxis])  # random visiting order
    cand_n = (tf.ones(shape, tf.int32) if ngram_cdf is None
              else _categorical_from(u, ngram_cdf))
    cand_n = tf.minimum(cand_n, num_words[:, tf.newaxis] - w_range)  # slice semantics at the end
    return word, ctok, key, cand_n


_word_units_xla = tf.function(_word_units, jit_compile=True, autograph=False)


# === The engine ===


class _Masker(SeededStage):
    """Shared engine. Subclasses implement `_select` (and may set `_per_span`)."""

    seed_salt = 0x5EED

    _default_rounding = "round"
    _per_span = False

    def __init__(
        self,
        vocabulary_size=None,
        mask_selection_rate=0.15,
        mask_token_id=None,
        mask_selection_length=20,
        unselectable_token_ids=(0,),
        mask_token_rate=0.8,
        random_token_rate=0.1,
        seed=None,
        *,
        vocabulary=None,
        word_style="wordpiece",
        padding_token_id=0,
        count_special_tokens=True,
        rounding=None,
        random_token_from="non_special",
    ):
        # --- vocabulary, mask token, sizes ---
        tokens = None
        if vocabulary is not None:
            tokens = load_vocabulary(vocabulary)
            if vocabulary_size is None:
                vocabulary_size = len(tokens)
            if mask_token_id is None:
                for name in _MASK_TOKEN_NAMES:
                    if name in tokens:
                        mask_token_id = tokens.index(name)
                        break
                else:
                    raise ValueError(
                        "The vocabulary has no mask token (looked for "
                        f"{', '.join(_MASK_TOKEN_NAMES)}); pass mask_token_id explicitly."
                    )
        if vocabulary_size is None:
            raise ValueError("Pass vocabulary_size (or a vocabulary).")
        if mask_token_id is None:
            raise ValueError("Pass mask_token_id (or a vocabulary containing a mask token).")
        vocabulary_size = int(vocabulary_size)
        mask_token_id = int(mask_token_id)
        if vocabulary_size < 1:
            raise ValueError(f"vocabulary_size must be positive; got {vocabulary_size}")
        if not 0 <= mask_token_id < vocabulary_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is outside the vocabulary [0, {vocabulary_size})"
            )
        if tokens is not None and len(tokens) != vocabulary_size:
            raise ValueError(
                f"vocabulary has {len(tokens)} tokens but vocabulary_size={vocabulary_size}"
            )
        # --- rates ---
        for name, value in (
            ("mask_selection_rate", mask_selection_rate),
            ("mask_token_rate", mask_token_rate),
            ("random_token_rate", random_token_rate),
        ):
            # numpy scalars (np.float32(0.15)) are numbers; a bool (True == 1) is not a rate.
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not (
                    0.0 <= float(value) <= 1.0):
                raise ValueError(f"{name} must be a number in [0, 1]; got {value!r} "
                                 f"({type(value).__name__})")
        if mask_token_rate + random_token_rate > 1.0 + 1e-9:
            raise ValueError(
                "mask_token_rate + random_token_rate must be <= 1; got "
                f"{mask_token_rate} + {random_token_rate}"
            )
        if mask_selection_length is None or int(mask_selection_length) < 1:
            raise ValueError(
                f"mask_selection_length must be a positive int; got {mask_selection_length!r}"
            )
        rounding = rounding or self._default_rounding
        if float(mask_selection_rate) == 0.0:
            # 0.0 masks nothing, with every masker ("round" would keep BERT's one per row).
            rounding = "ceil"
        if rounding not in ("round", "probabilistic", "ceil"):
            raise ValueError(
                f"rounding must be 'round', 'probabilistic' or 'ceil'; got {rounding!r}"
            )
        if random_token_from not in ("non_special", "vocabulary"):
            raise ValueError(
                f"random_token_from must be 'non_special' or 'vocabulary'; got {random_token_from!r}"
            )
        unselectable_token_ids = [int(i) for i in (unselectable_token_ids or ())]

        self.vocabulary_size = vocabulary_size
        self.mask_selection_rate = float(mask_selection_rate)
        self.mask_token_id = mask_token_id
        self.mask_selection_length = int(mask_selection_length)
        self.unselectable_token_ids = unselectable_token_ids
        self.mask_token_rate = float(mask_token_rate)
        self.random_token_rate = float(random_token_rate)
        self._init_seed(seed)
        self.vocabulary = vocabulary
        self.word_style = word_style
        self.padding_token_id = None if padding_token_id is None else int(padding_token_id)
        self.count_special_tokens = bool(count_special_tokens)
        self.rounding = rounding
        self.random_token_from = random_token_from

        # --- derived tables, and the settings as the XLA functions' tensor arguments ---
        special = {i for i in set(unselectable_token_ids) | {mask_token_id}
                   if 0 <= i < vocabulary_size}
        if random_token_from == "non_special":
            self._pool_size = vocabulary_size - len(special)
            if self._pool_size == 0:
                raise ValueError("Every vocabulary id is special: no random replacement possible.")
            self._pool_skipped = _id_set(special, fill=_INT32_MAX)
        else:
            self._pool_size, self._pool_skipped = vocabulary_size, None
        self._unselectable_list = sorted(
            set(unselectable_token_ids)
            | ({self.padding_token_id} if self.padding_token_id is not None else set())
        )
        self._unselectable_ids = _id_set(self._unselectable_list)
        self._rate = tf.constant(self.mask_selection_rate, tf.float64)
        self._mask_token = tf.constant(mask_token_id, tf.int32)
        # The compares of a float32 draw with the rates, as Python floats made them.
        self._replace_thresholds = tf.constant(
            np.float32([self.mask_token_rate, self.mask_token_rate + self.random_token_rate]))
        if tokens is not None:
            self._continuation = tf.constant(word_continuation_table(tokens, word_style), tf.bool)
        else:
            self._continuation = None

    # Seeding: `SeededStage` (`_call_key`, `map_dataset`), the scheme of the module docstring.

    # === Call ===

    @tf.autograph.experimental.do_not_convert  # plain TF ops: nothing for AutoGraph to convert
    def __call__(self, token_ids, seed=None):
        """Masks `token_ids` ([B, T] dense, [B, (T)] ragged, or one [T] sequence).

        `token_ids` may also be a Python list of ids, or of lists of ids (ragged rows).

        Returns a dict with `token_ids` (same type and shape as the input, masked), `mask_positions`
        [B, P] (ascending, zero padded), `mask_ids` [B, P] (original ids, 0 at padding) and
        `mask_weights` [B, P] float32 (1.0 for real predictions). Dtypes are keras-hub's
        `MaskedLMMaskGenerator`'s: called eagerly every id output is int32; traced (in `tf.data`
        or a `tf.function`) `token_ids` and `mask_ids` keep the input's dtype and `mask_positions`
        is int64.
        """
        if isinstance(token_ids, (list, tuple)):
            try:
                token_ids = tf.convert_to_tensor(token_ids)
            except ValueError:  # rows of different lengths, as keras-hub accepts
                token_ids = tf.ragged.constant(token_ids)
        ragged = isinstance(token_ids, tf.RaggedTensor)
        if not ragged:
            token_ids = tf.convert_to_tensor(token_ids)
        if not token_ids.dtype.is_integer:
            raise ValueError(
                f"token_ids must be integer token ids; got dtype {token_ids.dtype.name}"
            )
        in_dtype = token_ids.dtype
        rank = token_ids.shape.rank
        if rank not in (1, 2):
            raise ValueError(f"token_ids must be rank 1 or 2; got shape {token_ids.shape}")
        unbatched = rank == 1
        if unbatched:
            token_ids = token_ids[tf.newaxis]
        if ragged:
            lengths = token_ids.row_lengths()
            pad = self.padding_token_id if self.padding_token_id is not None else 0
            ids = tf.cast(token_ids.to_tensor(default_value=tf.cast(pad, in_dtype)), tf.int32)
            valid = tf.sequence_mask(lengths, maxlen=tf.shape(ids)[1])
        else:
            ids = tf.cast(token_ids, tf.int32)
            if self.padding_token_id is None:
                valid = tf.ones_like(ids, tf.bool)
            else:
                valid = tf.not_equal(ids, self.padding_token_id)

        masked, positions, weights, mask_ids = self._mask_and_replace(
            ids, valid, self._call_key(seed))

        # keras-hub's dtypes: called eagerly (its Python workflow) every id output is int32; traced
        # (tf.data, tf.function: its tf-text workflow) ids keep the input's dtype and positions are int64.
        eager = tf.executing_eagerly()
        id_dtype = tf.int32 if eager else in_dtype
        masked = tf.cast(masked, id_dtype)
        if ragged:
            masked = tf.RaggedTensor.from_tensor(masked, lengths=lengths)
            if masked.row_splits.dtype != token_ids.row_splits.dtype:
                masked = masked.with_row_splits_dtype(token_ids.row_splits.dtype)
        out = {
            "token_ids": masked,
            "mask_positions": tf.cast(positions, tf.int32 if eager else tf.int64),
            "mask_ids": tf.cast(mask_ids, id_dtype),
            "mask_weights": weights,
        }
        if unbatched:
            out = {k: v[0] for k, v in out.items()}
        return out

    # --- pieces of the pipeline ---

    def _selectable(self, ids, valid):
        return _selectable_of(ids, valid, tuple(self._unselectable_list))

    @property
    def _budget_settings(self):
        return dict(rate=self._rate, rounding=self.rounding,
                    limit=self.mask_selection_length,
                    count_special_tokens=self.count_special_tokens)

    def _budget_draw(self, valid, seed):
        """The budget's random draw ([B] float64 for `rounding="probabilistic"`, else None)."""
        if self.rounding != "probabilistic":
            return None
        return tf.random.stateless_uniform(tf.shape(valid)[:1], seed, dtype=tf.float64)

    def _budget(self, valid, selectable, seed):
        """Number of tokens to predict per row, [B] int32 (BERT / fairseq / SpanBERT rules)."""
        return _budget_of(valid, selectable, self._budget_draw(valid, seed),
                          **self._budget_settings)

    def _mask_and_replace(self, ids, valid, key):
        """The masking of one call from its key: (masked ids [B, T], positions [B, P], weights
        [B, P], mask_ids [B, P])."""
        positions, weights, unit_u, repl_seed = self._mask_dense(ids, valid, key)
        masked, mask_ids = self._replace(ids, positions, weights, unit_u, repl_seed)
        return masked, positions, weights, mask_ids

    def _mask_dense(self, ids, valid, key):
        seed_budget, seed_select, seed_unit, seed_repl = _split_seeds(key, 4)
        selectable = self._selectable(ids, valid)
        budget = self._budget(valid, selectable, seed_budget)
        positions, weights, unit = self._select_positions(ids, selectable, budget, seed_select)
        # One uniform per unit (per token, or per span for SpanMasker) for the 80/10/10 choice.
        shape = tf.shape(ids)
        if self._per_span:
            unit_u_all = tf.random.stateless_uniform(shape, seed_unit, dtype=tf.float32)
            unit_u = _take(unit_u_all, _take(unit, positions))
        else:
            unit_u = tf.random.stateless_uniform(
                tf.shape(positions), seed_unit, dtype=tf.float32
            )
        return positions, weights, unit_u, seed_repl

    def _select_positions(self, ids, selectable, budget, seed):
        """Default: a [B, T] selection from `_select`, then its sorted positions."""
        selected, unit = self._select(ids, selectable, budget, seed)
        positions, weights = self._positions(selected)
        return positions, weights, unit

    def _positions(self, selected):
        """[B, T] bool -> ascending positions [B, P] int32 (zero padded), weights [B, P]."""
        return _positions_of(selected, self.mask_selection_length)

    def _random_token_draw(self, seed, shape):
        """The random tokens' draw: (ids, None), or (indices into the pool, the ids the pool
        skips; see `_pool_ids`). Original BERT's pool is the whole vocabulary, specials
        included."""
        index = tf.random.stateless_uniform(shape, seed, minval=0, maxval=self._pool_size,
                                            dtype=tf.int32)
        return index, self._pool_skipped

    @property
    def _replace_settings(self):
        return dict(mask_token_id=self._mask_token, thresholds=self._replace_thresholds)

    def _replace(self, ids, positions, weights, unit_u, seed):
        """80/10/10 at the gathered positions. Returns (masked ids [B, T], mask_ids [B, P])."""
        random_ids, skipped = self._random_token_draw(seed, tf.shape(positions))
        return _replace_xla(ids, positions, weights, unit_u, random_ids, skipped,
                            **self._replace_settings)

    # --- words ---

    def _word_starts(self, ids, selectable):
        """[B, T] bool: selectable tokens that start a word."""
        return _word_starts_of(ids, selectable, self._continuation)

    def _words(self, ids, selectable, start=None):
        """Word structure of each row (`_words_of`); `start` ([B, T] bool) overrides the word
        starts of `_word_starts` (units of several words, e.g. `PhraseMasker`'s phrases, are
        then "words")."""
        if start is None:
            start = self._word_starts(ids, selectable)
        return _words_of(ids, selectable, start)

    def _tokens_from_words(self, word, covered_w, unit_w=None):
        """Word-level selection [B, W] -> token-level selection (and unit ids) [B, T]."""
        safe = tf.maximum(word, 0)
        selected = (word >= 0) & _take(covered_w, safe)
        unit = None if unit_w is None else _take(unit_w, safe)
        return selected, unit

    def _select(self, ids, selectable, budget, seed):
        raise NotImplementedError

    # === Config ===

    def get_config(self):
        return {
            "vocabulary_size": self.vocabulary_size,
            "mask_selection_rate": self.mask_selection_rate,
            "mask_token_id": self.mask_token_id,
            "mask_selection_length": self.mask_selection_length,
            "unselectable_token_ids": list(self.unselectable_token_ids),
            "mask_token_rate": self.mask_token_rate,
            "random_token_rate": self.random_token_rate,
            "seed": self.seed,
            "vocabulary": self.vocabulary,
            "word_style": self.word_style,
            "padding_token_id": self.padding_token_id,
            "count_special_tokens": self.count_special_tokens,
            "rounding": self.rounding,
            "random_token_from": self.random_token_from,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _greedy_walk(order, valid, cand_n, tok, budget, max_n, overlaps):
    """The sequential loop itself, over each row's candidates in visiting order (all rows at
    once, one candidate per step). Runs inside XLA (`_greedy_first_xla`, `_greedy_words_xla`):
    a step is a few tiny fused kernels, where TF's executor would pay its per-op cost on every
    op.

    order, valid, cand_n: [B, K] -- the word of the i-th visited candidate, whether it is one
    (False from some i on), its n-gram length; tok: [B, K, max_n] the pieces of its m-grams
    (m = 1..max_n); budget [B]. Returns the n-gram length each visited candidate got, [B, K]
    (0 when skipped), and the pieces used [B]. The loop stops once every row has spent its
    budget or run out of candidates.
    """
    B = tf.shape(order)[0]
    K = tf.shape(order)[1]
    # [K, B]: step i reads one leading row.
    wT, vT, nT = tf.transpose(order), tf.transpose(valid), tf.transpose(cand_n)
    tT = [tf.transpose(tok[:, :, m]) for m in range(max_n)]
    none = tf.zeros([K, B], tf.int32)
    count = tf.reduce_sum(tf.cast(valid, tf.int32), axis=1)  # valid is a prefix of each row

    def live(i, used, chosen, lo, hi):
        return tf.reduce_any((i < count) & (used < budget))

    def step(i, used, chosen, lo, hi):
        r = budget - used
        n = tf.zeros([B], tf.int32)  # the longest fitting n-gram: pieces grow with m
        t = tf.zeros([B], tf.int32)
        for m in range(max_n):
            fits = (nT[i] > m) & (tT[m][i] <= r)
            n = tf.where(fits, m + 1, n)
            t = tf.where(fits, tT[m][i], t)
        take = vT[i] & (n > 0)
        w = wT[i]
        if overlaps:  # against the words [lo, hi) of every n-gram taken so far
            take &= ~tf.reduce_any((lo < (w + n)[tf.newaxis]) & (w[tf.newaxis] < hi), axis=0)
        at = [[i]]
        chosen = tf.tensor_scatter_nd_update(chosen, at, tf.where(take, n, 0)[tf.newaxis])
        if overlaps:
            lo = tf.tensor_scatter_nd_update(lo, at, tf.where(take, w, _INT32_MAX)[tf.newaxis])
            hi = tf.tensor_scatter_nd_update(hi, at, tf.where(take, w + n, -1)[tf.newaxis])
        return i + 1, used + tf.where(take, t, 0), chosen, lo, hi

    state = (tf.constant(0), tf.zeros_like(budget), none, none + _INT32_MAX, none - 1)
    if overlaps is False:  # lo / hi are not read: keep them out of the loop's carried state
        state = state[:3] + (tf.zeros([0, 0], tf.int32),) * 2
    any_shape = tf.TensorShape([None, None])
    _, used, chosen, _, _ = tf.while_loop(
        live, step, state,
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])) + (any_shape,) * 3)
    return tf.transpose(chosen), used


def _greedy_words(key, order, cand_n, ctok, budget, max_n, overlaps):
    """`_greedy_walk` over the candidates `order` [B, K] (the first K visited words of each
    row, K >= 1 when W >= 1), in word space: gathers their n-gram lengths and pieces, walks
    them, and scatters the result back. Returns chosen [B, W] (see `_greedy_select`) and `more`
    [B]: rows with budget left and candidates after their K-th."""
    B = tf.shape(key)[0]
    W = tf.shape(key)[1]
    key_o = tf.gather(key, order, batch_dims=1)
    valid = key_o < _INT32_MAX
    # Pieces of the m-gram at word w: ctok[w + m] - ctok[w], with ctok[W] (the total) past W.
    ends = tf.concat([ctok[:, 1:], tf.repeat(ctok[:, -1:], max_n, axis=1)], axis=1)
    base = tf.gather(ctok, order, batch_dims=1)
    tok = tf.stack([tf.gather(ends, order + (m - 1), batch_dims=1) - base
                    for m in range(1, max_n + 1)], axis=2)
    chosen_o, used = _greedy_walk(order, valid, tf.gather(cand_n, order, batch_dims=1), tok,
                                  budget, max_n, overlaps)
    rows = tf.broadcast_to(tf.range(B)[:, tf.newaxis], tf.shape(order))
    index = tf.stack([rows, tf.where(valid, order, W)], axis=2)  # non-words: a dummy column
    chosen = tf.scatter_nd(index, chosen_o, tf.stack([B, W + 1]))[:, :W]
    kth = tf.reduce_max(key_o, axis=1)  # INT32_MAX when the row has fewer than K candidates
    more = (used < budget) & tf.reduce_any(
        (key > kth[:, tf.newaxis]) & (key < _INT32_MAX), axis=1)
    return chosen, more


def _greedy_first(key, cand_n, ctok, budget, first, max_n, overlaps):
    """`_greedy_words` over each row's first `first` visited candidates, for W <= 128, all in
    one XLA function. The partial sort is XLA's float32 TopK (a CPU runtime routine, several
    times faster than TF's int32 `top_k` and XLA's int32 sort) of the 24 random (and priority)
    bits of the key, `key >> 7`, which float32 holds exactly; its ties go to the lower index,
    and for W <= 128 the 7 low bits of the key are the position itself, so that is the key's
    own order."""
    W = tf.shape(key)[1]
    rank = tf.cast((1 << 24) - 1 - tf.bitwise.right_shift(key, 7), tf.float32)  # non-words: 0
    _, order = tf.math.top_k(rank, k=tf.minimum(W, first))
    return _greedy_words(key, order, cand_n, ctok, budget, max_n, overlaps)


_greedy_first_xla = tf.function(_greedy_first, jit_compile=True, autograph=False)
_greedy_words_xla = tf.function(_greedy_words, jit_compile=True, autograph=False)


def _greedy_select(key, cand_n, ctok, budget, max_n, overlaps):
    """Exact vectorized form of the BERT/ALBERT sequential greedy selection.

    The original walks the shuffled candidates (one per word) one by one:

        for c in candidates:                       # random order
            n = c.n                                # sampled n-gram length (1 for whole words)
            while n > 0 and used + pieces(c.word, n) > budget: n -= 1     # shorter n-gram
            if n == 0: continue                    # (skip; `break` once full is equivalent)
            if any word of c.word .. c.word+n-1 is covered: continue       # no overlap
            cover them; used += pieces(c.word, n)

    We run that very loop, for all rows at once, in *visiting-order space*: a partial sort
    gives each row's first K visited candidates (K = `_GREEDY_FIRST_CANDIDATES`), their n-gram
    lengths and pieces are gathered into [B, K], and `_greedy_walk` steps through them,
    candidate i of every row at step i, checking overlaps against the [lo, hi) word intervals
    taken so far; all of it is one XLA function (`_greedy_first`; rows wider than 128 words
    take TF's exact int32 `top_k` and `_greedy_words`). The budget is nearly always spent within
    the first K candidates (BERT-length rows: 21 at most for whole words, 19 for ALBERT n-grams
    on the benchmark), so the walk ends after ~20 steps. A row that visited its K candidates
    with budget left and more candidates to visit is walked again over its full order (the
    whole batch then, under `tf.cond`: no cost when there is none, and one XLA shape); same
    decisions, as the walk is deterministic. None on the benchmark's batches.

    Args: key [B, W] (distinct visiting-order keys, INT32_MAX for non-words), cand_n [B, W]
    (n-gram length, already clipped to the words left), ctok [B, W + 1] (see
    `_Masker._words`), budget [B], max_n (static), and `overlaps` (False lets the caller skip
    the overlap checks: whole words cannot overlap). Returns covered words [B, W] bool and the
    n-gram length each word's candidate got [B, W] (0 when skipped).
    """
    W = tf.shape(key)[1]
    first = _GREEDY_FIRST_CANDIDATES
    static = dict(max_n=max_n, overlaps=overlaps)

    def exact(key, cand_n, ctok, budget, k):  # any width: TF's int32 top_k
        _, order = tf.math.top_k(-key, k=k)  # ascending keys (distinct)
        return _greedy_words_xla(key, order, cand_n, ctok, budget, **static)

    chosen, more = tf.cond(
        W <= 128,
        lambda: _greedy_first_xla(key, cand_n, ctok, budget, first=first, **static),
        lambda: exact(key, cand_n, ctok, budget, tf.minimum(W, first)))

    def rest():  # some row has budget left and candidates past its first K: full order
        # On the whole batch, not a sub-batch of those rows: XLA compiles per shape, and a
        # sub-batch would have a new one for every number of such rows. Same decisions for
        # the other rows (the walk is deterministic).
        return exact(key, cand_n, ctok, budget, W)[0]

    chosen = tf.cond(tf.reduce_any(more), rest, lambda: chosen)
    covered = chosen > 0
    for d in range(1, max_n):
        covered = covered | _shift_right(chosen > d, d, False)
    return covered, chosen


# === Strategies ===


def _top_budget(keys, selectable, budget, P):
    """TokenMasker's selection: in each row the `budget` selectable tokens with the largest
    `keys` (ties to the lower position), as ascending positions [B, P] (zero padded) and
    weights [B, P] -- what `top_k` of the keys and a sort of the chosen positions give, without
    either (TF's CPU `top_k` of [128, 128] was a third of the masker's CPU).

    `keys` are `stateless_uniform` float32 draws, multiples of 2**-23 in [0, 1), so
    `keys * 2**23 * T + (T - 1 - t)` is an exact integer that orders the tokens as `top_k` does.
    A bisection on it finds per row the threshold with exactly `budget` keys at or above it
    (the keys are distinct; ~15 steps of one compare and row sum); the chosen tokens' bits are
    packed into 32-bit words and slot p's position is found among them by population counts.
    """
    B = tf.shape(keys)[0]
    T = tf.shape(keys)[1]
    # int32 holds 2**23 * T for T < 256; wider (or unknown) rows count in int64.
    dtype = tf.int32 if keys.shape[1] is not None and keys.shape[1] < 256 else tf.int64
    width = tf.cast(T, dtype)
    order = tf.cast(keys * float(1 << 23), dtype) * width + (width - 1 - tf.range(width))
    key = tf.where(selectable, order, tf.constant(-1, dtype))

    def count(threshold):  # [B]: keys >= threshold
        return tf.reduce_sum(tf.cast(key >= threshold[:, tf.newaxis], tf.int32), axis=1)

    # Invariant: count(lo) = c_lo >= b > count(hi); a row is done when c_lo == b (or b == 0).
    lo = tf.zeros([B], dtype)
    hi = tf.fill([B], tf.cast(1 << 23, dtype) * width)
    c_lo = count(lo)
    b = tf.minimum(budget, c_lo)

    def step(lo, hi, c_lo):
        mid = lo + (hi - lo) // 2
        c = count(mid)
        up = c >= b
        return tf.where(up, mid, lo), tf.where(up, hi, mid), tf.where(up, c, c_lo)

    lo, _, _ = tf.while_loop(lambda lo, hi, c_lo: tf.reduce_any((c_lo != b) & (b > 0)),
                             step, (lo, hi, c_lo))
    chosen = (key >= lo[:, tf.newaxis]) & (b[:, tf.newaxis] > 0)
    # Chosen bits as [B, W] words of 32 (int64: no sign bit), slot p in word w at rank r.
    W = (T + 31) // 32
    bits = tf.reshape(tf.pad(tf.cast(chosen, tf.int64), [[0, 0], [0, W * 32 - T]]), [B, W, 32])
    words = tf.reduce_sum(bits * tf.constant([1 << j for j in range(32)], tf.int64), axis=2)

    def popcount(x):
        return tf.cast(tf.raw_ops.PopulationCount(x=x), tf.int32)

    before = tf.cumsum(popcount(words), axis=1, exclusive=True)  # [B, W]
    slot = tf.range(P)
    w = tf.maximum(tf.reduce_sum(
        tf.cast(before[:, tf.newaxis, :] <= slot[tf.newaxis, :, tf.newaxis], tf.int32),
        axis=2) - 1, 0)  # [B, P]
    word = tf.gather(words, w, batch_dims=1)
    rank = slot[tf.newaxis, :] - tf.gather(before, w, batch_dims=1)
    bit = tf.zeros_like(rank)  # the largest bit with at most `rank` chosen bits below it
    for half in (16, 8, 4, 2, 1):
        below = tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.cast(bit + half, tf.int64)) - 1
        bit = tf.where(popcount(tf.bitwise.bitwise_and(word, below)) <= rank, bit + half, bit)
    weights = slot[tf.newaxis, :] < b[:, tf.newaxis]
    positions = tf.ensure_shape(tf.where(weights, w * 32 + bit, 0), [None, P])
    return positions, tf.ensure_shape(tf.cast(weights, tf.float32), [None, P])


_top_budget_xla = tf.function(_top_budget, jit_compile=True, autograph=False)


def _token_mask(ids, valid, keys, budget_u, unit_u, random_ids, skipped, unselectable, rate,
                rounding, limit, count_special_tokens, mask_token_id, thresholds):
    """TokenMasker's masking after its random draws, as one XLA function (`_token_mask_xla`;
    the settings as in `_budget_of` and `_replace_at`)."""
    selectable = _selectable_of(ids, valid, unselectable)
    budget = _budget_of(valid, selectable, budget_u, rate, rounding, limit, count_special_tokens)
    positions, weights = _top_budget(keys, selectable, budget, limit)
    masked, mask_ids = _replace_at(ids, positions, weights, unit_u, random_ids, skipped,
                                   mask_token_id, thresholds)
    return masked, positions, weights, tf.ensure_shape(mask_ids, [None, limit])


_token_mask_xla = tf.function(_token_mask, jit_compile=True, autograph=False)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TokenMasker(_Masker):
    """BERT / RoBERTa token masking (Devlin et al. 2019; Liu et al. 2019), dynamic.

    Every selectable token (not in `unselectable_token_ids`, not padding) is a candidate;
    `num_to_predict = min(P, max(1, round(n * rate)))` of them are chosen uniformly at random,
    where n counts the non-padding tokens ([CLS]/[SEP] included, as in the original; set
    `count_special_tokens=False` to count selectable tokens only) and `round` is Python 3's
    (half to even). `rounding="probabilistic"` gives fairseq/RoBERTa's `int(rate * n + U(0, 1))`
    (no minimum of 1). Of the chosen tokens, each independently becomes `mask_token_id` with
    `mask_token_rate` (0.8), a random token with `random_token_rate` (0.1), else stays.

    Selection is exact: the original shuffles the candidates and takes the first
    `num_to_predict`; we draw one uniform key per token and take the `num_to_predict` largest
    keys (those `top_k` would pick; found by a bisection on the keys, `_top_budget`), which is
    the same distribution (a uniform random subset of that size).

    Args (keras-hub `MaskedLMMaskGenerator`'s, then ours):
        vocabulary_size: int; may be omitted when `vocabulary` is given.
        mask_selection_rate: a number in [0, 1] (Python or numpy; not a bool), default 0.15.
            0.0 masks nothing in every masker (Token, WholeWord, Ngram, Span): no minimum of 1.
        mask_token_id: int; looked up (`[MASK]` / `<mask>`) when `vocabulary` is given.
        mask_selection_length: P, the maximum number of predictions and the output width (20).
        unselectable_token_ids: ids never masked (default `(0,)`); add [CLS], [SEP] etc.
        mask_token_rate, random_token_rate: the 80/10/10 split (0.8, 0.1).
        seed: int; see the module docstring for the seeding scheme.
        vocabulary: list of token strings or a vocabulary file (words for the word maskers).
        word_style: "wordpiece" | "sentencepiece" | "bpe" (see `word_continuation_table`).
        padding_token_id: id of padding in *dense* input (default 0; `None`: no padding). Never
            masked and never counted in n.
        count_special_tokens: count unselectable (non-padding) tokens in n (default True).
        rounding: "round" (BERT) | "probabilistic" (fairseq) | "ceil" (SpanBERT).
        random_token_from: "non_special" (default: never draw unselectable ids or the mask id)
            or "vocabulary" (original BERT: uniform over the whole vocabulary).

    Rows with no selectable token (all special, or empty) get zero predictions, all weights 0
    and their ids unchanged.

    Example:
    >>> masker = TokenMasker(vocabulary_size=30522, mask_token_id=103,
    ...                      unselectable_token_ids=(0, 101, 102), seed=1)
    >>> out = masker(tf.constant([[101, 2023, 2003, 1037, 7099, 102, 0, 0]]))
    >>> sorted(out)
    ['mask_ids', 'mask_positions', 'mask_weights', 'token_ids']
    """

    def _select_positions(self, ids, selectable, budget, seed):
        keys = tf.random.stateless_uniform(tf.shape(ids), seed, dtype=tf.float32)
        positions, weights = _top_budget_xla(keys, selectable, budget,
                                             P=self.mask_selection_length)
        return positions, weights, None

    def _mask_and_replace(self, ids, valid, key):
        """`_mask_dense` and `_replace` (the same seeds and draws), everything after the draws
        one XLA function (`_token_mask_xla`)."""
        P = self.mask_selection_length
        seed_budget, seed_select, seed_unit, seed_repl = _split_seeds(key, 4)
        B = tf.shape(ids)[0]
        keys = tf.random.stateless_uniform(tf.shape(ids), seed_select, dtype=tf.float32)
        unit_u = tf.random.stateless_uniform([B, P], seed_unit, dtype=tf.float32)
        draw, skipped = self._random_token_draw(seed_repl, [B, P])
        return _token_mask_xla(
            ids, valid, keys, self._budget_draw(valid, seed_budget), unit_u, draw, skipped,
            unselectable=self._unselectable_ids, **self._budget_settings,
            **self._replace_settings)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class WholeWordMasker(_Masker):
    """BERT whole-word masking (google-research/bert `--do_whole_word_mask`).

    A word is a start piece followed by its continuation pieces (`word_continuation_table`,
    built from `vocabulary` and `word_style`; without a vocabulary every token is a word);
    unselectable tokens never belong to a word. Words are visited in uniformly random order and
    taken whole; a word that would overshoot `num_to_predict` is skipped (later, shorter words
    may still fit). The budget is BERT's (see `TokenMasker`), counted in pieces; 80/10/10 is
    decided per piece.

    Exactness: the selection equals the original sequential loop for the same visiting order,
    word for word (`_greedy_select` runs that loop for all rows at once).

    Example:
    >>> vocab = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "un", "##believ", "##able", "film"]
    >>> masker = WholeWordMasker(vocabulary=vocab, unselectable_token_ids=(0, 1, 2), seed=1,
    ...                          mask_selection_rate=0.5, mask_selection_length=4)
    >>> out = masker(tf.constant([[1, 4, 5, 6, 7, 2]]))
    """

    _max_ngram = 1

    _ngram_cdf = None  # the n-gram lengths' `_cdf_of` (None: every length is 1)

    def _ngram_draw(self, seed, shape):
        """The random draw of the n-gram lengths (None: every length is 1)."""
        return None

    def _select(self, ids, selectable, budget, seed):
        return self._tokens_from_words(*self._covered_words(ids, selectable, budget, seed))

    def _covered_words(self, ids, selectable, budget, seed):
        """word [B, T] (see `_words`) and the covered words [B, W]."""
        covered, word, _, _, _ = self._ngram_select(ids, selectable, budget, seed)
        return word, covered

    def _select_positions(self, ids, selectable, budget, seed):
        word, covered = self._covered_words(ids, selectable, budget, seed)
        P = self.mask_selection_length
        positions, weights = _word_positions_xla(word, covered, P=P)
        return tf.ensure_shape(positions, [None, P]), tf.ensure_shape(weights, [None, P]), None

    def _ngram_select(self, ids, selectable, budget, seed):
        seed_order, seed_n = _split_seeds(seed, 2)
        shape = tf.shape(ids)
        bits = _order_bits(seed_order, shape, False)
        word, ctok, key, cand_n = _word_units_xla(
            ids, selectable, bits, self._ngram_draw(seed_n, shape),
            self._continuation, self._ngram_cdf)
        covered, chosen_n = _greedy_select(
            key, cand_n, ctok, budget, max_n=self._max_ngram, overlaps=self._max_ngram > 1
        )
        return covered, word, chosen_n, key, cand_n


@keras.saving.register_keras_serializable(package="keras_bertfam")
class NgramMasker(WholeWordMasker):
    """ALBERT n-gram masking (Lan et al. 2020; google-research/albert).

    For every word start (in random order) an n-gram length n in 1..`max_ngram` (3) is drawn
    with p(n) = (1/n) / sum_k 1/k -- 6/11, 3/11, 2/11 -- or the reverse when
    `favor_shorter_ngram=False`. The n-gram covers the next n whole words (fewer at the end of
    the candidate list, as the original's list slice). If it would overshoot the budget, shorter
    n-grams are tried (n-1, ..., 1); if none fits it is skipped; an n-gram overlapping an
    already masked word is skipped. 80/10/10 per piece. Budget as BERT (`TokenMasker`).

    Exactness: candidate for candidate the same decisions as the original sequential loop for
    the same order and the same drawn n (`_greedy_select`). Like the original, consecutive
    candidate words may straddle an unselectable token such as [SEP] (the candidates are the
    list of words with special tokens removed). The original's no-op "skip if covered" loop is
    not reproduced (it has no effect).

    Example:
    >>> masker = NgramMasker(vocabulary_size=100, mask_token_id=3, seed=1,
    ...                      unselectable_token_ids=(0, 1, 2))
    >>> out = masker(tf.constant([[1, 10, 11, 12, 13, 14, 15, 16, 2]]))
    """

    def __init__(self, *args, max_ngram=3, favor_shorter_ngram=True, **kwargs):
        super().__init__(*args, **kwargs)
        if int(max_ngram) < 1:
            raise ValueError(f"max_ngram must be >= 1; got {max_ngram}")
        self.max_ngram = int(max_ngram)
        self.favor_shorter_ngram = bool(favor_shorter_ngram)
        self._max_ngram = self.max_ngram
        p = 1.0 / np.arange(1, self.max_ngram + 1)
        p /= p.sum()
        self.ngram_probabilities = p if self.favor_shorter_ngram else p[::-1].copy()
        self._ngram_cdf = _cdf_of(self.ngram_probabilities)

    def _ngram_draw(self, seed, shape):
        return tf.random.stateless_uniform(shape, seed, dtype=tf.float32)


    def get_config(self):
        config = super().get_config()
        config.update(max_ngram=self.max_ngram, favor_shorter_ngram=self.favor_shorter_ngram)
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanMasker(_Masker):
    """SpanBERT span masking (Joshi et al. 2020; facebookresearch/SpanBERT).

    Repeatedly: draw a span length L in *words* from Geometric(`geometric_p`=0.2) clipped to
    [1, `max_span_length`=10] and renormalized (mean ~3.8); draw the anchor uniformly among the
    word starts where L whole free words fit (inside the sequence, no masked word); mask those
    words. Until `ceil(rate * n)` pieces are masked (`rounding="ceil"`), capped at P
    (`mask_selection_length`; raise it, e.g. to 77 for 512 tokens, to keep SpanBERT's budget).
    The span that reaches the budget is cut to the whole words that fit; if not even its first
    word fits, masking of that row stops (up to one word's pieces below the budget). L is
    clipped to the number of words of a short sequence; a span with no free placement is
    redrawn. 80/10/10 is decided per span (a whole span gets [MASK], or random tokens, or
    stays); `random_token_distribution` (a [V] probability vector, e.g. unigram frequencies)
    replaces the uniform random-token draw as in the original (special ids are zeroed unless
    `random_token_from="vocabulary"`).

    Exactness / differences from the original: the original draws the anchor uniformly over
    *pieces*, redraws (L and anchor) when the anchor is masked, and lets a span run into earlier
    spans, merging them; the last span may stop mid-word. Here spans never overlap and always
    cover whole words, and a span keeps its drawn length while the anchor is redrawn among the
    free placements, so realized span lengths follow the clipped geometric exactly (except the
    budget-cut final span). Spans are processed one per round for all rows at once
    (`tf.while_loop`, compiled with XLA), each exactly as in the sequential procedure: the
    anchor is the first free one of a few uniform proposals (rejection sampling: uniform among
    the free placements), with the exact cumulative-sum draw for rows where none is free.

    Example:
    >>> masker = SpanMasker(vocabulary_size=100, mask_token_id=3, seed=1,
    ...                     unselectable_token_ids=(0, 1, 2))
    >>> out = masker(tf.constant([[1] + list(range(10, 40)) + [2]]))
    """

    _default_rounding = "ceil"
    _per_span = True
    _anchor_proposals = 8  # anchor draws per span before the exact (cumulative-sum) draw

    def __init__(self, *args, geometric_p=0.2, max_span_length=10,
                 random_token_distribution=None, return_span_boundaries=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.return_span_boundaries = bool(return_span_boundaries)
        if not 0.0 < float(geometric_p) <= 1.0:
            raise ValueError(f"geometric_p must be in (0, 1]; got {geometric_p}")
        if int(max_span_length) < 1:
            raise ValueError(f"max_span_length must be >= 1; got {max_span_length}")
        self.geometric_p = float(geometric_p)
        self.max_span_length = int(max_span_length)
        lens = np.arange(1, self.max_span_length + 1)
        p = self.geometric_p * (1 - self.geometric_p) ** (lens - 1)
        self.span_length_probabilities = p / p.sum()
        self._span_cdf = _cdf_of(self.span_length_probabilities)
        self.random_token_distribution = random_token_distribution
        self._unigram_cdf = None
        if random_token_distribution is not None:
            dist = np.asarray(random_token_distribution, dtype=np.float64).reshape(-1)
            if dist.shape[0] != self.vocabulary_size:
                raise ValueError(
                    f"random_token_distribution has {dist.shape[0]} entries; expected "
                    f"vocabulary_size={self.vocabulary_size}"
                )
            if (dist < 0).any() or not np.isfinite(dist).all():
                raise ValueError("random_token_distribution must be finite and non-negative")
            if self.random_token_from == "non_special":
                dist = dist.copy()
                dist[sorted(set(self.unselectable_token_ids) | {self.mask_token_id})] = 0.0
            if dist.sum() <= 0:
                raise ValueError("random_token_distribution has no mass on allowed tokens")
            cdf = np.cumsum(dist / dist.sum())
            self._unigram_cdf = tf.constant(cdf, tf.float64)

    def _random_token_draw(self, seed, shape):
        if self._unigram_cdf is None:
            return super()._random_token_draw(seed, shape)
        u = tf.random.stateless_uniform(shape, seed, dtype=tf.float64)
        ids = tf.searchsorted(self._unigram_cdf, tf.reshape(u, [-1]), side="right")
        ids = tf.minimum(ids, self.vocabulary_size - 1)
        return tf.reshape(tf.cast(ids, tf.int32), shape), None

    def _select(self, ids, selectable, budget, seed):
        word, covered, unit_w, _, _ = self._spans(ids, selectable, budget, seed)
        return self._tokens_from_words(word, covered, unit_w)

    def _spans(self, ids, selectable, budget, seed, track=False):
        """Returns word [B, T], covered words [B, W], anchor per covered word [B, W], and per
        round [B, K]: the span's drawn length and its realized length in words (both 0 when no
        span was placed that round; they differ only for the budget-cut final span; zeros unless
        `track`)."""
        seed_len, seed_anchor = _split_seeds(seed, 2)
        word, num_words, ctok = self._words(ids, selectable)
        K = 2 * self.mask_selection_length  # rounds at most (each span masks >= 1 piece)
        lengths = _sample_categorical(seed_len, self._span_cdf, [tf.shape(ids)[0], K])
        lengths = tf.minimum(lengths, num_words[:, tf.newaxis])
        covered, unit_w, drawn, realized = _span_rounds_xla(
            lengths, num_words, ctok, budget, seed_anchor, **self._span_settings, track=track)
        return word, covered, unit_w, drawn, realized

    @property
    def _span_settings(self):
        return dict(max_span_length=self.max_span_length, proposals=self._anchor_proposals)

    def _mask_and_replace(self, ids, valid, key):
        """The whole masking after the TF random draws is one XLA function (`_span_mask`,
        the anchors' draws inside it); the draws are `_mask_dense`'s, `_spans`' and
        `_replace`'s, so the masks are those of that path, bit for bit."""
        seed_budget, seed_select, seed_unit, seed_repl = _split_seeds(key, 4)
        seed_len, seed_anchor = _split_seeds(seed_select, 2)
        shape = tf.shape(ids)
        P = self.mask_selection_length
        len_u = tf.random.stateless_uniform([shape[0], 2 * P], seed_len, dtype=tf.float32)
        unit_u = tf.random.stateless_uniform(shape, seed_unit, dtype=tf.float32)
        random_ids, skipped = self._random_token_draw(seed_repl, [shape[0], P])
        masked, positions, weights, mask_ids = _span_mask_xla(
            ids, valid, self._budget_draw(valid, seed_budget), len_u, seed_anchor, unit_u,
            random_ids, skipped, self._continuation, self._span_cdf,
            unselectable=self._unselectable_ids, **self._budget_settings,
            **self._replace_settings, **self._span_settings)
        return (masked, tf.ensure_shape(positions, [None, P]),
                tf.ensure_shape(weights, [None, P]), tf.ensure_shape(mask_ids, [None, P]))

    def get_config(self):
        config = super().get_config()
        config.update(
            geometric_p=self.geometric_p,
            max_span_length=self.max_span_length,
            random_token_distribution=None
            if self.random_token_distribution is None
            else np.asarray(self.random_token_distribution).tolist(),
            return_span_boundaries=self.return_span_boundaries,
        )
        return config

    def __call__(self, token_ids, seed=None):
        """As the other maskers; with `return_span_boundaries=True` the dict also has
        `span_starts` and `span_ends` [B, P] int32 (see `span_boundaries`), the inputs of
        SpanBERT's span boundary objective."""
        out = super().__call__(token_ids, seed=seed)
        if self.return_span_boundaries:
            out["span_starts"], out["span_ends"] = span_boundaries(
                out["mask_positions"], out["mask_weights"])
        return out


_SPAN_DRAW_ROUNDS = 16  # SpanMasker's anchor draws are made for this many rounds at once


def _philox(counter, key):
    """Philox4x32-10 (Salmon et al. 2011) on uint32 lanes: `counter` 4 tensors, `key` 2
    (broadcast to the counter's shape). The 10 rounds are a while loop, which keeps each round's
    state in memory: XLA's own stateless draws (the rounds unrolled into one fusion) cost ~0.5 us
    a value on CPU, probably from the fusion recomputing each round's products for every use."""
    def body(i, c0, c1, c2, c3, k0, k1):
        p0 = tf.cast(c0, tf.uint64) * 0xD2511F53
        p1 = tf.cast(c2, tf.uint64) * 0xCD9E8D57
        hi0 = tf.cast(tf.bitwise.right_shift(p0, tf.constant(32, tf.uint64)), tf.uint32)
        hi1 = tf.cast(tf.bitwise.right_shift(p1, tf.constant(32, tf.uint64)), tf.uint32)
        return (i + 1, hi1 ^ c1 ^ k0, tf.cast(p1, tf.uint32), hi0 ^ c3 ^ k1,
                tf.cast(p0, tf.uint32), k0 + tf.constant(0x9E3779B9, tf.uint32),
                k1 + tf.constant(0xBB67AE85, tf.uint32))

    zero = tf.zeros_like(counter[0])
    out = tf.while_loop(lambda i, *_: i < 10, body,
                        (tf.constant(0),) + tuple(counter) + (key[0] + zero, key[1] + zero))
    return out[1:5]


def _xla_uniforms(seed0, seeds1, n):
    """[len(seeds1), n] float32: row j is `tf.random.stateless_uniform([n], [seed0, seeds1[j]])`
    (int32 seeds) exactly as XLA computes it on CPU (TF 2.21: the seed scrambled by Philox into a
    key and a counter, then Philox over counters i = 0.., 4 values each, 23 bits a float), for
    all j at once: XLA's own op takes ~50 us for one [128, 9] draw (see `_philox`), this ~5 us
    a draw when made for 16 at once. Tested against XLA's op (test_masking)."""
    s0 = tf.bitcast(tf.cast(seed0, tf.int32), tf.uint32)
    s1 = tf.bitcast(tf.cast(seeds1, tf.int32), tf.uint32)
    zero = tf.zeros_like(s1)
    scramble = (tf.constant(0x3EC8F720, tf.uint32), tf.constant(0x02461E29, tf.uint32))
    k0, k1, c2, c3 = _philox([s0 + zero, zero, s1, zero], scramble)
    blocks = (n + 3) // 4
    i = tf.bitcast(tf.range(blocks), tf.uint32)[tf.newaxis, :]
    col = lambda x: x[:, tf.newaxis] + tf.zeros_like(i)  # noqa: E731
    bits = _philox([col(zero) + i, col(zero), col(c2), col(c3)], (k0[:, tf.newaxis],
                                                                   k1[:, tf.newaxis]))
    bits = tf.reshape(tf.stack(bits, axis=2), [-1, blocks * 4])[:, :n]
    return tf.cast(tf.bitwise.right_shift(bits, tf.constant(9, tf.uint32)),
                   tf.float32) * 1.1920929e-07


def _span_rounds(lengths, num_words, ctok, budget, seed_anchor, max_span_length, proposals,
                 track=False):
    """SpanMasker's span rounds (`SpanMasker._spans`), one span per row and round, for
    all rows at once; the K = lengths.shape[1] rounds' span lengths in words `lengths`
    [B, K]. Returns covered words [B, W], the anchor of each covered word [B, W], and per
    round the drawn and realized lengths [B, K] (zeros unless `track`). Runs inside XLA
    (`_span_rounds_xla`, `_span_mask_xla`): many small elementwise ops on fixed shapes."""
    B = tf.shape(ctok)[0]
    W = tf.shape(ctok)[1] - 1
    K = lengths.shape[1]
    Lmax = max_span_length
    R = proposals
    w_range = tf.range(W)[tf.newaxis, :]  # (1, W)
    m_range = tf.range(Lmax + 1)[tf.newaxis, :]  # (1, Lmax + 1)
    k_range = tf.range(K)[tf.newaxis, :]  # (1, K)
    ctok_pad = tf.concat([ctok, tf.tile(ctok[:, -1:], [1, Lmax])], axis=1)  # (B, W + 1 + Lmax)
    row_offset = tf.range(B)[:, tf.newaxis] * (W + 1 + Lmax)  # rows of ctok_pad, flat
    ctok_flat = tf.reshape(ctok_pad, [-1])
    w_offset = tf.range(B)[:, tf.newaxis] * W  # rows of next_cov, flat

    def exact_anchor(next_cov, L, u):
        """The j-th free placement, j = floor(u * count): one cumulative sum over the row.
        Returns (anchor (B, 1), count > 0 (B,))."""
        place = w_range + L <= next_cov
        count = tf.reduce_sum(tf.cast(place, tf.int32), axis=1)
        j = tf.cast(u * tf.cast(count, tf.float32), tf.int32)
        j = tf.minimum(j, count - 1)[:, tf.newaxis]
        rank = _cumsum(place)  # 1-based rank of each placement
        anchor = tf.reduce_sum(tf.cast(rank <= j, tf.int32), axis=1)[:, tf.newaxis]
        return anchor, count > 0

    # Round k's draw is `stateless_uniform([B, R + 1], fold_in(seed_anchor, k))` as XLA
    # computes it (`_xla_uniforms`), for the next C rounds at once every C rounds.
    C = _SPAN_DRAW_ROUNDS
    fold = tf.random.experimental.stateless_fold_in(seed_anchor, 0)[0]  # the same for every k

    def next_draws(k, draws):
        return tf.cond(tf.equal(k % C, 0),
                       lambda: _xla_uniforms(fold, k + tf.range(C), B * (R + 1)),
                       lambda: draws)

    def body(k, next_cov, unit_w, used, done, draws, *tracked):
        # next_cov[w]: first masked word >= w (num_words if none): L free words fit at w
        # iff w + L <= next_cov[w] -- elementwise, no scan over the row.
        L = lengths[:, k][:, tf.newaxis]  # (B, 1)
        # The anchor, uniform among the free placements: R proposals uniform among all
        # num_words - L + 1 placements, the first free one wins (uniform among the free
        # ones). Rows where none is free (rare: masking covers ~15%) take the exact draw.
        draws = next_draws(k, draws)
        u = tf.reshape(draws[k % C], [B, R + 1])
        n_all = num_words[:, tf.newaxis] - L + 1  # (B, 1), >= 1 for rows with words
        prop = tf.minimum(tf.cast(u[:, 1:] * tf.cast(n_all, tf.float32), tf.int32),
                          n_all - 1)  # (B, R)
        prop = tf.maximum(prop, 0)
        free = prop + L <= tf.gather(tf.reshape(next_cov, [-1]), prop + w_offset)
        first = tf.argmax(tf.cast(free, tf.int32), axis=1, output_type=tf.int32)
        anchor = tf.gather(tf.reshape(prop, [-1]), tf.range(B) * R + first)[:, tf.newaxis]
        found = tf.reduce_any(free, axis=1)
        need = ~done & ~found
        anchor, found = tf.cond(
            tf.reduce_any(need),
            lambda: tuple(tf.where(c, a, b) for c, a, b in zip(
                (need[:, tf.newaxis], need), exact_anchor(next_cov, L, u[:, 0]),
                (anchor, found))),
            lambda: (anchor, found))
        # Cut to the whole words that fit the remaining budget.
        pieces = tf.gather(ctok_flat, anchor + m_range + row_offset)  # (B, Lmax + 1)
        pieces = pieces[:, 1:] - pieces[:, :1]  # pieces of the first m words, m = 1..Lmax
        fits = (m_range[:, 1:] <= L) & (pieces <= (budget - used)[:, tf.newaxis])
        m = tf.reduce_sum(tf.cast(fits, tf.int32), axis=1)
        taken = tf.reduce_max(tf.where(fits, pieces, 0), axis=1)
        active = ~done & found
        placed = active & (m > 0)
        m = tf.where(placed, m, 0)[:, tf.newaxis]
        span = (w_range >= anchor) & (w_range < anchor + m)
        placed_anchor = tf.where(placed[:, tf.newaxis], anchor, W)  # W: no change
        next_cov = tf.where(
            w_range < anchor,
            tf.minimum(next_cov, placed_anchor),
            tf.where(span, w_range, next_cov),
        )
        unit_w = tf.where(span, anchor, unit_w)
        used = used + tf.where(placed, taken, 0)
        done = done | (active & (m[:, 0] == 0)) | (used >= budget)
        if track:
            realized, drawn = tracked
            tracked = (tf.where(k_range == k, m, realized),
                       tf.where((k_range == k) & (m > 0), L, drawn))
        return (k + 1, next_cov, unit_w, used, done, draws) + tuple(tracked)

    init = (
        tf.constant(0),
        tf.broadcast_to(num_words[:, tf.newaxis], [B, W]),
        tf.zeros([B, W], tf.int32),
        tf.zeros([B], tf.int32),
        (budget <= 0) | (num_words == 0),
        tf.zeros([C, B * (R + 1)]),  # the draws of rounds k - k % C ... (filled at k = 0)
    ) + ((tf.zeros([B, K], tf.int32), tf.zeros([B, K], tf.int32)) if track else ())
    # The batch dimension may be static in a trace (an eager call on a concrete batch) and
    # come out of a round unknown (the anchor's gather and cond): let it vary.
    invariants = tuple(tf.TensorShape([None] * min(t.shape.rank, 1) + t.shape[1:].as_list())
                       for t in init)
    invariants = invariants[:5] + (tf.TensorShape([None, None]),) + invariants[6:]
    _, next_cov, unit_w, _, _, _, *tracked = tf.while_loop(
        lambda k, c, u, s, d, r, *t: (k < K) & ~tf.reduce_all(d), body, init,
        shape_invariants=invariants,
    )
    realized, drawn = tracked if track else (tf.zeros([B, K], tf.int32),) * 2
    covered = tf.equal(next_cov, w_range) & (w_range < num_words[:, tf.newaxis])
    return covered, unit_w, drawn, realized


_span_rounds_xla = tf.function(_span_rounds, jit_compile=True, autograph=False)


def _span_mask(ids, valid, budget_u, len_u, seed_anchor, unit_u, random_ids, skipped,
               continuation, span_cdf, unselectable, rate, rounding, limit,
               count_special_tokens, mask_token_id, thresholds, max_span_length, proposals):
    """SpanMasker's masking after its random draws, as one XLA function (`_span_mask_xla`):
    selectable tokens, budget, words, span lengths, the span rounds, covered tokens ->
    positions, the per-span 80/10/10 replacement. `budget_u` is the budget's draw (or None),
    `len_u` [B, K] the span lengths' uniform draws, `unit_u` [B, T] one uniform per anchor word
    (the span's 80/10/10 choice), `random_ids` [B, P] the random tokens (indices into the pool
    unless `skipped` is None, see `_pool_ids`), `span_cdf` the span lengths' `_cdf_of`; the
    other settings as in `_budget_of` and `_replace_at`."""
    selectable = _selectable_of(ids, valid, unselectable)
    budget = _budget_of(valid, selectable, budget_u, rate, rounding, limit, count_special_tokens)
    word, num_words, ctok = _words_of(ids, selectable,
                                      _word_starts_of(ids, selectable, continuation))
    lengths = tf.minimum(_categorical_from(len_u, span_cdf), num_words[:, tf.newaxis])
    covered, unit_w, _, _ = _span_rounds(lengths, num_words, ctok, budget, seed_anchor,
                                         max_span_length, proposals)
    safe = tf.maximum(word, 0)
    positions, weights = _positions_of((word >= 0) & _take(covered, safe), limit)
    unit_u = _take(unit_u, _take(_take(unit_w, safe), positions))
    masked, mask_ids = _replace_at(ids, positions, weights, unit_u, random_ids, skipped,
                                   mask_token_id, thresholds)
    return masked, positions, weights, mask_ids


_span_mask_xla = tf.function(_span_mask, jit_compile=True, autograph=False)


def span_boundaries(mask_positions, mask_weights):
    """First and last token of the masked span holding each prediction slot.

    A span is a maximal run of consecutive masked positions (spans that touch are one span, so
    their boundary tokens are unmasked ones). `mask_positions` [B, P] ascending (or [P]),
    `mask_weights` [B, P]; returns (`span_starts`, `span_ends`) [B, P] int32, 0 at padding slots.
    Vectorized over the batch: a [P, P] triangle, no loop.

    >>> s, e = span_boundaries(tf.constant([[3, 4, 5, 9, 0]]), tf.constant([[1., 1, 1, 1, 0]]))
    >>> s.numpy().tolist(), e.numpy().tolist()
    ([[3, 3, 3, 9, 0]], [[5, 5, 5, 9, 0]])
    """
    positions = tf.cast(tf.convert_to_tensor(mask_positions), tf.int32)
    unbatched = positions.shape.rank == 1
    if unbatched:
        positions = positions[tf.newaxis]
    real = tf.convert_to_tensor(mask_weights)
    real = (real[tf.newaxis] if unbatched else real) > 0
    P = tf.shape(positions)[1]
    prev = _shift_right(positions, 1, -2)
    nxt = _shift_left(positions, 1, -2)
    prev_real = _shift_right(real, 1, False)
    next_real = _shift_left(real, 1, False)
    is_start = real & ~(prev_real & tf.equal(prev, positions - 1))  # (B, P)
    is_end = real & ~(next_real & tf.equal(nxt, positions + 1))
    # Positions ascend, so a slot's start is the largest start at or before it and its end the
    # smallest end at or after it.
    before = tf.linalg.band_part(tf.ones([P, P], tf.bool), -1, 0)  # [p, j]: j <= p
    starts = tf.reduce_max(
        tf.where(before[tf.newaxis] & is_start[:, tf.newaxis, :], positions[:, tf.newaxis, :],
                 -1), axis=2)
    ends = tf.reduce_min(
        tf.where(tf.transpose(before)[tf.newaxis] & is_end[:, tf.newaxis, :],
                 positions[:, tf.newaxis, :], _INT32_MAX), axis=2)
    starts = tf.where(real, starts, 0)
    ends = tf.where(real, ends, 0)
    if unbatched:
        return starts[0], ends[0]
    return starts, ends


# === ERNIE: knowledge masking (phrases, entities) and the staged schedule ===


def _lexicon_ids(entries, tokenizer, arg):
    """Lexicon entries (strings, or sequences of token ids) -> list of tuples of ints."""
    if isinstance(entries, (str, bytes)):
        raise ValueError(f"{arg} must be a list of entries; got a single string {entries!r}")
    entries = list(entries)
    strings = [e for e in entries if isinstance(e, (str, bytes))]
    if strings and len(strings) != len(entries):
        raise ValueError(f"{arg} must be all strings or all token-id sequences, not a mix")
    if strings:
        if tokenizer is not None and not callable(tokenizer):
            raise ValueError(f"tokenizer={tokenizer!r}: expected a tokenizer object (e.g. "
                             f"kb.preprocessing.WordPieceTokenizer), which turns the {arg} into "
                             "token ids")
        if tokenizer is None:
            raise ValueError(
                f"{arg} are strings: pass tokenizer= (the tokenizer of the model's vocabulary, "
                "e.g. kb.preprocessing.WordPieceTokenizer) to turn them into token ids, or pass "
                "token-id sequences"
            )
        tokens = tokenizer(tf.constant([s if isinstance(s, str) else s.decode() for s in strings]))
        if isinstance(tokens, tf.RaggedTensor):
            rows = tokens.to_list()
        elif isinstance(tokens, (list, tuple)):  # keras-hub tokenizers may return lists
            rows = [np.asarray(r).reshape(-1).tolist() for r in tokens]
        else:
            rows = np.asarray(tokens).tolist()
        return [tuple(int(i) for i in r) for r in rows]
    out = []
    for e in entries:
        try:
            ids = None if e is None or np.isscalar(e) else np.asarray(e)
        except ValueError:  # ragged nested lists
            ids = None
        if ids is None or ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype,
                                                                              np.integer)):
            raise ValueError(f"{arg}: entry {e!r} is neither a string nor a sequence of integer "
                             "token ids (a one-token entry is a list of one id, e.g. [2054])")
        out.append(tuple(int(i) for i in ids))
    return out


def _inside(flags_list, lengths):
    """For each [B, T] flag set: tokens strictly inside (after the first token of) the
    flagged matches of `lengths` -- a count of the matches open at t, one cumulative sum."""
    B = tf.shape(lengths)[0]
    T = tf.shape(lengths)[1]
    t = tf.range(T)[tf.newaxis, :]
    rows = []
    ends = []
    for flags in flags_list:
        end = t + lengths  # first token after the match
        seg = tf.where(flags & (end < T), tf.range(B)[:, tf.newaxis] * T + end, B * T)
        closed = tf.math.unsorted_segment_sum(
            tf.ones_like(seg), seg, B * T + 1)
        rows.append(tf.cast(flags, tf.int32))
        ends.append(tf.reshape(closed[: B * T], [B, T]))
    counts = _cumsum(tf.concat(rows + ends, axis=0))
    k = len(flags_list)
    out = []
    for i in range(k):
        opened = counts[i * B:(i + 1) * B] - rows[i]  # matches started before t
        closed = counts[(k + i) * B:(k + i + 1) * B]  # matches ended at or before t
        out.append(opened - closed > 0)
    return out


def _leftmost_longest(lengths):
    """The lexicon matches kept by a leftmost-longest scan, from `lengths` [B, T] (the longest
    match starting at each token, 0 if none): the accepted match starts [B, T] and the tokens
    strictly inside an accepted match [B, T]. One XLA function (the rounds are small ops).

    A candidate is accepted when no earlier live candidate covers it, rejected when an accepted
    one does; each round decides at least the first undecided candidate of every row. The
    first round (nothing accepted yet) needs one count."""
    cand = lengths > 0
    (covered,) = _inside([cand], lengths)
    accepted = cand & ~covered
    undecided = cand & covered

    def body(accepted, undecided):
        in_acc, in_live = _inside([accepted, accepted | undecided], lengths)
        undecided = undecided & ~in_acc
        accept_now = undecided & ~in_live
        return accepted | accept_now, undecided & ~accept_now

    def chains():  # some match starts inside another: rounds until all are decided
        acc, _ = tf.while_loop(lambda a, u: tf.reduce_any(u), body, (accepted, undecided))
        return acc, _inside([acc], lengths)[0]

    # Often no match starts inside another: all are accepted and `covered` is final.
    return tf.cond(tf.reduce_any(undecided), chains, lambda: (accepted, covered))


_leftmost_longest_xla = tf.function(_leftmost_longest, jit_compile=True, autograph=False)


def _unit_words(ids, selectable, start, lengths, bits, nested, prefer_units):
    """The lexicon maskers' units, from the word starts and the longest match at each token
    (`nested`: matches can overlap, i.e. entries are longer than one token): the units as the
    "words" of `WholeWordMasker` (word [B, T], ctok [B, T + 1], see `_words_of`) and their
    visiting-order keys (lexicon matches first with `prefer_units`). One XLA function
    (`_unit_words_xla`): the leftmost-longest rounds and the word structure are small ops."""
    if nested:
        matched, in_acc = _leftmost_longest(lengths)
        start = start & ~in_acc
    else:
        matched = lengths > 0
    word, num_words, ctok = _words_of(ids, selectable, start)
    T = tf.shape(ids)[1]
    is_word = tf.range(T)[tf.newaxis, :] < num_words[:, tf.newaxis]
    priority = None
    if prefer_units:  # the word-space flag of each unit: is it a lexicon match?
        B = tf.shape(ids)[0]
        seg = tf.where(matched, tf.range(B)[:, tf.newaxis] * T + word, B * T)
        priority = tf.math.unsorted_segment_sum(tf.ones_like(seg), seg, B * T + 1)
        priority = tf.reshape(priority[: B * T], [B, T]) > 0
    return word, ctok, _order_keys(bits, is_word, priority)


_unit_words_xla = tf.function(_unit_words, jit_compile=True, autograph=False)


def _window_widths(longest, row_length=None, narrowest=16):
    """The matcher's window widths: the longest entry's length, cut to a static row length;
    with an unknown one, the widths doubling from `narrowest` below the longest entry's length
    and that length (the narrowest that covers a batch's rows runs)."""
    if row_length is not None or longest <= narrowest:
        return [min(longest, row_length or longest)]
    widths = [narrowest]
    while widths[-1] * 2 < longest:
        widths.append(widths[-1] * 2)
    return widths + [longest]


def _pair_slot(first, second):
    """Slot in [0, 2**16) of an id pair (NumPy or TF ints; no int32 overflow for any ids)."""
    band = np.bitwise_and if isinstance(first, np.integer) else tf.bitwise.bitwise_and
    return band(band(first, 0xFFFF) * 32749 + band(second, 0xFFFF), 0xFFFF)


class _LexiconMasker(WholeWordMasker):
    """Whole-unit masking where a unit is a lexicon match (phrase, entity) or a plain word.

    Engine: the token ids are matched against the lexicon for all rows at once (a `[V]` table
    marks the ids that begin an entry; at those positions the windows of 1..L tokens are looked
    up together: hashed, searched among the sorted entry hashes, and checked id for id, so the
    result is exact); matches must start at a word start and end at a word end, and overlapping
    matches are resolved leftmost-longest (the sequential scan's result, computed in parallel
    rounds). Each accepted match becomes one "word" of `WholeWordMasker`'s greedy
    selection, so it is masked whole or not at all, within BERT's budget.

    Entries that can never match (tokenized to nothing, or holding an unselectable token such
    as `[UNK]`) are skipped with one warning naming them; an empty lexicon is a warning (the
    masker is then `WholeWordMasker`); ids outside the vocabulary are a `ValueError`. Entries
    longer than the rows cost nothing (the windows stop at the rows' length: a static one at
    trace time; an unknown one, ragged or unpadded rows, picks the narrowest of a few widths at
    run time, `_window_widths`).
    """

    _lexicon_arg = "lexicon"

    def __init__(self, *args, lexicon=None, tokenizer=None, prefer_units=True, **kwargs):
        super().__init__(*args, **kwargs)
        arg = self._lexicon_arg
        if lexicon is None:
            raise ValueError(f"Pass {arg}= (a list of strings with tokenizer=, or of id lists)")
        if not isinstance(lexicon, (str, bytes)):
            if not hasattr(lexicon, "__iter__"):
                raise ValueError(f"{arg} must be a list of entries (strings with tokenizer=, or "
                                 f"token-id lists); got {type(lexicon).__name__} {lexicon!r:.80}")
            lexicon = list(lexicon)  # iterated twice (a generator would be empty the second time)
        if not isinstance(prefer_units, bool):
            raise ValueError(f"prefer_units must be True or False; got {prefer_units!r}")
        entries = _lexicon_ids(lexicon, tokenizer, arg)
        V = self.vocabulary_size
        special = set(self._unselectable_list)
        kept, never = [], []  # never: entries that could never match, (name, ids)
        names = [n if isinstance(n, (str, bytes)) else list(e) for n, e in zip(lexicon, entries)]
        for e, name in zip(entries, names):
            bad = [i for i in e if not 0 <= i < V]
            if bad:
                raise ValueError(f"{arg}: entry {e} has ids outside the vocabulary [0, {V})")
            if not e or special.intersection(e):
                never.append((name, e))
            else:
                kept.append(e)
        if never:
            tokens = load_vocabulary(self.vocabulary) if self.vocabulary is not None else None

            def why(e):  # the unselectable tokens, by name where known
                shown = ", ".join(tokens[i] if tokens else f"id {i}"
                                  for i in sorted(special.intersection(e)))
                return f"an unselectable token: {shown}" if e else "tokenizes to nothing"

            shown = ", ".join(f"{n!r} ({why(e)})" for n, e in never[:5])
            warn(
                f"{arg}: skipping {len(never)} of {len(entries)} entries that could never match: "
                f"{shown}{', ...' if len(never) > 5 else ''}.")
        if not kept:
            warn(
                f"{type(self).__name__}: {arg} is empty{' after skipping' if never else ''}: "
                "there is nothing to match, so this masker is plain whole-word masking "
                "(WholeWordMasker). Pass a non-empty lexicon (learn_phrases returns [] on a "
                "corpus too small for its min_count).")
        entries = sorted(set(kept))
        self.lexicon_ids = [list(e) for e in entries]
        self.prefer_units = bool(prefer_units)
        self.max_unit_length = max((len(e) for e in entries), default=1)
        # Matcher tables. A window of ids w_0..w_{n-1} hashes to sum_i w_i * R_i (random R_i;
        # exact int64 sums, no overflow); a window matches an entry when the hashes agree *and*
        # the ids do (checked), so hash collisions can never create or hide a match.
        L = self.max_unit_length
        rng = np.random.default_rng(0x5EED)
        bits = min(40, 62 - int(np.ceil(np.log2(max(V, 2)))) - int(np.ceil(np.log2(L + 1))))
        for _ in range(100):
            R = rng.integers(1, 2**bits, size=L, dtype=np.int64)
            hashes = np.array([int(np.dot(np.array(e, np.int64), R[: len(e)])) for e in entries],
                              np.int64)
            if len(np.unique(hashes)) == len(hashes):
                break
        else:  # pragma: no cover - probability ~E**2 * 2**-bits per draw
            raise ValueError(f"Could not hash the {arg} without collisions")
        order = np.argsort(hashes, kind="stable")
        padded = np.full([len(entries) + 1, L], -1, np.int32)
        lengths = np.zeros([len(entries) + 1], np.int32)
        for row, e in enumerate(entries[i] for i in order):
            padded[row, : len(e)] = e
            lengths[row] = len(e)
        # Live-start tables (see `_match_lengths`): one code per id, 1 = a one-token entry,
        # 2 = begins a longer entry; and the (first id, second id) pairs of the longer entries,
        # hashed into 2**16 flags (`_pair_slot`; a collision only lets a window be looked up).
        start_code = np.zeros([V], np.int32)
        pairs = np.zeros([1 << 16], bool)
        for e in entries:
            start_code[e[0]] |= 1 if len(e) == 1 else 2
            if len(e) > 1:
                pairs[_pair_slot(np.int64(e[0]), np.int64(e[1]))] = True
        self._hash_weights = tf.constant(R[np.newaxis], tf.int64)  # (1, L)
        self._entry_hashes = tf.constant(
            np.append(hashes[order], np.iinfo(np.int64).max)[np.newaxis], tf.int64)  # (1, E+1)
        self._entry_ids = tf.constant(padded)  # (E + 1, L), -1 after the entry; last row: none
        self._entry_lengths = tf.constant(lengths)
        self._start_code = tf.constant(start_code)
        self._pairs = tf.constant(pairs)

    def _match_lengths(self, ids, selectable, start):
        """Length in tokens of the longest lexicon match starting at each token (0 if none);
        a match starts at a word start, ends at a word end and holds selectable tokens only.

        One pass: only the positions whose token begins some entry and whose next token can
        continue one (a `[V]` table) look up their windows of 1..L tokens, all lengths at once
        (hash, sorted search); the ids are checked at the hash hits only (`_window_lengths`)."""
        T = tf.shape(ids)[1]
        band = tf.bitwise.bitwise_and
        # A word ends at t when t + 1 does not continue it.
        word_end = selectable & ~_shift_left(selectable & ~start, 1, False)
        # Live starts, a superset of the match starts: a word start whose id is a one-token
        # entry, or begins a longer entry together with the next id (a hashed pair table; on
        # the benchmark's lexicons 3x fewer live starts than "the next id is some entry's
        # second one" for the gazetteer, whose names often begin with a common word, 1.7x for
        # the phrases).
        sc = tf.gather(self._start_code, ids)
        pair = tf.gather(self._pairs, _pair_slot(ids, _shift_left(ids, 1, 0)))
        alive = start & ((band(sc, 1) > 0) | ((band(sc, 2) > 0) & pair))
        where = tf.cast(tf.where(alive), tf.int32)  # (K, 2) rows, columns of live starts
        # One gather for ids, selectability and word ends: id * 4 + 2 * selectable + end.
        code = ids * 4 + tf.cast(selectable, tf.int32) * 2 + tf.cast(word_end, tf.int32)
        code = tf.reshape(code, [-1])
        # Entries longer than the rows can never match (a hit needs the entry's length): the
        # windows stop at the row length, however long the longest entry. A static row length
        # gives the width at trace time; else the narrowest of a few widths (doubling) that
        # covers the batch's rows is chosen at run time, and only its branch runs.
        widths = _window_widths(self.max_unit_length, ids.shape[1])
        if len(widths) == 1:
            best_k = self._window_lengths(where, code, T, widths[0])
        else:
            narrower = tf.reduce_sum(tf.cast(tf.constant(widths[:-1]) < T, tf.int32))
            best_k = tf.switch_case(narrower, [
                functools.partial(self._window_lengths, where, code, T, L) for L in widths])
        return tf.scatter_nd(where, best_k, tf.shape(ids))

    def _window_lengths(self, where, code, T, L):
        """The longest match of at most `L` tokens at each live start `where` (K, 2) of the
        [B, T] rows (`code`: the flat id * 4 + 2 * selectable + word end), 0 if none: (K,)."""
        band = tf.bitwise.bitwise_and
        l_range = tf.range(L)[tf.newaxis, :]
        cols = where[:, 1:] + l_range  # (K, L)
        inside = cols < T
        at = tf.where(inside, where[:, :1] * T + cols, 0)
        code = tf.where(inside, tf.gather(code, at), 0)
        window = tf.bitwise.right_shift(code, 2)  # (K, L)
        not_ok = 1 - tf.bitwise.right_shift(band(code, 2), 1)
        sel_prefix = tf.equal(_cumsum(not_ok, tri=_triangular(L)), 0)  # all selectable so far
        terms = tf.unstack(tf.cast(window, tf.int64) * self._hash_weights[:, :L],
                           axis=1)  # L x (K,)
        hashes = [terms[0]]
        for term in terms[1:]:  # the hash of each prefix (tf.cumsum on int64 is slow on CPU)
            hashes.append(hashes[-1] + term)
        hashes = tf.stack(hashes, axis=1)  # (K, L)
        K = tf.shape(where)[0]
        slot = tf.searchsorted(self._entry_hashes, tf.reshape(hashes, [1, -1]), side="left")
        slot = tf.reshape(slot, [K, L])
        n = l_range + 1
        hit = (tf.equal(tf.gather(self._entry_hashes[0], slot), hashes)
               & tf.equal(tf.gather(self._entry_lengths, slot), n) & sel_prefix
               & (band(code, 1) > 0))
        # The id check, at the hits only (H of them: the matches, and rare hash collisions).
        kl = tf.cast(tf.where(hit), tf.int32)  # (H, 2): window, length - 1
        same = tf.reduce_all(
            tf.equal(tf.gather(self._entry_ids[:, :L], tf.gather_nd(slot, kl)),
                     tf.gather(window, kl[:, 0])) | (l_range > kl[:, 1:]), axis=1)  # (H,)
        match = tf.scatter_nd(kl, tf.cast(same, tf.int32), [K, L]) > 0
        return tf.reduce_max(tf.where(match, n, 0), axis=1)

    def _covered_words(self, ids, selectable, budget, seed):
        seed_order, _ = _split_seeds(seed, 2)
        start = self._word_starts(ids, selectable)
        lengths = self._match_lengths(ids, selectable, start)
        bits = _order_bits(seed_order, tf.shape(ids), self.prefer_units)
        word, ctok, key = _unit_words_xla(ids, selectable, start, lengths, bits,
                                          nested=self.max_unit_length > 1,
                                          prefer_units=self.prefer_units)
        covered, _ = _greedy_select(key, tf.ones_like(key), ctok, budget, max_n=1,
                                    overlaps=False)
        return word, covered

    def find_units(self, token_ids):
        """The lexicon matches the masker would use: `[B, T]` int32, the match length in tokens
        at each match's first token, 0 elsewhere (padding never matches)."""
        ids = tf.cast(tf.convert_to_tensor(token_ids), tf.int32)
        valid = (tf.ones_like(ids, tf.bool) if self.padding_token_id is None
                 else tf.not_equal(ids, self.padding_token_id))
        selectable = self._selectable(ids, valid)
        start = self._word_starts(ids, selectable)
        lengths = self._match_lengths(ids, selectable, start)
        if self.max_unit_length > 1:  # leftmost-longest, non-overlapping
            lengths = tf.where(_leftmost_longest_xla(lengths)[0], lengths, 0)
        return lengths

    def get_config(self):
        config = super().get_config()
        config.update({self._lexicon_arg: self.lexicon_ids, "prefer_units": self.prefer_units})
        return config


class PhraseMasker(_LexiconMasker):
    """ERNIE phrase-level masking (Sun et al. 2019, "ERNIE: Enhanced Representation through
    Knowledge Integration"): whole phrases are masked and predicted, not independent pieces.

    A phrase is a lexicon entry: `phrases` is a list of strings (tokenized with `tokenizer`, the
    model's tokenizer, e.g. `kb.preprocessing.WordPieceTokenizer`) or of token-id sequences. Use
    your own lexicon (a chunker's output, a terminology list) or collocations learned from the
    corpus with `kb.preprocessing.learn_phrases(corpus)` (PMI). In each row the occurrences of
    phrases are found (whole words only: a match starts at a word start and ends at a word end;
    overlapping occurrences are resolved leftmost-longest), and every occurrence becomes one
    unit; words outside phrases are units of their own. Units are masked whole within BERT's
    budget (`TokenMasker`'s `num_to_predict`, counted in pieces; a unit that would overshoot is
    skipped, as `WholeWordMasker`'s words), 80/10/10 per piece. With `prefer_units=True`
    (default) the phrase units are visited first, in random order, then the plain words fill
    the budget: the stage masks phrases wherever a row has them. `prefer_units=False` visits all
    units in one uniformly random order (each unit equally likely, as ERNIE's per-unit draw).

    Same arguments (keras-hub `MaskedLMMaskGenerator`'s, then `TokenMasker`'s) and outputs as
    the other maskers; `find_units(token_ids)` shows the matched phrases.

    Example:
    >>> vocab = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "new", "york", "is", "big", "##ger"]
    >>> masker = PhraseMasker(vocabulary=vocab, phrases=[[4, 5]], seed=1,
    ...                       unselectable_token_ids=(0, 1, 2), mask_selection_rate=0.3)
    >>> out = masker(tf.constant([[1, 4, 5, 6, 7, 8, 2]]))
    >>> out["mask_positions"].numpy()[0, :2].tolist()  # "new york", whole
    [1, 2]
    """

    _lexicon_arg = "phrases"

    def __init__(self, *args, phrases=None, tokenizer=None, prefer_units=True, **kwargs):
        super().__init__(*args, lexicon=phrases, tokenizer=tokenizer, prefer_units=prefer_units,
                         **kwargs)


class EntityMasker(_LexiconMasker):
    """ERNIE entity-level masking (Sun et al. 2019): whole named-entity mentions are masked.

    Mentions are found with a gazetteer, `entities` (names as strings with `tokenizer`, or as
    token-id sequences), by a vectorized matcher in TF ops (every position that begins some
    name looks up all its windows at once; the result equals a sequential whole-word,
    leftmost-longest scan, as Aho-Corasick's with that rule). Every mention is masked whole or not at all; otherwise as
    `PhraseMasker` (same arguments and outputs; `prefer_units=True` masks mentions first).

    Example:
    >>> vocab = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "harry", "potter", "is", "a", "wizard"]
    >>> masker = EntityMasker(vocabulary=vocab, entities=[[4, 5]], seed=1,
    ...                       unselectable_token_ids=(0, 1, 2), mask_selection_rate=0.3)
    >>> masker.find_units(tf.constant([[1, 4, 5, 6, 7, 8, 2]])).numpy().tolist()
    [[0, 2, 0, 0, 0, 0, 0]]
    """

    _lexicon_arg = "entities"

    def __init__(self, *args, entities=None, tokenizer=None, prefer_units=True, **kwargs):
        super().__init__(*args, lexicon=entities, tokenizer=tokenizer, prefer_units=prefer_units,
                         **kwargs)


class MaskingSchedule:
    """ERNIE's multi-stage masking: one masker per training stage, e.g. basic (word-level)
    masking, then phrase-level, then entity-level (`ERNIE 1.0`'s knowledge masking schedule).

    Args:
        stages: the maskers, in order (any of this module's maskers; same
            `mask_selection_length`, so every stage has the same output shapes).
        boundaries: optional increasing ints: stage i+1 starts after `boundaries[i]` calls
            (batches, when mapped over a batched dataset). Without them the stage is set by
            `set_stage(i)` (e.g. from a Keras callback at an epoch boundary).

    Called like a masker (`schedule(token_ids, seed=None)`, `schedule.map_dataset(ds)`); only
    the current stage's masker runs (`tf.switch_case`). Under a parallel `map`, the stage
    switches within a few batches of the boundary (the calls' order is the scheduler's).

    Example:
    >>> kw = dict(vocabulary_size=100, mask_token_id=3, unselectable_token_ids=(0, 1, 2))
    >>> schedule = MaskingSchedule(
    ...     [WholeWordMasker(**kw), PhraseMasker(phrases=[[10, 11]], **kw),
    ...      EntityMasker(entities=[[12, 13, 14]], **kw)], boundaries=[1000, 2000])
    >>> out = schedule(tf.constant([[1, 10, 11, 12, 13, 14, 2]]))
    >>> int(schedule.current_stage())
    0
    """

    def __init__(self, stages, boundaries=None):
        stages = list(stages)
        if not stages:
            raise ValueError("stages must hold at least one masker")
        for s in stages:
            if not isinstance(s, _Masker):
                raise ValueError(f"stages must be maskers of this module; got {s!r}")
        lengths = {s.mask_selection_length for s in stages}
        if len(lengths) != 1:
            raise ValueError(
                f"every stage needs the same mask_selection_length; got {sorted(lengths)}")
        if boundaries is not None:
            boundaries = [int(b) for b in boundaries]
            if len(boundaries) != len(stages) - 1:
                raise ValueError(
                    f"boundaries needs {len(stages) - 1} values for {len(stages)} stages; "
                    f"got {boundaries}")
            if any(b <= 0 for b in boundaries) or boundaries != sorted(set(boundaries)):
                raise ValueError(f"boundaries must be positive and increasing; got {boundaries}")
        self.stages = stages
        self.boundaries = boundaries
        self.mask_selection_length = stages[0].mask_selection_length
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="schedule_calls")
        self._stage = tf.Variable(0, dtype=tf.int32, trainable=False, name="schedule_stage")
        self.seed = stages[0].seed

    def set_stage(self, stage):
        """Use stage `stage` from now on (only without `boundaries`)."""
        if self.boundaries is not None:
            raise ValueError("This schedule follows its boundaries; set_stage needs boundaries=None")
        if not 0 <= int(stage) < len(self.stages):
            raise ValueError(f"stage must be in [0, {len(self.stages)}); got {stage}")
        self._stage.assign(int(stage))

    def current_stage(self):
        if self.boundaries is None:
            return self._stage.read_value()
        b = tf.constant(self.boundaries, tf.int64)
        return tf.reduce_sum(tf.cast(self._calls.read_value() >= b, tf.int32))

    @tf.autograph.experimental.do_not_convert
    def __call__(self, token_ids, seed=None):
        stage = self.current_stage()
        self._calls.assign_add(1)
        branches = [
            (lambda m=m: m(token_ids, seed=seed)) for m in self.stages
        ]
        return tf.switch_case(stage, branches)

    def map_dataset(self, dataset, num_parallel_calls=tf.data.AUTOTUNE, deterministic=None):
        """As the maskers' `map_dataset` (a reproducible per-element seed)."""
        draws = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True)
        return tf.data.Dataset.zip((dataset, draws)).map(
            lambda x, s: self(x, seed=s), num_parallel_calls=num_parallel_calls,
            deterministic=deterministic)
