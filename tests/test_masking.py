"""Tests of the masking engine (keras_bertfam/preprocessing/masking.py). TensorFlow backend.

Statistical tests use fixed seeds and tolerances of >= 3 standard errors around the papers'
numbers; the exactness tests compare the vectorized greedy selection with a plain NumPy
transcription of the original sequential loops, candidate for candidate.
"""
import importlib
import numpy as np
import pytest
import tensorflow as tf

from keras_bertfam.preprocessing import masking as M

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = (PAD, CLS, SEP)
I32 = 2**31 - 1

# A small WordPiece-style vocabulary: ids 4..99 start words, 100..199 are "##" continuations.
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(4, 100)] + [
    f"##p{i}" for i in range(100, 200)
]
V = len(VOCAB)


def batch(rng, B, T, lo=4, hi=V, min_len=8, sep_at=None):
    """[CLS] random ids ... [SEP], zero padded; random lengths in [min_len, T]."""
    ids = rng.integers(lo, hi, size=(B, T))
    lengths = rng.integers(min_len, T + 1, size=B)
    for b, n in enumerate(lengths):
        ids[b, 0] = CLS
        ids[b, n - 1] = SEP
        if sep_at is not None and sep_at < n - 1:
            ids[b, sep_at] = SEP
        ids[b, n:] = PAD
    return tf.constant(ids, tf.int32), lengths


def np_out(out):
    return {k: v.numpy() for k, v in out.items()}


def check_common(ids, out, budget=None):
    """Invariants every masker must satisfy."""
    ids = np.asarray(ids)
    o = np_out(out)
    pos, w, mids, tok = o["mask_positions"], o["mask_weights"], o["mask_ids"], o["token_ids"]
    B, P = pos.shape
    for b in range(B):
        k = int(w[b].sum())
        assert np.all(w[b, :k] == 1.0) and np.all(w[b, k:] == 0.0)
        real = pos[b, :k]
        assert np.all(np.diff(real) > 0), "positions ascending, no duplicates"
        assert np.all(pos[b, k:] == 0) and np.all(mids[b, k:] == 0)
        assert np.array_equal(mids[b, :k], ids[b, real])
        assert not np.isin(ids[b, real], SPECIAL).any(), "special token selected"
        untouched = np.ones(ids.shape[1], bool)
        untouched[real] = False
        assert np.array_equal(tok[b, untouched], ids[b, untouched])
        if budget is not None:
            assert k <= budget[b]
    return o


def bert_budget(lengths, rate=0.15, P=20):
    return np.minimum(P, np.maximum(1, np.array([round(n * rate) for n in lengths])))


# === TokenMasker ===


def test_token_masker_fraction_split_and_specials():
    rng = np.random.default_rng(0)
    ids, lengths = batch(rng, 2000, 128, sep_at=60)
    masker = M.TokenMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                           seed=1)
    out = masker(ids)
    o = check_common(ids, out)
    k = o["mask_weights"].sum(1)
    np.testing.assert_array_equal(k, bert_budget(lengths))  # BERT's count, exactly
    frac = k.sum() / lengths.sum()
    assert abs(frac - 0.15) < 0.005, frac
    real = o["mask_weights"] > 0
    new = np.take_along_axis(o["token_ids"], o["mask_positions"], 1)[real]
    orig = o["mask_ids"][real]
    n = real.sum()
    is_mask = (new == MASK).mean()
    is_random = ((new != MASK) & (new != orig)).mean()
    is_same = (new == orig).mean()
    # random draws hit the original id with probability 1/|pool|
    pool = V - 4
    assert abs(is_mask - 0.8) < 4 * np.sqrt(0.16 / n)
    assert abs(is_random - 0.1 * (1 - 1 / pool)) < 4 * np.sqrt(0.09 / n)
    assert abs(is_same - 0.1 * (1 + 1 / pool)) < 4 * np.sqrt(0.09 / n)
    randoms = new[(new != MASK) & (new != orig)]
    assert not np.isin(randoms, SPECIAL + (MASK,)).any(), "random replacement is special"


def test_token_masker_selection_is_uniform():
    # Every non-special position equally likely (the original shuffles, then takes a prefix).
    ids = tf.constant([[CLS] + list(range(10, 40)) + [SEP]] * 4000)
    masker = M.TokenMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                           seed=2, mask_selection_length=8)
    o = np_out(masker(ids))
    counts = np.bincount(o["mask_positions"][o["mask_weights"] > 0], minlength=32)
    assert counts[0] == 0 and counts[31] == 0
    expected = 4000 * 5 / 30  # round(32 * 0.15) = 5 of 30 candidates
    assert np.all(np.abs(counts[1:31] - expected) < 4 * np.sqrt(expected))


