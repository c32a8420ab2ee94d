"""ERNIE knowledge masking: PhraseMasker, EntityMasker, MaskingSchedule, learn_phrases.

The matcher is checked against a plain sequential leftmost-longest scan; the statistics
(rate, whole units, phrase preference) with fixed seeds.
"""
import importlib

import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from keras_bertfam.preprocessing import masking as M

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = (PAD, CLS, SEP)
# ids 4..99 start words, 100..199 are "##" continuations (as tests/test_masking.py).
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(4, 100)] + [
    f"##p{i}" for i in range(100, 200)
]
V = len(VOCAB)


def rows(rng, B, T, lo=4, hi=40, cont=0.25):
    """[CLS] words ... [SEP] padded; a small id range so that lexicon entries recur."""
    out = np.zeros((B, T), np.int64)
    for b in range(B):
        n = rng.integers(10, T + 1)
        ids = rng.integers(lo, hi, size=n)
        is_cont = rng.random(n) < cont
        ids = np.where(is_cont, 100 + ids % 20, ids)
        ids[0], ids[n - 1] = CLS, SEP
        ids[1] = lo  # a word start after [CLS]
        out[b, :n] = ids
    return out


def words_of(row):
    """Word start positions and word ends (NumPy reference of the word structure)."""
    starts, ends = set(), set()
    prev_sel = False
    last = None
    for t, i in enumerate(row):
        sel = i not in SPECIAL
        if sel and not (prev_sel and 100 <= i < 200):
            starts.add(t)
            if last is not None:
                ends.add(last)
        elif not sel and prev_sel:
            ends.add(last)
        if sel:
            last = t
        prev_sel = sel
    if prev_sel:
        ends.add(last)
    return starts, ends


def reference_units(row, lexicon):
    """Sequential leftmost-longest scan: {start: length} of the accepted matches."""
    starts, ends = words_of(row)
    lex = sorted({tuple(e) for e in lexicon}, key=len, reverse=True)
    out, t = {}, 0
    while t < len(row):
        if t in starts:
            for e in lex:
                n = len(e)
                if tuple(row[t:t + n]) == e and t + n - 1 in ends and not any(
                        i in SPECIAL for i in e):
                    out[t] = n
                    break
            if t in out:
                t += out[t]
                continue
        t += 1
    return out


def random_lexicon(rng, data, num):
    """Entries cut from the data at word boundaries (so they occur), 1-4 words, overlapping."""
    lex = set()
    while len(lex) < num:
        row = data[rng.integers(len(data))]
        starts, ends = words_of(row)
        s = sorted(starts)
        if len(s) < 5:
            continue
        i = rng.integers(len(s) - 4)
        k = rng.integers(1, 5)
        end = [e for e in sorted(ends) if e >= s[i + k - 1]][0]
        entry = tuple(int(x) for x in row[s[i]:end + 1])
        if not any(x in SPECIAL for x in entry):
            lex.add(entry)
    return [list(e) for e in lex]


@pytest.mark.parametrize("cls", [M.PhraseMasker, M.EntityMasker])
def test_matcher_equals_sequential_leftmost_longest(cls):
    rng = np.random.default_rng(0)
    data = rows(rng, 80, 48)
    lexicon = random_lexicon(rng, data, 60)
    arg = "phrases" if cls is M.PhraseMasker else "entities"
    m = cls(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=1, **{arg: lexicon})
    found = m.find_units(tf.constant(data)).numpy()
    total = 0
    for b in range(len(data)):
        ref = reference_units(data[b].tolist(), lexicon)
        got = {int(t): int(found[b, t]) for t in np.nonzero(found[b])[0]}
        assert got == ref, b
        total += len(ref)
    assert total > 100  # the lexicon really occurs, with overlaps resolved


