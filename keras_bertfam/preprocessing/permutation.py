"""XLNet's permutation-LM data: span targets, factorization orders, `perm_mask`, `target_mapping`;
and XLNet's sequence packing (`A <sep> B <sep> <cls>`, left padding).

TensorFlow ops, vectorized over the batch (the only loop is a `tf.while_loop` over span-sampling
*cycles*, each advancing every row at once), stateless random ops seeded per call.

How this matches the original code (zihangdai/xlnet `data_utils.py`)
----------------------------------------------------------------------
`_sample_mask(sp, seg, reverse, max_gram=5, goal_num_predict)` -> `sample_span_targets`:
  per cycle, n ~ p(n) ∝ 1/n on 1..max_gram, capped at `goal - num_predict`; context
  `ctx = n·alpha // beta`; `l_ctx ~ U{0..ctx-1}`; `beg = cur + l_ctx` moved right to the next start
  piece (`▁…`, `<…>`, or one punctuation character, `_is_start_piece`); the span is the n *tokens*
  `[beg, beg + n)` (the original's end search tests `seg[beg]`, always a start piece, so it counts
  tokens, not words: reproduced); the cycle stops the sampling when `beg >= len` or
  `beg + n >= len` (a span may not touch the last position: reproduced); `cur = end + ctx - l_ctx`.
  Then, while fewer than the goal are chosen, the original draws uniform positions and keeps the
  unchosen ones: here the missing k are drawn uniformly without replacement among the unchosen
  positions, the same distribution (the random streams differ: NumPy vs. TF stateless).
  `reverse=True` (bi_data backward rows) samples on the flipped sequence and flips the mask back.
  With `reuse_len`, the sequence is two parts, as `create_tfrecords`: [0, reuse_len) with goal
  `num_predict - num_predict // 2` and [reuse_len, T) with goal `num_predict // 2`.
`_local_perm(inputs, targets, is_masked, perm_size, seq_len)` -> `local_permutation` +
  `perm_mask_from_order`: the order is a random permutation of `perm_size` offsets shared by every
  block of `perm_size` positions (the original's reshape / transpose / `random_shuffle`), drawn per
  row; `<sep>` / `<cls>` are "functional" (never targets, seen only by later-ordered positions);
  non-target tokens get order -1 (seen by all, see no target); targets do not see themselves.
  `get_dataset`'s parser: the reuse part cannot attend to the rest (ones), the rest attends to all of
  the reuse part (zeros); `target_mapping` = one-hot rows of the target positions in increasing
  position, zero rows up to `num_predict`; `target` = the token ids there (the original's shifted
  `target` equals the input at every non-functional position); `target_mask` = 1 on real rows;
  `input_q` = 1 at target positions. `inputs_k` = the unchanged input ids (XLNet never replaces
  inputs with `<mask>`: the query stream starts from the mask embedding instead).
HF's `DataCollatorForPermutationLanguageModeling` differs (uniform span lengths, contexts of
`span / plm_probability`, a permutation over the whole sequence, masked input ids): not followed.

Expected fraction: a cycle spends n + n·alpha/beta tokens on n targets, about 1/7 for alpha=6,
beta=1, minus the start-piece shifts; the top-up to `num_predict` brings it to `num_predict / T`
(85 / 512 ≈ 1/6 in the original, the default here `round(T / 6)`).
"""
import keras
import numpy as np
import tensorflow as tf

from keras_bertfam.preprocessing.corpus import split_sentences
from keras_bertfam.preprocessing.packing import longest_first_lengths
from keras_bertfam.preprocessing.seeding import SeededStage
from keras_bertfam.preprocessing.preprocessors import AUTOTUNE, PretrainingPreprocessor

_INT32_MAX = 2**31 - 1
_PUNCT = set('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')


# === Start pieces ===
def is_start_piece(piece):
    """The original `_is_start_piece`: `▁…`, `<…>`, or one of its punctuation characters."""
    return piece.startswith("\u2581") or piece.startswith("<") or piece in _PUNCT


def start_piece_table(pieces):
    """A bool list over the vocabulary (ids 0..V-1, pieces in id order)."""
    return [is_start_piece(p) for p in pieces]