@pytest.mark.parametrize("T", [5, 37, 300])
def test_token_selection_is_top_k_of_its_keys_in_position_order(T):
    # The `budget` selectable tokens with the largest keys, ties to the lower position (what
    # `top_k` picks), as ascending positions; keys on a coarse grid in half the rows (many
    # ties), P > T, rows wider than 256 (int64 order), empty budgets and rows.
    rng = np.random.default_rng(T)
    B, P = 64, 20
    keys = rng.integers(0, 1 << 23, (B, T)) / 2.0**23  # stateless_uniform's float32 grid
    keys[::2] = rng.integers(0, 4, (B // 2, T)) / 4.0
    selectable = rng.random((B, T)) < 0.8
    selectable[1] = False
    budget = rng.integers(0, P + 1, B)
    pos, w = M._top_budget_xla(tf.constant(keys, tf.float32), tf.constant(selectable),
                               tf.constant(budget, tf.int32), P=P)
    for b in range(B):
        cand = np.flatnonzero(selectable[b])
        best = cand[np.lexsort((cand, -keys[b, cand]))][: budget[b]]
        want = np.zeros(P, np.int32)
        want[: len(best)] = np.sort(best)
        np.testing.assert_array_equal(pos.numpy()[b], want)
        np.testing.assert_array_equal(w.numpy()[b], np.arange(P) < len(best))


def test_token_masker_has_no_top_k():
    # TF's CPU `top_k` of the [B, T] keys (and the sort of the chosen positions) cost ~0.55 ms
    # of the ~1.8 ms of CPU a [128, 128] batch took (bench/bench_masking.py, issue #15).
    m = M.TokenMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                      seed=0)
    f = tf.function(lambda x: m(x, seed=1)).get_concrete_function(
        tf.TensorSpec([None, None], tf.int32))
    graph = f.graph.as_graph_def()
    ops = {n.op for n in graph.node}
    ops |= {n.op for fn in graph.library.function for n in fn.node_def}
    assert not ops & {"TopKV2", "Sort"}, ops & {"TopKV2", "Sort"}


def test_random_token_from_vocabulary_reproduces_bert_quirk():
    ids = tf.constant([[CLS] + [5] * 40 + [SEP]] * 500)
    kw = dict(vocabulary_size=8, mask_token_id=MASK, unselectable_token_ids=SPECIAL, seed=3,
              mask_token_rate=0.0, random_token_rate=1.0)
    quirk = np_out(M.TokenMasker(random_token_from="vocabulary", **kw)(ids))
    fixed = np_out(M.TokenMasker(**kw)(ids))
    pick = lambda o: np.take_along_axis(o["token_ids"], o["mask_positions"], 1)[o["mask_weights"] > 0]
    assert np.isin(pick(quirk), SPECIAL + (MASK,)).any()
    assert not np.isin(pick(fixed), SPECIAL + (MASK,)).any()


def test_rounding_and_counting_options():
    ids = tf.constant([[CLS] + [7] * 98 + [SEP]] * 3000)  # n = 100, 98 selectable
    kw = dict(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL, seed=4,
              mask_selection_length=40, mask_selection_rate=0.123)
    k = lambda m: np_out(m(ids))["mask_weights"].sum(1)
    assert np.all(k(M.TokenMasker(**kw)) == 12)  # round(12.3)
    assert np.all(k(M.TokenMasker(count_special_tokens=False, **kw)) == 12)  # round(12.054)
    probabilistic = k(M.TokenMasker(rounding="probabilistic", **kw))
    assert set(np.unique(probabilistic)) == {12, 13}
    assert abs(probabilistic.mean() - 12.3) < 0.05  # E[int(x + U)] = x
    assert np.all(k(M.TokenMasker(rounding="ceil", **kw)) == 13)


def test_all_special_and_empty_rows_get_zero_predictions():
    ids = tf.constant([[CLS, SEP, PAD, PAD], [PAD] * 4, [CLS, 9, 9, SEP]])
    for cls in (M.TokenMasker, M.WholeWordMasker, M.NgramMasker, M.SpanMasker):
        m = cls(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL, seed=5)
        o = np_out(m(ids))
        assert np.all(o["mask_weights"][:2] == 0) and np.all(o["mask_positions"][:2] == 0)
        assert np.array_equal(o["token_ids"][:2], ids.numpy()[:2])
        assert o["mask_weights"][2].sum() == 1


# === Words ===


def test_word_continuation_table_styles(tmp_path):
    wp = M.word_continuation_table(["[CLS]", "the", "##s", "##", "[MASK]"], "wordpiece")
    assert wp.tolist() == [False, False, True, False, False]
    sp = M.word_continuation_table(["<pad>", "[CLS]", "\u2581the", "s", "\u2581", "<unk>"],
                                   "sentencepiece")
    assert sp.tolist() == [False, False, False, True, False, False]
    bpe = M.word_continuation_table(["<s>", "\u0120the", "s", "<mask>", "the"], "bpe")
    assert bpe.tolist() == [False, False, True, False, True]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    assert np.array_equal(M.word_continuation_table(str(path)), M.word_continuation_table(VOCAB))
    with pytest.raises(ValueError, match="word_style"):
        M.word_continuation_table(VOCAB, "unigram")


def words_of(row, special=SPECIAL):
    """NumPy word grouping: lists of token positions (a ## piece after a selectable token joins)."""
    words, prev_sel = [], False
    for t, i in enumerate(row):
        sel = i not in special
        if sel and prev_sel and 100 <= i < 200:
            words[-1].append(t)
        elif sel:
            words.append([t])
        prev_sel = sel
    return words


def reference_greedy(key, cand_n, ctok, budget):
    """The original sequential loop (BERT whole-word / ALBERT n-gram), in NumPy."""
    covered = np.zeros(len(key), bool)
    chosen = np.zeros(len(key), int)
    used = 0
    for w in np.argsort(key, kind="stable"):
        if key[w] == I32:
            break
        n = cand_n[w]
        while n > 0 and used + ctok[w + n] - ctok[w] > budget:
            n -= 1  # shorter n-gram
        if n == 0:
            continue  # would overshoot: skip
        if covered[w : w + n].any():
            continue  # overlap: skip
        covered[w : w + n] = True
        used += ctok[w + n] - ctok[w]
        chosen[w] = n
    return covered, chosen


@pytest.mark.parametrize("cls,kw", [
    (M.WholeWordMasker, {}),
    (M.NgramMasker, {}),
    (M.NgramMasker, dict(mask_selection_rate=0.5, mask_selection_length=40)),
    (M.NgramMasker, dict(favor_shorter_ngram=False, max_ngram=4)),
])
def test_greedy_selection_equals_sequential_original(cls, kw):
    rng = np.random.default_rng(6)
    ids, _ = batch(rng, 64, 64, sep_at=25)
    m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=7, **kw)
    valid = ids != PAD
    sel = m._selectable(ids, valid)
    for s in range(3):
        budget = m._budget(valid, sel, tf.constant([s, 0]))
        covered, word, chosen, key, cand_n = m._ngram_select(ids, sel, budget, tf.constant([s, 1]))
        _, _, ctok = m._words(ids, sel)
        # To NumPy once (slicing the tensors row by row ran ~1,000 eager ops a call).
        key, cand_n, ctok, budget, covered, chosen = (
            t.numpy() for t in (key, cand_n, ctok, budget, covered, chosen))
        for b in range(ids.shape[0]):
            ref_cov, ref_chosen = reference_greedy(key[b], cand_n[b], ctok[b], budget[b])
            np.testing.assert_array_equal(covered[b], ref_cov)
            np.testing.assert_array_equal(chosen[b], ref_chosen)