@pytest.mark.parametrize("T", [1, 2, 48])
def test_matcher_chains_and_edge_rows(T):
    """Leftmost-longest where every match starts inside an earlier one (chains of nested
    entries: the resolution's rounds), next to rows with no match at all, a batch of one and
    lengths 1 and 2, against the sequential scan."""
    if T > 2:
        data = rows(np.random.default_rng(T), 12, T, cont=0.0)  # every piece starts a word
        data[:, 1:-1:2] = 5  # a chain: 5 6 5 6 ... matched by (5 6) and (6 5)
        data[:, 2:-1:2] = 6
        data[0, 1:-1] = 7  # a row with no match
    else:
        data = np.array([[7, 7], [5, 6], [9, 5], [6, 5]])[:, :T]
    lexicon = [[5, 6], [6, 5], [5, 6, 5], [9]]
    m = M.PhraseMasker(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=1, phrases=lexicon)
    for batch in (data, data[1:2]):
        found = m.find_units(tf.constant(batch)).numpy()
        for b in range(len(batch)):
            ref = reference_units(batch[b].tolist(), lexicon)
            got = {int(t): int(found[b, t]) for t in np.nonzero(found[b])[0]}
            assert got == ref, (T, b)
        out = m(tf.constant(batch))
        assert out["mask_positions"].shape == (len(batch), 20)


def test_units_are_masked_whole_at_bert_rate_and_phrases_first():
    rng = np.random.default_rng(2)
    data = rows(rng, 400, 64)
    lexicon = random_lexicon(rng, data, 40)
    m = M.PhraseMasker(vocabulary=VOCAB, phrases=lexicon, unselectable_token_ids=SPECIAL, seed=3)
    plain = M.PhraseMasker(vocabulary=VOCAB, phrases=lexicon, unselectable_token_ids=SPECIAL,
                           seed=3, prefer_units=False)
    lengths = (data != PAD).sum(1)
    budget = np.minimum(20, np.maximum(1, np.round(lengths * 0.15)))
    share, bound = {}, 0
    for name, masker in (("prefer", m), ("plain", plain)):
        o = {k: v.numpy() for k, v in masker(tf.constant(data)).items()}
        w, pos = o["mask_weights"], o["mask_positions"]
        k = w.sum(1)
        assert np.all(k <= budget) and k.sum() / budget.sum() > 0.95  # BERT's rate, nearly full
        in_unit = masked = 0
        for b in range(len(data)):
            chosen = set(pos[b, w[b] > 0].tolist())
            assert not any(data[b, t] in SPECIAL for t in chosen)
            units = reference_units(data[b].tolist(), lexicon)
            covered = set()
            for s, n in units.items():
                hit = [t in chosen for t in range(s, s + n)]
                assert all(hit) or not any(hit), (name, b, s, n)  # never split
                covered |= set(range(s, s + n))
            starts, _ = words_of(data[b])
            for t in starts - covered:  # plain words: whole too
                e = t + 1
                while e < len(data[b]) and 100 <= data[b, e] < 200:
                    e += 1
                hit = [u in chosen for u in range(t, e)]
                assert all(hit) or not any(hit)
            in_unit += len(chosen & covered)
            masked += len(chosen)
            if name == "prefer":
                bound += min(budget[b], len(covered))
        share[name] = in_unit
        assert np.all(np.take_along_axis(data, pos, 1)[w > 0] == o["mask_ids"][w > 0])
    # Phrases first: nearly all the phrase pieces the budgets allow are masked (a whole phrase
    # that overshoots the rest of the budget is skipped); the plain order masks far fewer.
    assert share["prefer"] > 0.9 * bound and share["plain"] < 0.5 * share["prefer"], (share, bound)


def test_without_matches_and_preference_it_is_whole_word_masking():
    rng = np.random.default_rng(4)
    data = tf.constant(rows(rng, 64, 40))
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, seed=5)
    ww = M.WholeWordMasker(**kw)
    ph = M.PhraseMasker(phrases=[[98, 99]], prefer_units=False, **kw)  # never occurs
    for s in range(3):
        a, b = ww(data, seed=s), ph(data, seed=s)
        for key in a:
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