# === Seeds ===
def _seed(seed):
    return tf.cast(tf.convert_to_tensor(seed), tf.int64) * tf.ones([2], tf.int64)


def _fold(seed, k):
    return tf.random.experimental.stateless_fold_in(seed, k)


# === Span targets (`_sample_mask`) ===
def _next_start(is_start):
    """(B, L) bool -> (B, L) int32: the first start-piece index >= i (L if none)."""
    length = tf.shape(is_start)[1]
    idx = tf.range(length)[None, :]
    vals = tf.sort(tf.where(is_start, idx, length), axis=1)  # starts ascending, then L's
    queries = tf.broadcast_to(idx, tf.shape(is_start))
    k = tf.searchsorted(vals, queries, side="left")  # (B, L)
    k = tf.minimum(k, length - 1)
    return tf.where(tf.gather(vals, k, batch_dims=1) >= idx, tf.gather(vals, k, batch_dims=1),
                    length)


def sample_span_targets(is_start, seed, goal=None, max_gram=5, mask_alpha=6, mask_beta=1,
                        valid=None):
    """The original `_sample_mask` for a batch: (B, L) bool start pieces -> (B, L) bool targets.

    `goal`: the number of targets per row (None: spans only). `valid`: (B, L) bool, positions that
    may be chosen by the top-up (default all). Loops over cycles (<= L / (1 + alpha/beta) + 1), each
    vectorized over the batch.
    """
    is_start = tf.convert_to_tensor(is_start)
    batch, length = tf.shape(is_start)[0], tf.shape(is_start)[1]
    next_start = _next_start(is_start)
    pvals = 1.0 / np.arange(1, max_gram + 1)
    logits = tf.math.log(tf.constant(pvals / pvals.sum(), tf.float32))[None, :]
    idx = tf.range(length)[None, :]
    goal_t = tf.constant(_INT32_MAX if goal is None else int(goal), tf.int32)

    def cond(step, cur, count, done, mask):
        return tf.logical_not(tf.reduce_all(done))

    def body(step, cur, count, done, mask):
        s = _fold(seed, step)
        n = tf.random.stateless_categorical(
            tf.tile(logits, [batch, 1]), 1, _fold(s, 0), dtype=tf.int32)[:, 0] + 1  # (B,)
        n = tf.minimum(n, goal_t - count)
        ctx = (n * mask_alpha) // mask_beta
        u = tf.random.stateless_uniform([batch], _fold(s, 1))
        l_ctx = tf.minimum(tf.cast(u * tf.cast(ctx, tf.float32), tf.int32), ctx - 1)
        beg = cur + l_ctx
        beg = tf.where(beg < length, tf.gather(next_start, tf.minimum(beg, length - 1),
                                               batch_dims=1), length)
        end = beg + n
        stop = done | (count >= goal_t) | (beg >= length) | (end >= length)
        span = (idx >= beg[:, None]) & (idx < end[:, None]) & ~stop[:, None]
        mask = mask | span
        count = count + tf.where(stop, 0, n)
        cur = tf.where(stop, cur, end + ctx - l_ctx)
        return step + 1, cur, count, stop, mask

    zeros = tf.zeros([batch], tf.int32)
    rows = tf.TensorShape([None])  # a static batch (1 row) is not the body's: a traced loop
    _, _, count, _, mask = tf.while_loop(  # refused batch_size=1 ("enters the loop with shape")
        cond, body, [tf.constant(0, tf.int64), zeros, zeros, tf.zeros([batch], tf.bool),
                     tf.zeros_like(is_start, tf.bool)],
        shape_invariants=[tf.TensorShape([]), rows, rows, rows, tf.TensorShape([None, None])])
    if goal is not None:  # top-up: uniform without replacement among the unchosen positions
        free = ~mask if valid is None else (~mask & valid)
        keys = tf.random.stateless_uniform(tf.shape(mask), _fold(seed, -1))
        keys = tf.where(free, keys, 2.0)
        rank = tf.argsort(tf.argsort(keys, axis=1), axis=1)  # rank of each position
        mask = mask | (free & (rank < (goal_t - count)[:, None]))
    return mask