@pytest.mark.parametrize("first", [1, 3])
def test_greedy_selection_continues_past_the_first_candidates(first, monkeypatch):
    """The first two rounds see only each row's first visited candidates; rows with budget
    left continue with their full order. With very few first candidates nearly every row takes
    that path: the result must still equal the sequential loop's."""
    monkeypatch.setattr(M, "_GREEDY_FIRST_CANDIDATES", first)
    test_greedy_selection_equals_sequential_original(M.NgramMasker, {})
    test_greedy_selection_equals_sequential_original(M.WholeWordMasker, {})


def greedy_case(rng, B, W, max_n, ties, big_budget=False):
    """Inputs of `_greedy_select` as the maskers build them: words 0..num_words-1 with 1-3
    pieces, keys with 24 random bits (few distinct values with `ties`) then the column % 128,
    INT32_MAX after the words; budgets 0..20 (or every piece: rows walk all their words)."""
    num_words = rng.integers(0, W + 1, size=B)
    num_words[:2] = [0, W][:B]
    bits = rng.integers(0, 3 if ties else (1 << 24) - 1, size=(B, W))
    key = np.where(np.arange(W) < num_words[:, None], bits * 128 + np.arange(W) % 128, I32)
    pieces = np.where(np.arange(W) < num_words[:, None], rng.integers(1, 4, size=(B, W)), 0)
    ctok = np.concatenate([np.zeros([B, 1], int), np.cumsum(pieces, axis=1)], axis=1)
    cand_n = np.minimum(rng.integers(1, max_n + 1, size=(B, W)),
                        num_words[:, None] - np.arange(W))
    budget = ctok[:, -1] if big_budget else rng.integers(0, 21, size=B)
    return key, cand_n, ctok, budget


@pytest.mark.parametrize("W", [1, 7, 128, 129, 200])
@pytest.mark.parametrize("max_n", [1, 3])
def test_greedy_select_at_any_width_with_tied_random_bits(W, max_n):
    """The walk's partial sort: XLA's float32 TopK of the 24 random bits up to 128 words (ties
    go to the lower index: the key's own order there), TF's int32 top_k beyond. With 3 distinct
    random values a row is all ties; keys of wider rows tie completely (the column % 128). Also
    rows with no words, budget 0, every piece as budget (the walk past the first candidates),
    a batch of one."""
    rng = np.random.default_rng(W * 10 + max_n)
    # (the batches of 24 share XLA's compilation for their shape; the batch of one has its own)
    for ties, big, B in ((True, False, 24), (False, False, 24), (True, True, 24), (False, True, 1)):
        key, cand_n, ctok, budget = greedy_case(rng, B, W, max_n, ties, big)
        covered, chosen = M._greedy_select(
            tf.constant(key, tf.int32), tf.constant(cand_n, tf.int32),
            tf.constant(ctok, tf.int32), tf.constant(budget, tf.int32),
            max_n=max_n, overlaps=max_n > 1)
        covered, chosen = covered.numpy(), chosen.numpy()
        for b in range(B):
            ref_cov, ref_chosen = reference_greedy(key[b], cand_n[b], ctok[b], budget[b])
            np.testing.assert_array_equal(covered[b], ref_cov)
            np.testing.assert_array_equal(chosen[b], ref_chosen)


