"""QuestionAnswerer on XLNet from raw strings, in HF's layout for XLNet (`run_qa.py` with its
left-padding tokenizer): windows of `context-window <sep> question <sep> <cls>`, padded on the
left, the no-answer label at `<cls>` (the last position); `answer()` and the exported string
signature read the answer back as character offsets into the original context.

The backbone is a tiny random XLNet; the layout follows the backbone, not the tokenizer: most
tests use WordPiece (`make_tokenizer`; `make_hf_tokenizer` is HF's reference of the same
vocabulary in XLNet's configuration), one XLNet's own SentencePiece `XLNetTokenizer` against HF's.
Conversion of HF's `XLNetForQuestionAnsweringSimple` is in test_conversion.py.
"""
import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import check_export_answers_as_answer_does, check_says_no_answer, to_numpy


def make_tokenizer(bert_vocab):
    return kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)


def make_hf_tokenizer(bert_vocab):
    """HF's fast tokenizer of the same vocabulary in XLNet's QA configuration (what
    `XLNetTokenizerFast` is out of the box): pairs `A <sep> B <sep> <cls>` with segment ids
    0 / 1 / 2, padding on the left."""
    transformers = pytest.importorskip("transformers")
    from tokenizers.processors import TemplateProcessing

    hf = transformers.BertTokenizerFast(bert_vocab, do_lower_case=True)
    hf.padding_side = "left"
    specials = [("[SEP]", hf.sep_token_id), ("[CLS]", hf.cls_token_id)]
    hf._tokenizer.post_processor = TemplateProcessing(
        single="$A:0 [SEP]:0 [CLS]:2", pair="$A:0 [SEP]:0 $B:1 [SEP]:1 [CLS]:2",
        special_tokens=specials)
    return hf


QUESTION = "Where does the café owner live?"
CONTEXT = ("Long ago there was a small town with many shops and a river. " * 3
           + "The café owner, Zoë Brontë, lives in Zürich near the lake. It rained.")
ANSWER = "Zürich"
NO_QUESTION = "What colour is the sky?"  # SQuAD 2.0's unanswerable: answer_start = -1
NO_CONTEXT = "Ada Lovelace wrote the first program in 1843."
SEQUENCE_LENGTH, STRIDE, MAX_QUESTION = 32, 8, 10


@pytest.fixture(scope="module")
def tokenizer(bert_vocab):
    return make_tokenizer(bert_vocab)


@pytest.fixture(scope="module")
def qa(tokenizer):
    """A QuestionAnswerer on a tiny XLNet, fitted on the long example (its answer in a late
    window) and the unanswerable one until it has memorized both."""
    keras.utils.set_random_seed(7)
    backbone = kb.models.XLNetBackbone(tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
                                       hidden_dim=32, intermediate_dim=64)
    qa = kb.tasks.QuestionAnswerer(backbone, preprocessor=kb.preprocessing.
                                   QuestionAnswererPreprocessor(
                                       tokenizer, SEQUENCE_LENGTH, stride=STRIDE,
                                       max_question_length=MAX_QUESTION))
    qa.compile(learning_rate=3e-3)
    start = CONTEXT.index(ANSWER)
    qa.fit(([QUESTION, NO_QUESTION] * 8, [CONTEXT, NO_CONTEXT] * 8),
           ([start, -1] * 8, [ANSWER, ""] * 8), batch_size=2, epochs=6, verbose=0)
    return qa


def _written_out(tokenizer, context_ids, question_ids):
    """XLNet's QA window written out (HF `XLNetTokenizer`'s pair layout with the context first,
    left padding): ids, segment ids, padding mask."""
    ids = context_ids + [tokenizer.sep_token_id] + question_ids + [tokenizer.sep_token_id,
                                                                  tokenizer.cls_token_id]
    seg = [0] * (len(context_ids) + 1) + [1] * (len(question_ids) + 1) + [2]
    n = SEQUENCE_LENGTH - len(ids)
    return ([tokenizer.pad_token_id] * n + ids, [3] * n + seg, [0] * n + [1] * len(ids))