def test_entities_from_strings_with_the_models_tokenizer():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "harry", "potter", "is", "a",
             "wizard", "in", "london", "lon", "##don", "new", "york"]
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary=words, lowercase=True)
    m = M.EntityMasker(vocabulary=words, entities=["Harry Potter", "New York", "London"],
                       tokenizer=tok, unselectable_token_ids=(0, 2, 3), seed=0,
                       mask_selection_rate=0.2)
    assert sorted(m.lexicon_ids) == [[5, 6], [11], [14, 15]]
    ids = tf.constant([[2, 5, 6, 7, 8, 9, 10, 11, 3], [2, 14, 15, 7, 12, 13, 3, 0, 0]])
    units = m.find_units(ids).numpy().tolist()
    assert units == [[0, 2, 0, 0, 0, 0, 0, 1, 0], [0, 2, 0, 0, 0, 0, 0, 0, 0]]
    o = m(ids)
    first = o["mask_positions"].numpy()[0][o["mask_weights"].numpy()[0] > 0].tolist()
    assert first in ([1, 2], [7])  # budget 2 of 9: a whole entity, entities first
    with pytest.raises(ValueError, match="tokenizer="):
        M.EntityMasker(vocabulary=words, entities=["Harry Potter"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        M.EntityMasker(vocabulary=words, entities=[[5, 99]])
    with pytest.warns(UserWarning, match=r"\[5, 0\] \(an unselectable token"):
        M.EntityMasker(vocabulary=words, entities=[[5, 0], [5, 6]])
    with pytest.raises(ValueError, match="entities="):
        M.EntityMasker(vocabulary=words)
    with pytest.raises(ValueError, match="mix"):
        M.PhraseMasker(vocabulary=words, phrases=["new york", [5, 6]], tokenizer=tok)


def test_keras_hub_format_graph_tf_data_and_config():
    keras_hub = importlib.import_module("keras_hub")
    ids = tf.constant([[CLS] + list(range(10, 40)) + [SEP, PAD, PAD]] * 4)
    hub = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=V, mask_selection_rate=0.15, mask_token_id=MASK,
        mask_selection_length=20, unselectable_token_ids=list(SPECIAL))(ids)
    m = M.PhraseMasker(V, 0.15, MASK, 20, SPECIAL, seed=0, phrases=[[12, 13, 14], [20, 21]])
    ours = m(ids)
    for key in hub:
        assert ours[key].shape == hub[key].shape and ours[key].dtype == hub[key].dtype, key
    graph = tf.function(lambda x: m(x, seed=3))(ids)
    np.testing.assert_array_equal(graph["token_ids"].numpy(), m(ids, seed=3)["token_ids"].numpy())
    ds = m.map_dataset(tf.data.Dataset.from_tensor_slices(ids).batch(2))
    first, second = [[b["token_ids"].numpy() for b in ds] for _ in range(2)]
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))  # fresh each epoch
    clone = M.PhraseMasker.from_config(m.get_config())
    assert clone.get_config() == m.get_config()
    np.testing.assert_array_equal(clone(ids, seed=1)["token_ids"].numpy(),
                                  m(ids, seed=1)["token_ids"].numpy())
    ragged = tf.ragged.constant([[CLS, 12, 13, 14, SEP], [CLS, 20, 21, SEP]])
    out = m(ragged, seed=2)
    assert isinstance(out["token_ids"], tf.RaggedTensor)


def test_masking_schedule_stages():
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL, mask_selection_rate=0.3)
    ids = tf.constant([[CLS, 10, 11, 12, 13, 14, 15, 16, 17, 18, SEP]] * 16)
    basic = M.TokenMasker(seed=1, **kw)
    phrase = M.PhraseMasker(phrases=[[10, 11, 12]], seed=2, **kw)
    entity = M.EntityMasker(entities=[[16, 17, 18]], seed=3, **kw)
    sched = M.MaskingSchedule([basic, phrase, entity], boundaries=[2, 4])
    got = []
    for _ in range(6):
        p = sched(ids)["mask_positions"].numpy()
        got.append({tuple(r) for r in p})
    # budget round(11 * 0.3) = 3: stage 2 masks the phrase [1, 2, 3], stage 3 the entity.
    assert len(got[0] | got[1]) > 2
    assert got[2] == got[3] == {(1, 2, 3) + (0,) * 17}
    assert got[4] == got[5] == {(7, 8, 9) + (0,) * 17}
    manual = M.MaskingSchedule([basic, phrase, entity])
    manual.set_stage(2)
    assert {tuple(r) for r in manual(ids, seed=0)["mask_positions"].numpy()} == got[4]
    ds = manual.map_dataset(tf.data.Dataset.from_tensor_slices(ids).batch(8))
    assert all(set(b["mask_positions"].numpy()[:, 0]) == {7} for b in ds)
    with pytest.raises(ValueError, match="mask_selection_length"):
        M.MaskingSchedule([basic, M.TokenMasker(mask_selection_length=5, **kw)])
    with pytest.raises(ValueError, match="boundaries"):
        M.MaskingSchedule([basic, phrase], boundaries=[3, 5])
    with pytest.raises(ValueError, match="stage must be"):
        manual.set_stage(3)
    with pytest.raises(ValueError, match="follows its boundaries"):
        sched.set_stage(0)