def test_greedy_full_walk_keeps_the_batch_shape(monkeypatch):
    """Rows that need their full visiting order are walked with the whole batch: one shape for
    XLA (which compiles per shape) however many such rows there are."""
    monkeypatch.setattr(M, "_GREEDY_FIRST_CANDIDATES", 2)
    rng = np.random.default_rng(11)
    before = M._greedy_words_xla.experimental_get_tracing_count()
    for n in (1, 2, 3):  # rows 0..n-1 have every piece as budget: they walk past 2 candidates
        key = np.where(np.arange(40) < 30, rng.integers(0, 1 << 24, (8, 40)) * 128
                       + np.arange(40), I32)  # 30 words
        pieces = np.where(np.arange(40) < 30, rng.integers(1, 4, (8, 40)), 0)
        ctok = np.concatenate([np.zeros([8, 1], int), np.cumsum(pieces, axis=1)], axis=1)
        cand_n = np.ones([8, 40], int)
        budget = np.where(np.arange(8) < n, ctok[:, -1], 0)
        covered, chosen = M._greedy_select(
            tf.constant(key, tf.int32), tf.constant(cand_n, tf.int32),
            tf.constant(ctok, tf.int32), tf.constant(budget, tf.int32), max_n=1, overlaps=False)
        covered, chosen = covered.numpy(), chosen.numpy()
        for b in range(8):
            ref_cov, ref_chosen = reference_greedy(key[b], cand_n[b], ctok[b], budget[b])
            np.testing.assert_array_equal(covered[b], ref_cov)
            np.testing.assert_array_equal(chosen[b], ref_chosen)
        assert covered[: n].sum() == n * 30
    assert M._greedy_words_xla.experimental_get_tracing_count() - before <= 1


@pytest.mark.parametrize("T", [1, 2, 160])
@pytest.mark.parametrize("cls", [M.WholeWordMasker, M.NgramMasker])
def test_greedy_maskers_equal_sequential_original_at_other_widths(cls, T):
    """Length 1 and 2 (one word or none), and rows wider than 128 words (TF's top_k path)."""
    rng = np.random.default_rng(T)
    ids, _ = batch(rng, 16, T, min_len=1, sep_at=T // 3 if T > 2 else None)
    m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=2,
            mask_selection_rate=0.3, mask_selection_length=60)
    valid = ids != PAD
    sel = m._selectable(ids, valid)
    budget = m._budget(valid, sel, tf.constant([1, 0]))
    covered, word, chosen, key, cand_n = m._ngram_select(ids, sel, budget, tf.constant([1, 1]))
    _, _, ctok = m._words(ids, sel)
    key, cand_n, ctok, budget, covered, chosen = (
        t.numpy() for t in (key, cand_n, ctok, budget, covered, chosen))
    for b in range(ids.shape[0]):
        ref_cov, ref_chosen = reference_greedy(key[b], cand_n[b], ctok[b], budget[b])
        np.testing.assert_array_equal(covered[b], ref_cov)
        np.testing.assert_array_equal(chosen[b], ref_chosen)
    check_common(ids, m(ids))


@pytest.mark.parametrize("cls", [M.WholeWordMasker, M.NgramMasker, M.SpanMasker])
def test_whole_words_are_masked_whole(cls):
    rng = np.random.default_rng(8)
    ids, lengths = batch(rng, 300, 96, sep_at=40)
    m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=9)
    budget = (np.minimum(20, np.ceil(lengths * 0.15)) if cls is M.SpanMasker
              else bert_budget(lengths))
    o = check_common(ids, m(ids), budget=budget)
    total = 0
    for b in range(ids.shape[0]):
        chosen = set(o["mask_positions"][b, o["mask_weights"][b] > 0].tolist())
        total += len(chosen)
        for word in words_of(ids.numpy()[b]):
            hit = [t in chosen for t in word]
            assert all(hit) or not any(hit), (b, word)
    if cls is not M.SpanMasker:  # whole words leave the budget nearly full
        assert total / budget.sum() > 0.97