# === Factorization order and perm_mask (`_local_perm`) ===
def local_permutation(batch, length, perm_size, seed):
    """(B, L) int32 order rank of each position: one random permutation of `perm_size` offsets per
    row, applied to every block of `perm_size` consecutive positions (blocks stay in order).

        perm_size 3, offsets permuted as [2, 0, 1]:  positions 0 1 2 | 3 4 5
                                                     rank      2 0 1 | 5 3 4
    """
    if length % perm_size:
        raise ValueError(f"length {length} is not a multiple of perm_size {perm_size}.")
    keys = tf.random.stateless_uniform([batch, perm_size], seed)
    offsets = tf.cast(tf.argsort(keys, axis=1), tf.int32)  # (B, S) permutation
    blocks = tf.range(length // perm_size) * perm_size  # (L/S,)
    return tf.reshape(blocks[None, :, None] + offsets[:, None, :], [batch, length])


def perm_mask_from_order(rank, is_target, is_functional):
    """The original `_local_perm` mask from an order: (B, L) ranks -> (B, L, L) float32, 1 = i
    cannot attend to j.

    Non-target, non-functional tokens get rank -1: everyone sees them, they see no target or
    functional token. A target i sees j iff j's rank is smaller (not itself); a functional token
    (`<sep>`, `<cls>`) sees itself and earlier-ranked ones. Ranks 2 -> 0 -> 1 on three targets:

        rank [1, 2, 0]      perm_mask   j: 0 1 2
                                     i=0 [ 1 1 0 ]   (0 sees 2)
                                     i=1 [ 0 1 0 ]   (1 sees 0 and 2)
                                     i=2 [ 1 1 1 ]   (2 is first: sees nothing)
    """
    rank = tf.cast(rank, tf.int32)
    non_mask = ~is_target & ~is_functional
    rev = tf.where(non_mask, -1, rank)
    target = is_target & ~is_functional
    self_rev = tf.where(target, rev, rev + 1)
    blocked = (self_rev[:, :, None] <= rev[:, None, :]) & ~non_mask[:, None, :]
    return tf.cast(blocked, tf.float32)


# === The masker ===
@keras.saving.register_keras_serializable(package="keras_bertfam")
class PermutationMasker(SeededStage):
    """XLNet's permutation-LM targets and masks for a batch of packed sequences (Yang et al. 2019).

    Args:
        sequence_length: T.
        num_predict: prediction slots P (default `round(T / 6)`, 85 for 512 as the original).
        reuse_len: split into a memory part [0, reuse_len) and the rest, as the original
            (None: one part).
        perm_size: block size of the factorization order (default: the part length; the
            original uses reuse_len).
        max_gram, mask_alpha, mask_beta: span sampling (5, 6, 1).
        start_pieces: bool per vocabulary id, True for start pieces (`start_piece_table`); None:
            every token starts a word.
        sep_token_id, cls_token_id: the functional tokens.
        seed: int.

    Call: `masker(token_ids, seed=None, reverse=None, padding_mask=None)` with token_ids (B, T)
    int; `seed` a per-call int (or [2] tensor) for reproducibility under parallel maps (default: a
    call counter); `reverse` (B,) bool rows sampled right-to-left (bi_data). Returns a dict of
    `token_ids` (B, T) (unchanged, the content-stream input), `perm_mask` (B, T, T) float32,
    `target_mapping` (B, P, T) float32, `target` (B, P) int32, `target_mask` (B, P) float32,
    `input_q` (B, T) float32, `is_masked` (B, T) bool (sampled, before removing functional tokens).

    Example:
    >>> masker = PermutationMasker(12, num_predict=2, sep_token_id=4, cls_token_id=3, seed=1)
    >>> out = masker(tf.constant([[10, 11, 12, 13, 14, 15, 16, 17, 4, 18, 4, 3]]))
    >>> out["perm_mask"].shape, out["target_mapping"].shape
    (TensorShape([1, 12, 12]), TensorShape([1, 2, 12]))
    """

    def __init__(self, sequence_length, num_predict=None, reuse_len=None, perm_size=None,
                 max_gram=5, mask_alpha=6, mask_beta=1, start_pieces=None, sep_token_id=4,
                 cls_token_id=3, seed=None):
        self.sequence_length = int(sequence_length)
        self.num_predict = int(round(sequence_length / 6)) if num_predict is None else int(
            num_predict)
        self.reuse_len = reuse_len
        parts = [sequence_length] if not reuse_len else [reuse_len, sequence_length - reuse_len]
        self.perm_size = perm_size or min(parts)
        for p in parts:
            if p % self.perm_size:
                raise ValueError(f"Part length {p} is not a multiple of perm_size "
                                 f"{self.perm_size}.")
        if self.num_predict < 1 or self.num_predict > sequence_length:
            raise ValueError(f"num_predict must be in [1, {sequence_length}], got {num_predict}.")
        self.max_gram, self.mask_alpha, self.mask_beta = max_gram, mask_alpha, mask_beta
        self.start_pieces = None if start_pieces is None else [bool(x) for x in start_pieces]
        self.sep_token_id, self.cls_token_id = sep_token_id, cls_token_id
        self._init_seed(seed)
        self._parts = parts

    seed_salt = 0x9E2D  # seeding: `SeededStage` (`_call_key`, `map_dataset`)

    def _map_element(self, x, seed):
        """`map_dataset` takes (B, T) token ids or dicts with "token_ids"."""
        return self(x if not isinstance(x, dict) else x["token_ids"], seed=seed)

    def __call__(self, token_ids, seed=None, reverse=None, padding_mask=None):
        token_ids = tf.cast(tf.convert_to_tensor(token_ids), tf.int32)
        batch = tf.shape(token_ids)[0]
        key = self._call_key(seed)
        functional = tf.equal(token_ids, self.sep_token_id) | tf.equal(token_ids,
                                                                       self.cls_token_id)
        valid = tf.ones_like(functional) if padding_mask is None else tf.cast(padding_mask,
                                                                             tf.bool)
        if self.start_pieces is None:
            is_start = tf.ones_like(functional)
        else:
            is_start = tf.gather(tf.constant(self.start_pieces), token_ids)
        goals = ([self.num_predict] if len(self._parts) == 1 else
                 [self.num_predict - self.num_predict // 2, self.num_predict // 2])
        masks, ranks, offset = [], [], 0
        for k, (part, goal) in enumerate(zip(self._parts, goals)):
            start = is_start[:, offset:offset + part]
            ok = valid[:, offset:offset + part]
            if reverse is not None:
                flip = tf.cast(reverse, tf.bool)[:, None]
                start = tf.where(flip, tf.reverse(start, [1]), start)
                ok = tf.where(flip, tf.reverse(ok, [1]), ok)
            m = sample_span_targets(start, _fold(key, 10 + k), goal, self.max_gram,
                                    self.mask_alpha, self.mask_beta, valid=ok)
            if reverse is not None:
                m = tf.where(flip, tf.reverse(m, [1]), m)
            masks.append(m & valid[:, offset:offset + part])
            ranks.append(local_permutation(batch, part, self.perm_size, _fold(key, 20 + k)))
            offset += part
        is_masked = tf.concat(masks, axis=1)  # (B, T)
        blocks = []
        offset = 0
        for k, part in enumerate(self._parts):
            sl = slice(offset, offset + part)
            blocks.append(perm_mask_from_order(ranks[k], is_masked[:, sl], functional[:, sl]))
            offset += part
        if len(blocks) == 1:
            perm_mask = blocks[0]
        else:  # the reuse part cannot see the rest; the rest sees all of the reuse part
            r, rest = self._parts
            top = tf.concat([blocks[0], tf.ones([batch, r, rest])], axis=2)
            bottom = tf.concat([tf.zeros([batch, rest, r]), blocks[1]], axis=2)
            perm_mask = tf.concat([top, bottom], axis=1)
        is_target = is_masked & ~functional  # (B, T)
        return dict(token_ids=token_ids, perm_mask=perm_mask,
                    is_masked=is_masked, input_q=tf.cast(is_target, tf.float32),
                    **target_slots(token_ids, is_target, self.num_predict))

    def get_config(self):
        return dict(sequence_length=self.sequence_length, num_predict=self.num_predict,
                    reuse_len=self.reuse_len, perm_size=self.perm_size, max_gram=self.max_gram,
                    mask_alpha=self.mask_alpha, mask_beta=self.mask_beta,
                    start_pieces=self.start_pieces, sep_token_id=self.sep_token_id,
                    cls_token_id=self.cls_token_id, seed=self.seed)

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def target_slots(token_ids, is_target, num_predict):
    """(B, T) targets -> `target_mapping` (B, P, T) one-hot in increasing position, zero rows after
    the last target; `target` (B, P) ids (0 on empty rows); `target_mask` (B, P) float32."""
    length = tf.shape(token_ids)[1]
    idx = tf.range(length)[None, :]
    key = tf.where(is_target, idx, idx + length)  # targets first, each group by position
    order = tf.argsort(key, axis=1)[:, :num_predict]  # (B, P)
    count = tf.reduce_sum(tf.cast(is_target, tf.int32), axis=1, keepdims=True)
    real = tf.range(num_predict)[None, :] < count  # (B, P)
    mapping = tf.one_hot(order, length, dtype=tf.float32) * tf.cast(real, tf.float32)[:, :, None]
    target = tf.where(real, tf.gather(token_ids, order, batch_dims=1), 0)
    return dict(target_mapping=mapping, target=target, target_mask=tf.cast(real, tf.float32))


# === Raw text -> PLM batches ===
def _first_at_least(cumsum, values):
    """(N,) inclusive cumsum of start flags, (...) int values -> the first index i with
    cumsum[i] >= value (N if none): the position of the value-th start (1-based)."""
    flat = tf.reshape(values, [-1])
    found = tf.searchsorted(cumsum, tf.cast(flat, cumsum.dtype), side="left")
    return tf.reshape(tf.cast(found, tf.int32), tf.shape(values))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class XLNetPreprocessor(PretrainingPreprocessor):
    """Documents -> XLNet permutation-LM batches, after the original data pipeline
    (zihangdai/xlnet `data_utils.py`: `_create_data`, `batchify`, `create_tfrecords`,
    `_split_a_and_b`), vectorized in TensorFlow.

    1. Each document is split into sentences and tokenized; sentences are concatenated into one
       token stream with `<eod>` after every document (`use_eod`); a sentence boundary is where
       the original's alternating sentence id flips (the `<eod>` is a sentence of its own).
    2. The stream is cut into windows of `B · row_len` tokens, each reshaped to B parallel rows
       (`batchify`), `row_len = window_steps · R + (T - R - 3) + 1` with R = `reuse_len`.
    3. Step s of a window gives one batch: row b's example is its tokens [s·R, s·R + R) (the
       reuse part), then `A <sep> B <sep> <cls>` with A + B = T - R - 3 tokens from
       `_split_a_and_b` at position s·R + R: the cut points are the sentence boundaries inside the
       next T - R - 3 tokens; with probability 1/2 (or when there is none) B is a random span of
       the window extended to whole sentences (the original draws it from the whole data of the
       host), else A ends at a random cut point and B continues the text; then the longer of A / B
       loses tokens on the right until they fit (`longest_first_lengths`). No padding: every
       example has exactly T tokens, as the original's. Segment ids: reuse + A + `<sep>` 0,
       B + `<sep>` 1, `<cls>` 2.
    4. `PermutationMasker` (two parts, [0, R) and [R, T), `num_predict` split between them as
       the original) gives `perm_mask`, `target_mapping`, `target`, `target_mask`.

    So batch s + 1 row b continues row b of batch s (its reuse part starts where batch s's reuse
    part ends): the layout segment recurrence needs (`XLNetPretrainer(memory_batch_size=B)` with
    the backbone's `reuse_len` = R). Batches are never shuffled after chunking. What is
    simplified: the streams are B rows of a window rather than of the whole corpus (row b jumps to
    new text every `window_steps` batches, as the original's rows do at each of its data files);
    the random B comes from the current window; the NSP-style label is not returned (XLNet's loss
    does not use it); no `bi_data` (backward rows).

    Returns `(x, y, sample_weight)`: x = {token_ids, segment_ids, padding_mask, perm_mask,
    target_mapping}, y = `target` (B, P), sample_weight = `target_mask` (B, P).

    Args:
        tokenizer: an `XLNetTokenizer` (any tokenizer with `sep_token_id` / `cls_token_id`).
        sequence_length: T.
        reuse_len: R (default T // 2, as the original's 256 of 512).
        num_predict, perm_size, max_gram, mask_alpha, mask_beta: `PermutationMasker`'s.
        batch_size: B, the number of parallel streams.
        window_steps: batches per window (continuity of each row's stream).
        use_eod: put `<eod>` after each document (needs the tokenizer's `eod_token_id`).
        seed: seeds the A/B splits and the masks (per element, `Dataset.random(seed)`).

    Example:
    >>> pre = XLNetPreprocessor(tokenizer, sequence_length=64, batch_size=8)  # doctest: +SKIP
    >>> x, y, w = next(iter(pre.prepare(kb.preprocessing.read_corpus())))  # doctest: +SKIP
    """

    def __init__(self, tokenizer, sequence_length=128, reuse_len=None, num_predict=None,
                 perm_size=None, max_gram=5, mask_alpha=6, mask_beta=1, batch_size=32,
                 window_steps=32, use_eod=True, seed=None, **kwargs):
        kwargs.pop("masker", None)
        if kwargs.get("group_by_length"):
            raise ValueError("XLNetPreprocessor takes no group_by_length=True: its examples have "
                             "no padding (each is exactly sequence_length tokens), and row b of "
                             "a batch continues row b of the batch before (segment recurrence).")
        reuse_len = sequence_length // 2 if reuse_len is None else int(reuse_len)
        if not 0 < reuse_len <= sequence_length - 5:
            raise ValueError(f"reuse_len must be in [1, sequence_length - 5] (A, B and the three "
                             f"special tokens need room), got {reuse_len}.")
        for role in ("sep", "cls"):
            # the role's token, by name; its id may come later (a `.keras` file's tokenizer gets
            # its vocabulary after this layer is built: see `masker`)
            if getattr(tokenizer, f"{role}_token", None) is None and getattr(
                    tokenizer, f"{role}_token_id", None) is None:
                raise ValueError(f"The tokenizer has no {role}_token_id: XLNet needs <sep> and "
                                 f"<cls>.")
        # The masker's sizes, checked now; its token ids and start pieces are the tokenizer's,
        # read when it is first used (`masker`).
        template = PermutationMasker(
            sequence_length, num_predict=num_predict, reuse_len=reuse_len, perm_size=perm_size,
            max_gram=max_gram, mask_alpha=mask_alpha, mask_beta=mask_beta, sep_token_id=None,
            cls_token_id=None, seed=seed if seed is not None else 0)
        super().__init__(tokenizer, sequence_length, template, batch_size, seed, **kwargs)
        self.reuse_len = reuse_len
        self.num_predict = template.num_predict
        self.perm_size = template.perm_size
        self.max_gram, self.mask_alpha, self.mask_beta = max_gram, mask_alpha, mask_beta
        self.window_steps = int(window_steps)
        self.use_eod = use_eod
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps}.")
        self.row_len = self.window_steps * reuse_len + (sequence_length - reuse_len - 3) + 1
        self.window_tokens = self.batch_size * self.row_len

    masker_in_config = False  # made from the other arguments and the tokenizer's ids

    # === The tokenizer's ids, read when used ===
    # A tokenizer restored from a `.keras` file gets its vocabulary (so its special ids) after
    # this layer is constructed: ids read at construction were None, and `load_model` of an
    # XLNetPretrainer failed ("The tokenizer has no sep_token_id"). As the pretraining
    # preprocessors' packers (`PretrainingPreprocessor.packer`), the masker and `<eod>` follow
    # the tokenizer's ids.
    @property
    def masker(self):
        """The `PermutationMasker`: the sizes given at construction, the tokenizer's `<sep>` and
        `<cls>` ids and its word-start pieces (SentencePiece's `\u2581`), remade when they change."""
        tok = self.tokenizer
        ids = (tok.sep_token_id, tok.cls_token_id)
        for role, value in zip(("sep", "cls"), ids):
            if value is None:
                raise ValueError(f"The tokenizer has no {role}_token_id: XLNet needs <sep> and "
                                 f"<cls> (a tokenizer without its vocabulary yet has no ids).")
        key = ids + (int(tok.vocabulary_size()),)
        cached = self.__dict__.get("_masker_for_ids")
        if cached is None or cached[0] != key:
            vocabulary = tok.get_vocabulary()
            start_pieces = (start_piece_table(vocabulary)
                            if any(p.startswith("\u2581") for p in vocabulary) else None)
            config = dict(self._masker_template.get_config(), start_pieces=start_pieces,
                          sep_token_id=ids[0], cls_token_id=ids[1])
            cached = (key, PermutationMasker.from_config(config))
            object.__setattr__(self, "_masker_for_ids", cached)
        return cached[1]

    @masker.setter
    def masker(self, template):
        # `PretrainingPreprocessor.__init__` sets the masker: here, its sizes
        object.__setattr__(self, "_masker_template", template)

    def __setattr__(self, name, value):
        if name == "masker":  # the setter above (Keras' own first reads the getter)
            return object.__setattr__(self, name, value)
        return super().__setattr__(name, value)

    @property
    def eod_token_id(self):
        """The tokenizer's `<eod>` put after each document (None: `use_eod=False`, or none)."""
        return getattr(self.tokenizer, "eod_token_id", None) if self.use_eod else None

    # === Stream ===
    def token_stream(self, texts):
        """Strings [D] -> (ids (N,), starts (N,) bool): the documents' tokens in order, `<eod>`
        after each, starts True at the first token of each sentence."""
        sentences = split_sentences(texts)  # [D, (S)]
        ids = tf.cast(self.tokenizer(sentences.flat_values), tf.int32)  # [N_s, (L)]
        docs = tf.RaggedTensor.from_row_splits(ids, sentences.row_splits)  # [D, (S), (L)]
        if self.eod_token_id is not None:
            n = tf.shape(texts, out_type=tf.int64)[0]
            ones = tf.ones([n], tf.int64)
            eod = tf.RaggedTensor.from_row_lengths(tf.RaggedTensor.from_row_lengths(
                tf.fill([n], tf.constant(self.eod_token_id, tf.int32)), ones), ones)
            docs = tf.concat([docs, eod], axis=1)
        sents = docs.values  # [N_s', (L)] in stream order
        starts = tf.equal(tf.ragged.range(sents.row_lengths()), 0)
        return sents.flat_values, starts.flat_values

    # === Windows -> examples ===
    def window_examples(self, window, seed=None):
        """One window (ids (W,), starts (W,)) -> `window_steps` batches (S, B, T) of token_ids
        and segment_ids (stacked along the first axis, in step order)."""
        ids, starts = window
        ids = tf.reshape(tf.cast(ids, tf.int32), [self.window_tokens])
        starts = tf.reshape(tf.cast(starts, tf.bool), [self.window_tokens])
        seed = tf.cast(tf.convert_to_tensor(0 if seed is None else seed), tf.int64)
        if seed.shape.rank == 0:  # an int; `_seeded_map` passes a [2] seed
            seed = _seed(seed)
        steps, rows, reuse, length = (self.window_steps, self.batch_size, self.reuse_len,
                                      self.sequence_length)
        tot = length - reuse - 3
        total = self.window_tokens
        cumsum = tf.cumsum(tf.cast(starts, tf.int32))  # (W,) inclusive
        row_start = (tf.range(rows) * self.row_len)[None, :]  # (1, B)
        begin = row_start + (tf.range(steps)[:, None] + 1) * reuse  # (S, B) A's first position
        row_end = row_start + self.row_len
        # Cut points: sentence starts p with begin < p < begin + tot.
        base = tf.gather(cumsum, begin)
        count = tf.gather(cumsum, begin + tot - 1) - base  # (S, B)
        shape = tf.shape(begin)
        u_label = tf.random.stateless_uniform(shape, _fold(seed, 1))
        u_cut = tf.random.stateless_uniform(shape, _fold(seed, 2))
        u_b = tf.random.stateless_uniform(shape, _fold(seed, 3))
        k = tf.minimum(tf.cast(u_cut * tf.cast(count, tf.float32), tf.int32),
                       tf.maximum(count - 1, 0))
        cut = _first_at_least(cumsum, base + k + 1)  # (S, B)
        after = tf.gather(cumsum, begin + tot - 1) + 1  # the first start at >= begin + tot
        end_idx = tf.minimum(_first_at_least(cumsum, after), row_end)
        random_b = (count == 0) | (u_label < 0.5)  # the original's label 0
        a_end = tf.where(count == 0, end_idx, cut)
        # Label 0: a random span of b_len tokens of the window, grown to whole sentences.
        b_len = tf.maximum(1, tot - (a_end - begin))
        rb_begin = tf.cast(u_b * tf.cast(total - b_len, tf.float32), tf.int32)
        rb_begin = tf.minimum(rb_begin, total - 1 - b_len)
        c_begin = tf.gather(cumsum, rb_begin)
        rb_begin = tf.where(c_begin > 0, _first_at_least(cumsum, c_begin), 0)
        rb_end = rb_begin + b_len
        rb_end = tf.minimum(_first_at_least(cumsum, tf.gather(cumsum, rb_end - 1) + 1),
                            total - 1)
        rb_end = tf.maximum(rb_end, rb_begin + b_len)
        b_begin = tf.where(random_b, rb_begin, a_end)
        b_end = tf.where(random_b, rb_end, end_idx)
        len_a, len_b = longest_first_lengths(a_end - begin, b_end - b_begin, tot)  # (S, B)
        # Gather the layout [reuse | A | <sep> | B | <sep> | <cls>] position by position.
        t = tf.range(length)[None, None, :]  # (1, 1, T)
        q = t - reuse
        la, lb = len_a[..., None], len_b[..., None]
        src = tf.where(t < reuse, begin[..., None] - reuse + t,
                       tf.where(q < la, begin[..., None] + q, b_begin[..., None] + q - la - 1))
        src = tf.clip_by_value(src, 0, total - 1)
        tokens = tf.gather(ids, src)  # (S, B, T)
        sep = (q == la) | (q == la + lb + 1)
        tokens = tf.where(sep, self.tokenizer.sep_token_id, tokens)
        tokens = tf.where(q == la + lb + 2, self.tokenizer.cls_token_id, tokens)
        segments = tf.where(q <= la, 0, tf.where(q <= la + lb + 1, 1, 2))
        return {"token_ids": tokens, "segment_ids": tf.cast(segments, tf.int32)}

    # === Masking ===
    def call(self, inputs, seed=None):
        """A (B, T) batch {token_ids, segment_ids} -> (x, target, target_mask)."""
        token_ids = tf.cast(inputs["token_ids"], tf.int32)
        out = self.masker(token_ids, seed=seed)
        x = {"token_ids": token_ids, "segment_ids": tf.cast(inputs["segment_ids"], tf.int32),
             "padding_mask": tf.ones_like(token_ids), "perm_mask": out["perm_mask"],
             "target_mapping": out["target_mapping"]}
        return x, out["target"], out["target_mask"]

    def no_batch_hint(self):
        """Why data may give no batch (a task's `fit` says it when none came)."""
        return (f"XLNetPreprocessor cuts the token stream into windows of batch_size * row_len "
                f"= {self.batch_size} * {self.row_len} = {self.window_tokens} tokens and drops "
                "the last partial window: the data must hold at least that many tokens (pass "
                "more text, or a smaller batch_size or sequence_length).")

    def _batches_of(self, input_batches):
        return None  # as many windows as the text's tokens fill

    def prepare(self, ds, training=True, batch_size=None):
        ds = self._batched_strings(ds)
        stream = ds.map(self._traced(self.token_stream), num_parallel_calls=AUTOTUNE)
        windows = stream.unbatch().batch(self.window_tokens, drop_remainder=True)
        batches = self._seeded_map(windows, self.window_examples, salt=3).unbatch()
        return self._seeded_map(batches, self, salt=1, last=True).prefetch(AUTOTUNE)

    def get_config(self):
        config = super().get_config()
        config.update(reuse_len=self.reuse_len, num_predict=self.num_predict,
                      perm_size=self.perm_size, max_gram=self.max_gram,
                      mask_alpha=self.mask_alpha, mask_beta=self.mask_beta,
                      window_steps=self.window_steps, use_eod=self.use_eod)
        return config