def test_learn_phrases_finds_planted_collocations():
    rng = np.random.default_rng(7)
    filler = [f"x{i}" for i in range(300)]
    docs = []
    for _ in range(400):
        words = list(rng.choice(filler, size=12))
        words.insert(rng.integers(12), "new york city")
        if rng.random() < 0.5:
            words.insert(rng.integers(12), "machine learning")
        if rng.random() < 0.3:
            words.insert(rng.integers(12), "of the")  # frequent, but stop words
        docs.append(" ".join(words) + ".")
    phrases = kb.preprocessing.learn_phrases(docs, min_count=20)
    assert phrases[:2] == ["machine learning", "new york city"] or set(phrases[:2]) == {
        "machine learning", "new york city"}
    assert "of the" not in phrases and all(len(p.split()) <= 3 for p in phrases)
    assert kb.preprocessing.learn_phrases(tf.data.Dataset.from_tensor_slices(docs).batch(7),
                                          min_count=20) == phrases
    pairs = kb.preprocessing.learn_phrases(docs, min_count=20, max_words=2)
    assert "machine learning" in pairs and all(len(p.split()) == 2 for p in pairs)
    assert {"new york", "york city"} & set(pairs)
    with pytest.raises(ValueError, match="max_words"):
        kb.preprocessing.learn_phrases(docs, max_words=1)
    with pytest.raises(ValueError, match="single string"):
        kb.preprocessing.learn_phrases("new york")


def test_schedule_and_phrase_masker_in_a_pretraining_preprocessor():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "harry", "potter", "is", "a",
             "wizard", "in", "new", "york", "."]
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary=words, lowercase=True)
    kw = dict(vocabulary=words, unselectable_token_ids=tok.special_token_ids,
              mask_selection_length=4, mask_selection_rate=0.25)
    stages = M.MaskingSchedule([
        M.WholeWordMasker(**kw),
        M.EntityMasker(entities=["harry potter"], tokenizer=tok, **kw)])
    stages.set_stage(1)
    pre = kb.preprocessing.MaskedLMPreprocessor(tok, sequence_length=12, masker=stages,
                                                batch_size=2)
    x, mask_ids, weights = next(iter(pre.prepare(["harry potter is a wizard in new york ."] * 2)))
    positions = x["mask_positions"].numpy()
    assert positions[:, :2].tolist() == [[1, 2], [1, 2]]  # the entity, whole, first
    assert mask_ids.numpy()[:, :2].tolist() == [[5, 6], [5, 6]]


def test_pair_slot_is_the_same_in_numpy_and_tensorflow():
    """The live-start pair table is built with NumPy and read with TF ops: the slots must agree
    for any ids (large vocabularies too: no int32 overflow), or true matches would be missed."""
    rng = np.random.default_rng(0)
    first = rng.integers(0, 1 << 20, size=2000)
    second = rng.integers(0, 1 << 20, size=2000)
    want = [M._pair_slot(np.int64(a), np.int64(b)) for a, b in zip(first, second)]
    got = M._pair_slot(tf.constant(first, tf.int32), tf.constant(second, tf.int32)).numpy()
    np.testing.assert_array_equal(got, want)
    assert 0 <= got.min() and got.max() < 1 << 16