def test_wordpiece_vocabulary_from_file_and_mask_lookup(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    m = M.WholeWordMasker(vocabulary=str(path), unselectable_token_ids=SPECIAL, seed=0)
    assert m.mask_token_id == MASK and m.vocabulary_size == V


# === NgramMasker ===


def test_ngram_length_frequencies_on_word_only_input():
    """p(n) = 6/11, 3/11, 2/11 (reversed with favor_shorter_ngram=False).

    Word-only input (every piece starts a word), 768 x 512 tokens, budget 20. We histogram the drawn n
    of every *accepted* candidate: the walk stops at the budget, so by Wald's identity these
    follow p(n), up to the (small, ~4% coverage) bias of skipping overlapping n-grams -- the
    original has the same. Realized lengths also include the budget fallbacks (n -> shorter at
    the end of the budget), which skew them towards 1, in the original as here; we check that
    only the fallbacks differ.
    """
    x = tf.random.stateless_uniform([768, 512], [1, 2], minval=4, maxval=1000, dtype=tf.int32)
    for favor, target in ((True, np.array([6, 3, 2]) / 11), (False, np.array([2, 3, 6]) / 11)):
        m = M.NgramMasker(vocabulary_size=1000, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                          seed=11, favor_shorter_ngram=favor)
        valid = x != PAD
        sel = m._selectable(x, valid)
        budget = m._budget(valid, sel, tf.constant([0, 0]))
        _, _, chosen, _, cand_n = m._ngram_select(x, sel, budget, tf.constant([3, 4]))
        chosen, cand_n = chosen.numpy(), cand_n.numpy()
        drawn = cand_n[chosen > 0]
        freq = np.bincount(drawn, minlength=4)[1:] / drawn.size
        assert drawn.size > 6500  # standard error <= 0.6 percentage points
        np.testing.assert_allclose(freq, target, atol=0.02)
        fallback = chosen[chosen > 0] < drawn
        assert fallback.mean() < 0.1  # at most the budget-end n-grams
        # each row: only its last few accepted n-grams may fall back (remaining budget < n)
        assert np.all(np.bincount(np.nonzero(chosen * (chosen < cand_n))[0], minlength=768) <= 2)


# === SpanMasker ===


def test_span_lengths_follow_clipped_geometric():
    m = M.SpanMasker(vocabulary_size=1000, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                     seed=12, mask_selection_length=80)
    p = m.span_length_probabilities
    np.testing.assert_allclose((np.arange(1, 11) * p).sum(), 3.8, atol=0.01)
    x = tf.random.stateless_uniform([256, 512], [5, 6], minval=4, maxval=1000, dtype=tf.int32)
    valid = x != PAD
    sel = m._selectable(x, valid)
    budget = m._budget(valid, sel, tf.constant([0, 0]))
    np.testing.assert_array_equal(budget.numpy(), 77)  # ceil(0.15 * 512)
    _, covered, _, drawn, realized = m._spans(x, sel, budget, tf.constant([7, 8]), track=True)
    drawn, realized = drawn.numpy(), realized.numpy()
    np.testing.assert_array_equal(covered.numpy().sum(1), 77)
    placed = realized > 0
    # Lengths are kept (anchor redrawn among free placements): only the budget-cut last span of a
    # row is shorter than drawn. Histogram of drawn lengths of all placed spans (Wald).
    assert np.all((realized < drawn).sum(1) <= 1)
    hist = np.bincount(drawn[placed], minlength=11)[1:] / placed.sum()
    assert placed.sum() > 4000
    np.testing.assert_allclose(hist, p, atol=0.02)


def test_span_anchor_draws_are_xla_stateless_uniform():
    """SpanMasker's rounds draw their anchors with `_xla_uniforms` (Philox for many rounds at
    once) instead of one XLA `stateless_uniform` per round: the same numbers, i.e. the same masks
    as before. Philox itself against Random123's known-answer vectors; then the draws against
    XLA's own op (TF 2.21's lowering: a mismatch after a TF upgrade means the masks differ from
    earlier versions', not that they are wrong), for rounds past the first chunk and lengths
    not a multiple of 4."""
    u32 = lambda *x: [tf.constant([v], tf.uint32) for v in x]  # noqa: E731
    kat = {(0, 0, 0, 0, 0, 0): (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
           (2**32 - 1,) * 6: (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)}
    for inputs, want in kat.items():
        got = M._philox(u32(*inputs[:4]), u32(*inputs[4:]))
        assert [int(x.numpy()[0]) for x in got] == list(want)
    xla = tf.function(lambda seed, n: tf.random.stateless_uniform([n], seed),
                      jit_compile=True, reduce_retracing=True)
    ours = tf.function(M._xla_uniforms, jit_compile=True, autograph=False)
    rng = np.random.default_rng(0)
    for n in (1, 27, 1152):
        seed0 = int(rng.integers(-2**31, 2**31))
        k = [0, 1, 15, 16, 37, int(rng.integers(-2**31, 2**31))]
        got = ours(tf.constant(seed0), tf.constant(k), n=n).numpy()
        for j, kj in enumerate(k):
            np.testing.assert_array_equal(got[j], xla(tf.constant([seed0, kj]), n).numpy())


def reference_spans(rng, num_words, budget, probs, K):
    """The sequential span loop on word-only rows, in NumPy: span after span, a clipped
    geometric length (kept), an anchor uniform among the placements of that many free words
    (none: next span), cut to the budget; returns the covered words and the number of spans."""
    covered = np.zeros(num_words, bool)
    used = spans = 0
    for _ in range(K):
        L = min(rng.choice(len(probs), p=probs) + 1, num_words)
        free = [a for a in range(num_words - L + 1) if not covered[a : a + L].any()]
        if not free:
            continue
        a = free[rng.integers(len(free))]
        m = min(L, budget - used)
        covered[a : a + m] = True
        used += m
        spans += 1
        if used >= budget:
            break
    return covered, spans


def test_span_placement_law_equals_sequential_loop():
    """SpanMasker proposes several spans per round and rejection-samples anchors; the covered
    positions and spans per row must follow the one-span-at-a-time loop's law. A crowded case
    (30 words, budget 10) exercises rejections, deferrals and the exact fall-back."""
    n, rows = 30, 3000
    ids = tf.constant([[CLS] + list(range(10, 10 + n)) + [SEP]] * rows)  # word-only pieces
    m = M.SpanMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                     seed=21, mask_selection_rate=0.3)
    valid = ids != PAD
    sel = m._selectable(ids, valid)
    budget = m._budget(valid, sel, tf.constant([0, 0]))
    np.testing.assert_array_equal(budget.numpy(), 10)  # ceil(0.3 * 32)
    _, covered, _, _, realized = m._spans(ids, sel, budget, tf.constant([3, 4]), track=True)
    rng = np.random.default_rng(22)
    ref, ref_spans = zip(*[reference_spans(rng, n, 10, m.span_length_probabilities, 40)
                           for _ in range(rows)])
    ref = np.array(ref)
    # Per-position coverage: standard error <= 0.0092 for each of the two estimates.
    covered = covered.numpy()[:, :n]  # word space: words 0 .. n - 1
    np.testing.assert_allclose(covered.mean(0), ref.mean(0), atol=0.05)
    spans = (realized.numpy() > 0).sum(1)
    np.testing.assert_allclose(spans.mean(), np.mean(ref_spans), atol=0.1)  # SE ~0.02 each


def test_span_masker_is_per_span_and_contiguous():
    rng = np.random.default_rng(13)
    ids, lengths = batch(rng, 400, 128, hi=100)  # word-only pieces
    m = M.SpanMasker(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=14,
                     mask_selection_length=20)
    o = check_common(ids, m(ids))
    np.testing.assert_array_equal(o["mask_weights"].sum(1),
                                  np.minimum(20, np.ceil(0.15 * lengths)))
    valid = ids != PAD
    sel = m._selectable(ids, valid)
    budget = m._budget(valid, sel, tf.constant([0, 0]))
    word, covered, unit_w, _, _ = m._spans(ids, sel, budget, tf.constant([1, 2]))
    cov, unit = covered.numpy(), unit_w.numpy()
    for b in range(len(cov)):
        for anchor in np.unique(unit[b][cov[b]]):  # each span: contiguous words from its anchor
            words = np.nonzero(cov[b] & (unit[b] == anchor))[0]
            assert words[0] == anchor and np.all(np.diff(words) == 1)


def test_span_80_10_10_is_decided_per_span():
    ids = tf.constant([[CLS] + list(range(10, 90)) + [SEP]] * 300)
    m = M.SpanMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                     seed=15, mask_selection_length=13)
    o = np_out(m(ids, seed=3))
    # Recompute the span id (anchor word) of every prediction with the same derived seeds.
    seed_budget, seed_select, _, _ = M._split_seeds(m._call_key(3), 4)
    valid = ids != PAD
    sel = m._selectable(ids, valid)
    positions, _, unit = m._select_positions(ids, sel, m._budget(valid, sel, seed_budget),
                                             seed_select)
    np.testing.assert_array_equal(positions.numpy(), o["mask_positions"])
    span_of = np.take_along_axis(unit.numpy(), o["mask_positions"], 1)
    fates = {"mask": 0, "random": 0, "same": 0}
    for b in range(300):
        k = int(o["mask_weights"][b].sum())
        new = o["token_ids"][b, o["mask_positions"][b, :k]]
        old = o["mask_ids"][b, :k]
        for span in np.unique(span_of[b, :k]):
            at = span_of[b, :k] == span
            is_mask, changed = new[at] == MASK, new[at] != old[at]
            assert is_mask.all() or not is_mask.any()  # one decision for the whole span
            # (a random draw may coincide with the original id, so "random" = any change)
            fates["mask" if is_mask[0] else "random" if changed.any() else "same"] += 1
    n = sum(fates.values())
    assert n > 1000
    assert abs(fates["mask"] / n - 0.8) < 4 * np.sqrt(0.16 / n)
    assert abs(fates["random"] / n - 0.1) < 4 * np.sqrt(0.09 / n)