def test_windows_labels_and_offsets_in_xlnets_layout(qa, tokenizer):
    """Every window as XLNet's layout writes it out, striding over the context (`stride` context
    tokens between window starts, as BERT's layout); labels on the answer's tokens where the
    window holds it whole, else on `<cls>` (never padding); each context position's character
    span is its token's offsets, every other position -1."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    pre = qa.preprocessor
    assert pre.packing_layout == "xlnet" and pre.layout == "auto"  # the task's backbone
    questions, contexts = [QUESTION, NO_QUESTION], [CONTEXT, NO_CONTEXT]
    x, y = pre.call((tf.constant(questions), tf.constant(contexts)),
                    (tf.constant([CONTEXT.index(ANSWER), -1]), tf.constant([ANSWER, ""])))
    _, meta = pre.windows(tf.constant(questions), tf.constant(contexts))
    x = {k: to_numpy(v) for k, v in x.items()}
    s, e = to_numpy(y["start_positions"]), to_numpy(y["end_positions"])
    t0, t1 = to_numpy(meta["token_start"]), to_numpy(meta["token_end"])
    example = to_numpy(meta["example_index"])
    cls = SEQUENCE_LENGTH - 1
    ids, starts, ends = tokenize_with_offsets(tokenizer, tf.constant(contexts))
    counts, reach = [0, 0], [0, 0]
    for w, b in enumerate(example):
        c_ids, c_start, c_end = (t.to_list()[b] for t in (ids, starts, ends))
        q_ids = tokenizer([questions[b]]).to_list()[0][:MAX_QUESTION]
        budget = SEQUENCE_LENGTH - 3 - len(q_ids)
        first = counts[b] * STRIDE
        counts[b] += 1
        window = c_ids[first:first + budget]
        assert window and reach[b] < len(c_ids)  # a window only while context is left
        reach[b] = first + len(window)
        want = _written_out(tokenizer, window, q_ids)
        for key, row in zip(("token_ids", "segment_ids", "padding_mask"), want):
            np.testing.assert_array_equal(x[key][w], row, err_msg=f"{key} of window {w}")
        lead = SEQUENCE_LENGTH - 3 - len(q_ids) - len(window)
        span = np.full(SEQUENCE_LENGTH, -1)
        span[lead:lead + len(window)] = c_start[first:first + budget]
        np.testing.assert_array_equal(t0[w], span)
        span[lead:lead + len(window)] = c_end[first:first + budget]
        np.testing.assert_array_equal(t1[w], span)
        assert x["padding_mask"][w, s[w]] == 1 and x["padding_mask"][w, e[w]] == 1
        if s[w] == cls:
            assert e[w] == cls and x["token_ids"][w, cls] == tokenizer.cls_token_id
        else:
            assert CONTEXT[t0[w, s[w]]:t1[w, e[w]]] == ANSWER and b == 0
    assert counts[0] >= 4 and counts[1] == 1  # the long context is cut into windows
    assert reach == [len(row) for row in ids.to_list()]  # and read to its end
    answered = [w for w in range(len(example)) if s[w] != cls]
    assert answered and answered[0] > 0  # the answer is in later windows only
    assert all(s[w] == cls for w in range(len(example)) if example[w] == 1)  # unanswerable


def test_windows_and_labels_equal_hfs_run_qa_for_xlnet(qa, tokenizer, bert_vocab):
    """HF's `run_qa.py` (`prepare_train_features`) for XLNet, whose tokenizer pads on the left:
    `tokenizer(contexts, questions, truncation="only_first", stride=overlap,
    return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")`, labels
    at the answer's tokens or `input_ids.index(cls_token_id)`. Our `stride` is the step between
    window starts (BERT's doc_stride), HF's the overlap: HF's `stride` is the window's context
    budget minus ours. The same windows, ids, masks, segment ids (HF pads them with 0, XLNet's
    tokenizer with 3), context offsets and labels."""
    assert _equal_to_run_qa(qa.preprocessor, make_hf_tokenizer(bert_vocab)) >= 3


def test_xlnet_tokenizer_windows_equal_run_qa_and_answer_from_text(tmp_path):
    """XLNet's own SentencePiece tokenizer (cased, accents stripped: "Zoë Brontë" -> "Zoe
    Bronte", offsets into the original): the windows, offsets and labels equal HF `run_qa.py`'s
    with HF's `XLNetTokenizer` of the same model, and `answer()` answers with character spans of
    the original contexts."""
    import transformers

    from keras_bertfam.preprocessing import corpus

    docs = [d.decode() for d in corpus.default_corpus().take(100).as_numpy_iterator()]
    kb.preprocessing.train_xlnet_sentencepiece_model(
        docs + [CONTEXT, NO_CONTEXT, QUESTION] * 5, 500, output_file=str(tmp_path / "spiece.model"))
    tokenizer = kb.preprocessing.XLNetTokenizer(str(tmp_path / "spiece.model"))
    hf = transformers.XLNetTokenizer.from_pretrained(str(tmp_path))
    assert hf.padding_side == "left"
    keras.utils.set_random_seed(3)
    qa = kb.tasks.QuestionAnswerer(
        kb.models.XLNetBackbone(tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
                                hidden_dim=16, intermediate_dim=32),
        preprocessor=kb.preprocessing.QuestionAnswererPreprocessor(
            tokenizer, SEQUENCE_LENGTH, stride=STRIDE, max_question_length=16))  # as HF: whole
    assert _equal_to_run_qa(qa.preprocessor, hf) >= 3
    questions, contexts = [QUESTION, NO_QUESTION, "Who?"], [CONTEXT, NO_CONTEXT, "Zoë Brontë."]
    want = qa.answer(questions, contexts)
    for a, context in zip(want, contexts):
        assert 0 <= a["start"] < a["end"] <= len(context) and context[a["start"]:a["end"]] == \
            a["text"]
    # (its export: `make serving-check`, loaded in TF 2.12.1)


def _equal_to_run_qa(preprocessor, hf):
    """Asserts `preprocessor`'s windows, offsets and labels equal HF `run_qa.py`'s with the
    left-padding tokenizer `hf`; returns how many windows hold the answer."""
    import tensorflow as tf

    questions = [QUESTION, NO_QUESTION, "Who wrote it?", "Where?"]
    contexts = [CONTEXT, NO_CONTEXT, "İstanbul's naïve résumé was written by Ada Lovelace.",
                CONTEXT[:CONTEXT.index(ANSWER) + len(ANSWER)]]  # the answer ends the context
    answers = [(CONTEXT.index(ANSWER), ANSWER), (-1, ""),
               (contexts[2].index("Ada"), "Ada Lovelace"), (CONTEXT.index(ANSWER), ANSWER)]
    x, y = preprocessor.call((tf.constant(questions), tf.constant(contexts)),
                             (tf.constant([a[0] for a in answers]),
                              tf.constant([a[1] for a in answers])))
    _, meta = preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    ours = {k: to_numpy(v) for k, v in dict(x, **y, token_start=meta["token_start"],
                                              token_end=meta["token_end"]).items()}
    w = labelled = 0
    for b, (question, context) in enumerate(zip(questions, contexts)):
        budget = SEQUENCE_LENGTH - 3 - len(hf(question, add_special_tokens=False)["input_ids"])
        enc = hf([context], [question], truncation="only_first", max_length=SEQUENCE_LENGTH,
                 stride=budget - STRIDE, return_overflowing_tokens=True,
                 return_offsets_mapping=True, return_token_type_ids=True, padding="max_length")
        for i, ids in enumerate(enc["input_ids"]):
            real = np.array(enc["attention_mask"][i]) == 1
            np.testing.assert_array_equal(ours["token_ids"][w], ids)
            np.testing.assert_array_equal(ours["padding_mask"][w], enc["attention_mask"][i])
            np.testing.assert_array_equal(ours["segment_ids"][w][real],
                                          np.array(enc["token_type_ids"][i])[real])
            assert (ours["segment_ids"][w][~real] == 3).all()
            in_context = [k for k, sid in enumerate(enc.sequence_ids(i)) if sid == 0]
            offsets = np.array(enc["offset_mapping"][i])
            for key, column in (("token_start", 0), ("token_end", 1)):
                want = np.full(SEQUENCE_LENGTH, -1)
                want[in_context] = offsets[in_context, column]
                np.testing.assert_array_equal(ours[key][w], want)
            # run_qa.py's labels, its scans kept inside the context (run_qa's start scan steps
            # past the context's last token into `<sep>` and the question when the answer ends
            # the window: XLNet's context comes first)
            start = end = ids.index(hf.cls_token_id)
            first, last = in_context[0], in_context[-1]
            a0, a1 = answers[b][0], answers[b][0] + len(answers[b][1])
            if a0 >= 0 and offsets[first][0] <= a0 and offsets[last][1] >= a1:
                start = max(k for k in in_context if offsets[k][0] <= a0)
                end = min(k for k in in_context if offsets[k][1] >= a1)
            assert (ours["start_positions"][w], ours["end_positions"][w]) == (start, end), (b, i)
            labelled += start != ids.index(hf.cls_token_id)
            w += 1
    assert w == len(ours["token_ids"])
    return labelled


def test_fit_then_answer(qa, tokenizer, tmp_path):
    """Fitted on raw strings, `answer()` finds the answer in a later window as character offsets
    into the original context; the unanswerable example's windows put both logits' maximum on
    `<cls>`; saved and loaded, it packs XLNet's layout and gives the same answers."""
    import tensorflow as tf

    best = qa.answer([QUESTION, NO_QUESTION], [CONTEXT, NO_CONTEXT])
    assert best[0]["text"] == ANSWER
    assert (best[0]["start"], best[0]["end"]) == (CONTEXT.index(ANSWER),
                                                  CONTEXT.index(ANSWER) + len(ANSWER))
    features, meta = qa.preprocessor.windows(tf.constant([QUESTION, NO_QUESTION]),
                                             tf.constant([CONTEXT, NO_CONTEXT]))
    first_window_end = to_numpy(meta["token_end"])[0].max()
    assert best[0]["start"] >= first_window_end  # past the first window
    # the packed windows straight into the model (`predict` would read a dict as raw text)
    out = keras.Model.predict(qa, {k: to_numpy(v) for k, v in features.items()}, verbose=0)
    unanswerable = to_numpy(meta["example_index"]) == 1
    for key in ("start_logits", "end_logits"):
        assert (out[key][unanswerable].argmax(-1) == SEQUENCE_LENGTH - 1).all()
    qa.save(str(tmp_path / "qa.keras"))
    again = keras.saving.load_model(str(tmp_path / "qa.keras"))
    assert again.preprocessor.packing_layout == "xlnet"
    assert again.answer([QUESTION, NO_QUESTION], [CONTEXT, NO_CONTEXT]) == best


def test_says_no_answer_at_cls_last(qa, tmp_path):
    """SQuAD 2.0's "no answer" (`check_says_no_answer`) in XLNet's layout: the null score is read
    at `<cls>`, the last position (`meta["cls_index"]`), of windows padded on the left; the
    fixture learned to answer the long example and to put the unanswerable one's logits on
    `<cls>`. The SavedModel's string signature (dynamic padding trims the windows on the left)
    answers as `answer()` with the options (long contexts in windows, the unanswerable example,
    an empty context) and passes the tf-text 2.12.1 audit; its `token_ids` signature reads the
    context before the first `<sep>` of XLNet's rows."""
    import tensorflow as tf

    questions, contexts = [QUESTION, NO_QUESTION], [CONTEXT, NO_CONTEXT]
    options, said = check_says_no_answer(qa, questions, contexts)
    assert said[0]["text"] == ANSWER
    if keras.backend.backend() != "tensorflow":
        return
    path = str(tmp_path / "qa" / "1")
    check_export_answers_as_answer_does(
        qa, questions + ["Who lives near the lake?", "Who?", "Who lives there?"],
        contexts + [CONTEXT.replace("Zoë", "Ada"), "", "Zoë lives in Zürich."], path, options)
    # packed rows (one window each): the best span of the string signature's window
    questions, contexts = [NO_QUESTION, "Who lives there?"], [NO_CONTEXT, "Zoë lives in Zürich."]
    want = qa.answer(questions, contexts)
    features, meta = qa.preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    assert to_numpy(meta["example_index"]).tolist() == [0, 1]
    spans = tf.saved_model.load(path).signatures["token_ids"](**features)
    t0, t1 = to_numpy(meta["token_start"]), to_numpy(meta["token_end"])
    for row in range(2):
        start, end = spans["span_start"].numpy()[row], spans["span_end"].numpy()[row]
        assert (t0[row, start], t1[row, end]) == (want[row]["start"], want[row]["end"])


def test_sequence_length_check_counts_the_layouts_special_tokens(tokenizer):
    """`QuestionAnswererPreprocessor` refuses exactly the `sequence_length`s that leave no context
    token in a window after a question of `max_question_length` tokens and the special tokens of
    the layout it packs: BERT's `[CLS] q [SEP] c [SEP]` (3), RoBERTa's `<s> q </s></s> c </s>`
    (4), XLNet's `c <sep> q <sep> <cls>` (3, whatever the tokenizer's pair separators), also
    when the layout is set after construction. The shortest accepted length packs full rows of
    one context token each. (BERT's count was checked before the layout was set: a byte-level
    BPE tokenizer in XLNet's layout was refused a length that fits, and a layout set later was
    not checked at all: windows of no context.)"""
    import tensorflow as tf

    from keras_bertfam.preprocessing.finetuning import QuestionAnswererPreprocessor

    bpe = kb.preprocessing.BytePairTokenizer(
        {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, "a": 5, "b": 6, "\u0120": 7,
         "\u0120a": 8, "\u0120b": 9}, ["\u0120 a", "\u0120 b"])
    question, context, longest = "a b a b a b a b", "b a b a b", 4
    for tok, layout, specials in ((tokenizer, "bert", 3), (tokenizer, "xlnet", 3), (bpe, "bert", 4),
                                  (bpe, "xlnet", 3)):
        fits = longest + specials + 1
        with pytest.raises(ValueError, match=rf"sequence_length={fits - 1} leaves no room for the "
                                             rf"context after a question of up to {longest} "
                                             rf"tokens and the {specials} special tokens"):
            QuestionAnswererPreprocessor(tok, fits - 1, max_question_length=longest,
                                         layout=layout)
        pre = QuestionAnswererPreprocessor(tok, fits, stride=1, max_question_length=longest,
                                           layout=layout)
        features, meta = pre.windows(tf.constant([question]), tf.constant([context]))
        windows = len(to_numpy(meta["example_index"]))  # one a context token: 5
        assert windows == 5, (tok, layout)
        assert to_numpy(meta["window_length"]).tolist() == [1] * windows, (tok, layout)
        assert (to_numpy(features["padding_mask"]) == 1).all(), (tok, layout)  # rows are full
    # a layout set later is checked too (and a refused one not kept)
    pre = QuestionAnswererPreprocessor(bpe, longest + 4, max_question_length=longest,
                                       layout="xlnet")
    with pytest.raises(ValueError, match=rf"sequence_length={longest + 4} leaves no room .* the 4 "
                                         "special tokens"):
        pre.layout = "bert"
    assert pre.layout == "xlnet"
    # the question's bound itself: a negative one cut every question's last tokens, 0 dropped it
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=rf"max_question_length must be a positive number of "
                                             rf"tokens; got {bad!r}"):
            QuestionAnswererPreprocessor(tokenizer, 32, max_question_length=bad)