def test_entries_that_can_never_match_are_skipped_with_one_warning_naming_them():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "new", "york", "harry", "potter"]
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary=words, lowercase=True)
    with pytest.warns(UserWarning) as record:
        m = M.EntityMasker(vocabulary=words, entities=["new york", "beyonce \U0001F3A4", "",
                                                      "harry potter"],
                           tokenizer=tok, unselectable_token_ids=(0, 1, 2, 3))
    assert sorted(m.lexicon_ids) == [[5, 6], [7, 8]]
    assert len(record) == 1
    message = str(record[0].message)
    assert "'beyonce \U0001F3A4'" in message and "''" in message and "2 of 4" in message
    assert "[UNK]" in message


def test_an_empty_lexicon_warns_that_it_is_whole_word_masking():
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL)
    for cls, arg in ((M.PhraseMasker, "phrases"), (M.EntityMasker, "entities")):
        with pytest.warns(UserWarning, match=f"{arg} is empty.*whole-word masking") as caught:
            m = cls(**{arg: []}, **kw)
        assert [w.filename for w in caught] == [__file__]
        assert m.lexicon_ids == [] and m.max_unit_length == 1
        # Through from_config (a fixed stacklevel pointed into masking.py): the user's line
        with pytest.warns(UserWarning, match=f"{arg} is empty") as caught:
            cls.from_config(m.get_config())
        assert [w.filename for w in caught] == [__file__]
    with pytest.warns(UserWarning, match=r"min_count=5.*most frequent pair.*occurs 1 time"
                      ) as caught:
        assert kb.preprocessing.learn_phrases(["the film was great", "a dull plot"]) == []
    assert [w.filename for w in caught] == [__file__]


def test_entries_longer_than_the_rows_cost_nothing():
    """An entry longer than the rows can never match: the matcher's graph does not grow with it."""
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=SPECIAL)
    short = M.EntityMasker(entities=[[10, 11], [12, 13, 14]], **kw)
    long = M.EntityMasker(entities=[[10, 11], [12, 13, 14], [20] * 300], **kw)
    assert long.max_unit_length == 300
    ids = tf.constant([[CLS, 10, 11, 5, 12, 13, 14, SEP]])
    spec = tf.TensorSpec([None, 8], tf.int32)

    def size(m):
        return len(tf.function(m.find_units).get_concrete_function(spec).graph.get_operations())

    assert size(long) <= size(short) + 10
    np.testing.assert_array_equal(long.find_units(ids).numpy(), short.find_units(ids).numpy())
    assert long.find_units(ids).numpy().tolist() == [[0, 2, 0, 0, 3, 0, 0, 0]]
    fits = tf.constant([[CLS] + [20] * 300 + [SEP]])
    assert long.find_units(fits).numpy()[0, 1] == 300  # still found where it fits


def _find_units_in_a_session(entities, *batches):
    """find_units of an EntityMasker of `entities` on each of `batches`, its rows' length unknown
    when traced (`[None, None]`, as ragged or unpadded rows), one graph and session for all: for
    each batch (the matches, the number of ops its run executed, from the session's step
    stats)."""
    graph = tf.Graph()
    with graph.as_default():
        m = M.EntityMasker(entities=entities, vocabulary=VOCAB, unselectable_token_ids=SPECIAL)
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        units = m.find_units(ids)
        results = []
        with tf.compat.v1.Session(graph=graph) as session:
            for batch in batches:
                trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                stats = tf.compat.v1.RunMetadata()
                found = session.run(units, {ids: batch}, options=trace, run_metadata=stats)
                results.append((found.tolist(),
                                sum(len(d.node_stats) for d in stats.step_stats.dev_stats)))
    return results