def test_span_random_replacements_from_unigram_distribution():
    dist = np.zeros(V)
    dist[[10, 11]] = [0.75, 0.25]
    dist[CLS] = 10.0  # zeroed: special
    m = M.SpanMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                     seed=16, mask_token_rate=0.0, random_token_rate=1.0,
                     random_token_distribution=dist)
    ids = tf.constant([[CLS] + list(range(20, 90)) + [SEP]] * 200)
    o = np_out(m(ids))
    new = np.take_along_axis(o["token_ids"], o["mask_positions"], 1)[o["mask_weights"] > 0]
    assert set(np.unique(new)) == {10, 11}
    assert abs((new == 10).mean() - 0.75) < 0.03


# === Dynamic masking and seeds ===


@pytest.mark.parametrize("cls", [M.TokenMasker, M.NgramMasker, M.SpanMasker])
def test_dynamic_and_reproducible(cls):
    rng = np.random.default_rng(17)
    ids, _ = batch(rng, 8, 64)
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL)
    a, b = cls(seed=1, **kw), cls(seed=1, **kw)
    first = [np_out(a(ids))["mask_positions"] for _ in range(3)]
    again = [np_out(b(ids))["mask_positions"] for _ in range(3)]
    assert not np.array_equal(first[0], first[1])  # fresh mask each call
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)  # same seed, same sequence
    other = np_out(cls(seed=2, **kw)(ids))["mask_positions"]
    assert not np.array_equal(first[0], other)
    # explicit per-call seeds: a pure function of (masker seed, call seed, input)
    np.testing.assert_array_equal(np_out(a(ids, seed=(4, 5)))["token_ids"],
                                  np_out(b(ids, seed=(4, 5)))["token_ids"])


def test_tf_data_parallel_map_is_reproducible_and_fresh_each_epoch():
    rng = np.random.default_rng(18)
    ids, _ = batch(rng, 32, 32)
    ds = tf.data.Dataset.from_tensor_slices(ids).batch(8)

    def run(masker, epochs=2):
        out = masker.map_dataset(ds, num_parallel_calls=tf.data.AUTOTUNE).prefetch(4)
        return [np.concatenate([e["mask_positions"].numpy() for e in out]) for _ in range(epochs)]

    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=21)
    e1, e2 = run(M.NgramMasker(**kw))
    f1, f2 = run(M.NgramMasker(**kw))
    np.testing.assert_array_equal(e1, f1)
    np.testing.assert_array_equal(e2, f2)
    assert not np.array_equal(e1, e2)  # dynamic: a new mask every epoch
    # the plain `ds.map(masker)` works too (call counter; ordered without parallel calls)
    plain = ds.map(M.TokenMasker(**kw))
    assert next(iter(plain))["mask_positions"].shape == (8, 20)
    # unbatched elements
    single = M.TokenMasker(**kw).map_dataset(tf.data.Dataset.from_tensor_slices(ids))
    assert next(iter(single))["mask_positions"].shape == (20,)


def test_ragged_and_dense_agree():
    rng = np.random.default_rng(19)
    ids, lengths = batch(rng, 16, 40)
    rows = [ids.numpy()[b, :n].tolist() for b, n in enumerate(lengths)]
    ragged = tf.ragged.constant(rows, dtype=tf.int32)
    width = int(lengths.max())
    dense = ragged.to_tensor(default_value=PAD)
    assert dense.shape[1] == width
    for cls in (M.TokenMasker, M.WholeWordMasker, M.NgramMasker, M.SpanMasker):
        m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=22)
        r = m(ragged, seed=1)
        d = m(dense, seed=1)
        assert isinstance(r["token_ids"], tf.RaggedTensor)
        np.testing.assert_array_equal(r["token_ids"].row_lengths().numpy(), lengths)
        np.testing.assert_array_equal(r["token_ids"].to_tensor(PAD).numpy(), d["token_ids"].numpy())
        for key in ("mask_positions", "mask_ids", "mask_weights"):
            np.testing.assert_array_equal(r[key].numpy(), d[key].numpy())


def test_shapes_dtypes_and_unbatched():
    m = M.TokenMasker(vocabulary_size=V, mask_token_id=MASK, unselectable_token_ids=SPECIAL,
                      seed=0, mask_selection_length=12)
    x64 = tf.constant([[CLS, 5, 6, 7, SEP, PAD]], tf.int64)
    out = m(x64)
    # Eagerly, keras-hub's dtypes: int32 ids whatever the input's integer dtype.
    assert out["token_ids"].dtype == tf.int32 and out["token_ids"].shape == (1, 6)
    assert out["mask_positions"].dtype == tf.int32 and out["mask_positions"].shape == (1, 12)
    assert out["mask_ids"].dtype == tf.int32 and out["mask_weights"].dtype == tf.float32
    single = m(tf.constant([CLS, 5, 6, 7, SEP]))
    assert single["token_ids"].shape == (5,) and single["mask_positions"].shape == (12,)
    graph = tf.function(lambda x: m(x, seed=1))(tf.constant([[CLS, 5, 6, 7, SEP]]))
    assert graph["mask_positions"].shape == (1, 12)


@pytest.mark.parametrize("cls", [M.TokenMasker, M.WholeWordMasker, M.NgramMasker, M.SpanMasker])
def test_every_masker_on_one_sequence_and_unbatched(cls):
    """A batch of one, eagerly (a static batch dimension of 1 in the masker's traced loops; the
    span rounds once failed there) and an unbatched sequence."""
    m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=3, mask_selection_length=4,
            mask_selection_rate=0.5)
    row = [CLS, 5, 6, 7, 8, 9, SEP, PAD]

    def check(out, rows):
        weights = out["mask_weights"].reshape(rows, 4)
        positions = out["mask_positions"].reshape(rows, 4)
        assert (weights.sum(1) >= 1).all()  # every row masks something (whole units: <= 4)
        assert set(positions[weights > 0].tolist()) <= {1, 2, 3, 4, 5}  # only selectable ones

    one = np_out(m(tf.constant([row]), seed=1))
    assert one["mask_positions"].shape == (1, 4)
    check(one, 1)
    check(np_out(m(tf.constant([row] * 3), seed=1)), 3)
    single = np_out(m(tf.constant(row), seed=1))
    assert single["mask_positions"].shape == (4,)
    check(single, 1)


def test_keras_hub_format():
    keras_hub = importlib.import_module("keras_hub")
    ids = tf.constant([[CLS] + list(range(10, 40)) + [SEP, PAD, PAD]] * 4)
    hub = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=V, mask_selection_rate=0.15, mask_token_id=MASK,
        mask_selection_length=20, unselectable_token_ids=list(SPECIAL))(ids)
    for cls in (M.TokenMasker, M.WholeWordMasker, M.NgramMasker, M.SpanMasker):
        ours = cls(V, 0.15, MASK, 20, SPECIAL, seed=0)(ids)  # keras-hub's positional order
        assert sorted(ours) == sorted(hub)
        for key in hub:
            assert ours[key].shape == hub[key].shape, key
            assert ours[key].dtype == hub[key].dtype, key


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_keras_hub_dtypes_eager_and_in_tf_data(dtype):
    """keras-hub's generator gives int32 ids eagerly (its Python workflow) and, in tf.data, the
    input's dtype with int64 positions: ours gives the same in both places."""
    keras_hub = importlib.import_module("keras_hub")
    ids = tf.constant([[CLS] + list(range(10, 40)) + [SEP, PAD, PAD]] * 4, dtype=dtype)
    hub = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=V, mask_selection_rate=0.15, mask_token_id=MASK,
        mask_selection_length=20, unselectable_token_ids=list(SPECIAL))
    ours = M.TokenMasker(V, 0.15, MASK, 20, SPECIAL, seed=0)
    ds = tf.data.Dataset.from_tensor_slices(ids).batch(2)
    for got, want in ((ours(ids), hub(ids)), (ds.map(ours).element_spec, ds.map(hub).element_spec)):
        assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in want.items()}