def test_entries_longer_than_the_rows_cost_nothing_at_run_time_too():
    """With the rows' length unknown at trace time, the windows stop at the batch's row length
    at run time: a batch runs the same ops whether the entries longer than its rows are 40 or
    300 tokens long (they ran ~300 more), with the same matches; where they fit, they match."""
    names = [[10, 11], [12, 13, 14]]
    batch = [[CLS, 10, 11, 5, 12, 13, 14, SEP]]
    (found, ops), = _find_units_in_a_session(names + [[20] * 40], batch)
    assert found == [[0, 2, 0, 0, 3, 0, 0, 0]]
    assert _find_units_in_a_session(names + [[20] * 300], batch) == [(found, ops)]
    lexicon = names + [[20] * 40, [20] * 300]
    widths = (40, 100, 300)  # the widths' branches up to the widest
    rows = [[CLS, 10, 11] + [20] * n + [SEP] for n in widths]
    for n, row, (found, _) in zip(widths, rows,
                                  _find_units_in_a_session(lexicon, *[[row] for row in rows])):
        assert {t: k for t, k in enumerate(found[0]) if k} == reference_units(row, lexicon), n
        assert found[0][3] == (300 if n == 300 else 40)


@pytest.mark.parametrize("corpus, options, message", [
    (None, {}, r"corpus must be an iterable of documents .* got NoneType None"),
    (5, {}, r"corpus must be an iterable of documents .* got int 5"),
    (["a b"], {"min_count": "5"}, r"min_count must be an integer >= 1; got '5'"),
    (["a b"], {"min_count": None}, r"min_count must be an integer >= 1; got None"),
    (["a b"], {"min_count": 2.7}, r"min_count must be an integer >= 1; got 2.7"),
    (["a b"], {"max_words": 2.5}, r"max_words must be an integer >= 2; got 2.5"),
    (["a b"], {"max_words": True}, r"max_words must be an integer >= 2; got True"),
    (["a b"], {"max_phrases": 0.5}, r"max_phrases must be an integer >= 1 or None; got 0.5"),
    (["a b"], {"threshold": "x"}, r"threshold is a normalized PMI in \[-1, 1\]; got 'x'"),
    (["a b"], {"threshold": float("nan")}, r"threshold is a normalized PMI .* got nan"),
    (["a b"], {"stop_words": "the"}, r"stop_words must be a list of words .* got 'the'"),
    (["a b"], {"stop_words": [1]}, r"stop_words must be a list of words .* got \[1\]"),
    (["a b"], {"lowercase": "no"}, r"lowercase must be True or False; got 'no'"),
], ids=["corpus_none", "corpus_int", "min_count_str", "min_count_none", "min_count_float",
        "max_words_float", "max_words_bool", "max_phrases_float", "threshold_str",
        "threshold_nan", "stop_words_str", "stop_words_int", "lowercase_str"])
def test_learn_phrases_refuses_bad_arguments_by_name(corpus, options, message):
    """Before: Python's TypeErrors ("'<' not supported between 'int' and 'str'", "'int' object
    has no attribute 'lower'", "not iterable"), a float count or length silently truncated, and
    stop_words="the" read as the letters t, h, e ("the new" came out as a phrase)."""
    with pytest.raises(ValueError, match=message):
        kb.preprocessing.learn_phrases(corpus, **options)


@pytest.mark.parametrize("lexicon, options, message", [
    (5, {}, r"phrases must be a list of entries .* got int 5"),
    ([[5.5, 6.7]], {}, r"entry \[5.5, 6.7\] is neither a string nor a sequence of integer"),
    ([5, 6], {}, r"entry 5 is neither .* \(a one-token entry is a list of one id"),
    ([[5, [6]]], {}, r"entry \[5, \[6\]\] is neither a string nor a sequence of integer"),
    (["new york"], {"tokenizer": "bert"}, r"tokenizer='bert': expected a tokenizer object"),
    ([[5, 6]], {"prefer_units": "no"}, r"prefer_units must be True or False; got 'no'"),
], ids=["int", "float_ids", "bare_ids", "nested", "tokenizer_str", "prefer_units_str"])
def test_lexicon_maskers_refuse_entries_that_are_not_strings_or_ids(lexicon, options, message):
    """Before: float ids were truncated (5.5 -> 5) and bare ints read as one-token entries,
    silently; an int lexicon or a string tokenizer were Python's "not iterable" / "not
    callable"; prefer_units="no" preferred units."""
    with pytest.raises(ValueError, match=message):
        M.PhraseMasker(vocabulary=VOCAB, phrases=lexicon, unselectable_token_ids=SPECIAL,
                       **options)