# === One trace for every setting ===


def xla_tracing_counts():
    """Traces so far of each of masking.py's XLA functions (each trace: XLA compilations)."""
    return {name: f.experimental_get_tracing_count() for name, f in vars(M).items()
            if name.endswith("_xla")}


SHORT = [CLS, 5, 6, 7, 8, 9, SEP, PAD]  # the rows and P of test_every_masker_on_one_sequence...
ERNIE = [CLS] + list(range(10, 19)) + [SEP]  # ... and of test_ernie_masking's schedule test


@pytest.mark.parametrize("cls,rows,P,mask,a,b", [  # a mask id of its own per case
    (M.TokenMasker, [SHORT] * 3, 4, 4, {}, {}),
    (M.WholeWordMasker, [SHORT] * 3, 4, 10, {}, {}),
    (M.NgramMasker, [SHORT] * 3, 4, 11, {}, dict(favor_shorter_ngram=False)),
    (M.SpanMasker, [SHORT] * 3, 4, 12, {}, dict(geometric_p=0.5)),
    (M.PhraseMasker, [ERNIE] * 16, 20, 4, dict(phrases=[[10, 11, 12]]),
     dict(phrases=[[16, 17], [14, 15]])),
    (M.EntityMasker, [ERNIE] * 16, 20, 19, dict(entities=[[16, 17, 18]]),
     dict(entities=[[10, 11]])),
])
def test_maskers_with_other_settings_share_one_trace(cls, rows, P, mask, a, b):
    """The XLA functions take the settings that are data (rates, mask token id, unselectable
    ids, the n-gram / span length distribution) as tensors: a second masker of one kind with
    other settings, on the same input shape, traces (and compiles) none of them again (on
    settings as Python arguments, as they were, it traced all of them again). Each masker's own
    settings are used: its mask token at every masked position, none of its unselectable ids
    masked, more masked at the larger rate. The shapes and structure of other tests, whose
    compilations these maskers reuse."""
    ids = tf.constant(rows)
    first = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=1, mask_token_rate=1.0,
                random_token_rate=0.0, mask_selection_length=P, **a)
    unselectable = SPECIAL + (rows[0][5],)
    second = cls(vocabulary=VOCAB, mask_token_id=mask, unselectable_token_ids=unselectable, seed=1,
                 mask_selection_rate=0.5, mask_token_rate=1.0, random_token_rate=0.0,
                 mask_selection_length=P, **b)
    out = np_out(first(ids))
    traced = xla_tracing_counts()
    assert traced  # (the names of the XLA functions: none renamed away from `_xla`)
    again = np_out(second(ids))
    assert xla_tracing_counts() == traced
    for o, token, special in ((out, MASK, SPECIAL), (again, mask, unselectable)):
        real = o["mask_weights"] > 0
        assert real.any()
        assert (np.take_along_axis(o["token_ids"], o["mask_positions"], 1)[real] == token).all()
        assert not np.isin(o["mask_ids"][real], special).any()
    assert (again["mask_weights"].sum(1) > out["mask_weights"].sum(1)).all()  # 0.5 > 0.15


# === Errors and config ===


def test_clear_errors():
    kw = dict(vocabulary_size=V, mask_token_id=MASK)
    with pytest.raises(ValueError, match="no mask token"):
        M.WholeWordMasker(vocabulary=[t for t in VOCAB if t != "[MASK]"] + ["x"])
    with pytest.raises(ValueError, match="mask_selection_rate"):
        M.TokenMasker(mask_selection_rate=1.5, **kw)
    with pytest.raises(ValueError, match="random_token_rate"):
        M.TokenMasker(random_token_rate=-0.1, **kw)
    with pytest.raises(ValueError, match="<= 1"):
        M.TokenMasker(mask_token_rate=0.8, random_token_rate=0.3, **kw)
    with pytest.raises(ValueError, match="mask_token_id"):
        M.TokenMasker(vocabulary_size=V)
    with pytest.raises(ValueError, match="integer"):
        M.TokenMasker(**kw)(tf.constant([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="rounding"):
        M.TokenMasker(rounding="floor", **kw)


def test_config_round_trip():
    m = M.NgramMasker(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=3, max_ngram=2)
    config = m.get_config()
    clone = M.NgramMasker.from_config(config)
    assert clone.get_config() == config
    ids = tf.constant([[CLS] + list(range(4, 60)) + [SEP]])
    np.testing.assert_array_equal(m(ids, seed=1)["token_ids"].numpy(),
                                  clone(ids, seed=1)["token_ids"].numpy())
