"""SavedModel export: every task's export passes the tf-text 2.12.1 op audit, loads in a fresh
process that imports only tensorflow + tensorflow_text, and gives the in-process outputs (<= 1e-5)
(every task type, and every family's fine-tuning tasks: BERT, ALBERT, DistilBERT, ELECTRA,
SpanBERT and XLNet here, RoBERTa in test_roberta, Longformer in test_longformer);
the audit catches keras-hub's round-robin packer; saved_model_cli lists the signatures. What the
pretrainers' signatures compute (ELECTRA, SpanBERT, XLNet) is checked in process on every backend."""
import json
import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import without_unused_imports

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a film was great dull bad good movie story actor plot who wrote it ada , . ! ? "
    "##s ##ing ##ed"
).split()
SEQ = 16
TEXT_A = ["the film was great!", "a dull plot, bad actor", "ada wrote it"]
TEXT_B = ["good story", "the movie", "who wrote it?"]


def tokenizer():
    return kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)


# One layer: what an export traces, saves and serves is the same for every layer, and each layer
# is traced twice per export (token_ids and the string signature) and restored again by the
# fresh process. Two where depth is the point: ALBERT's shared block called twice, the
# Distiller's student taken from a teacher's second layer.
def backbone(num_layers=1):
    return kb.models.BertBackbone(len(VOCAB), num_layers, 2, 16, 32, max_sequence_length=32)


def albert_backbone():
    return kb.models.AlbertBackbone(len(VOCAB), 2, 2, 8, 16, 32, max_sequence_length=32)


def packed(tok, *segments):
    packer = kb.preprocessing.SegmentPacker(SEQ, start_value=2, end_value=3, pad_value=0)
    ids, seg, mask = packer(tuple(segments))
    return {"token_ids": tf.cast(ids, tf.int32).numpy(), "segment_ids": seg.numpy(),
            "padding_mask": tf.cast(mask, tf.int32).numpy()}


def with_mask(tok, texts, mask="[MASK]", mask_id=4):
    """Token ids of texts where `mask` stands for the mask id (built by hand, not by export)."""
    rows = []
    for text in texts:
        ids = []
        for i, piece in enumerate(text.split(mask)):
            ids += [mask_id] if i else []
            ids += tok([piece]).to_list()[0] if piece.strip() else []
        rows.append(ids)
    return tf.ragged.constant(rows, dtype=tf.int32)


SPECIAL = {"cls": 2, "sep": 3, "pad": 0, "mask": 4}


def reference(task, features, special=SPECIAL):
    """In-process outputs: the model on packed features, then its serving_outputs."""
    inputs = task.serving_features({k: keras.ops.convert_to_tensor(v) for k, v in features.items()
                                    if k in task.input}, special)
    out = task.serving_call(inputs)
    return {k: keras.ops.convert_to_numpy(v) for k, v in task.serving_outputs(inputs, out).items()}


def xlnet_packed(tok, texts):
    """XLNet's `A <sep> <cls>` left-packed ids; WordPiece (our VOCAB) or an XLNetTokenizer."""
    from keras_bertfam.preprocessing.packing import xlnet_pack

    if tok.kind == "wordpiece":
        ids = with_mask(tok, texts)
    else:
        ids = with_mask(tok, texts, tok.mask_token, tok.mask_token_id)
    packed_ids = xlnet_pack(ids, None, SEQ, sep_token_id=tok.sep_token_id,
                            cls_token_id=tok.cls_token_id, pad_token_id=tok.pad_token_id)
    return {k: v.numpy() for k, v in packed_ids.items()}


def special_ids(tok):
    return {r: getattr(tok, f"{r}_token_id") for r in ("cls", "sep", "pad", "mask")}


@pytest.fixture(scope="module")
def xlnet_spiece(tmp_path_factory):
    """A tiny SentencePiece model with XLNet's special pieces: the export must track its
    tf-text resource (SentencePiece tokenizers: ALBERT, XLNet). A path: each test makes its
    tokenizer after `set_random_seed`, which deletes tf-text's SentencePiece resources."""
    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    path = str(tmp_path_factory.mktemp("spm") / "spiece.model")
    lines = [f"The film number {i} was great and the plot was dull {i % 7}." for i in range(300)]
    train_xlnet_sentencepiece_model(lines * 3, 60, output_file=path)
    return path


# QA on the real uncased vocabulary: lowercasing and accent stripping change the text's length,
# so character offsets into the original differ from offsets into the normalized text (and from
# byte offsets). The empty context has no answer.
QA_QUESTIONS = ["Where does Zoë live?", "Who wrote it?", "What is ÀÉÎ?", "When?", "Where?"]
QA_CONTEXTS = ["Zoë Brontë, the café owner, lives in Zürich near the lake.",
               "İstanbul's naïve résumé was written by Ada Lovelace in 1843.",
               "ÀÉÎÕÜ ΣΊΣΥΦΟΣ: unaffable ﬁne straße, 東京大学 (1984).",
               "", "cafe\u0301 déjà-vu\u00a0ok then a\u200bb zero width"]


def cases(tok, vocab_file, xlnet_spiece):
    """(name, model, serving inputs, in-process reference outputs, the packed features the
    reference was computed from: what the token_ids signature gets)."""
    keras.utils.set_random_seed(1)
    xlnet_tok = kb.preprocessing.tokenizers.XLNetTokenizer(xlnet_spiece)
    out = []
    bb = backbone()
    f = packed(tok, tok(TEXT_A))
    ref = {k: keras.ops.convert_to_numpy(v) for k, v in bb(f).items()}
    ref["padding_mask"] = f["padding_mask"]
    out.append(("backbone", bb, {"text": TEXT_A}, ref, f))

    masked = ["the [MASK] was great", "a [MASK] plot [MASK]", "[MASK]"]
    mlm = kb.tasks.MaskedLM(backbone(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(tok, SEQ))
    f = packed(tok, with_mask(tok, masked))
    out.append(("masked_lm", mlm, {"text": masked}, reference(mlm, f), f))

    for cls, make in ((kb.tasks.BertPretrainer, backbone), (kb.tasks.AlbertPretrainer, albert_backbone)):
        task = cls(make(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(tok, SEQ))
        f = packed(tok, with_mask(tok, masked), tok(TEXT_B))
        out.append((cls.__name__, task, {"text_a": masked, "text_b": TEXT_B}, reference(task, f),
                    f))

    from keras_bertfam.preprocessing import finetuning as ft

    clf = kb.tasks.TextClassifier(backbone(), num_classes=3,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    text_a = packed(tok, tok(TEXT_A))  # the classifiers' and the sentence encoder's features
    # a literal "[MASK]" is text to a classifier, as to its preprocessor (the export once read
    # it as the mask id in every task's signature: served logits differed from predict's)
    clf_texts = TEXT_A[:2] + ["ada wrote [MASK] it"]
    for w in clf.weights:  # large enough weights that the logits tell the inputs apart
        w.assign(w * 30.0)
    f = packed(tok, tok(clf_texts))
    ref = reference(clf, f)
    np.testing.assert_allclose(ref["logits"], clf.predict(clf_texts, verbose=0), atol=1e-6)
    out.append(("text_classifier", clf, {"text": clf_texts}, ref, f))

    # Every family's fine-tuning tasks serve strings (issue 13: SpanBERT's and DistilBERT's were
    # never exported): the task types spread over the families instead of one more export each
    # (RoBERTa's: test_roberta; Longformer's: test_longformer).
    distil = kb.tasks.TextClassifier(
        kb.models.DistilBertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=32),
        num_classes=3, preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    ref = reference(distil, text_a)  # no segment_ids: DistilBERT has no segment table
    np.testing.assert_allclose(ref["logits"], distil.predict(TEXT_A, verbose=0), atol=1e-6)
    out.append(("distil_bert_text_classifier", distil, {"text": TEXT_A}, ref, text_a))

    tagger = kb.tasks.TokenClassifier(  # SpanBERT
        kb.models.SpanBertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=32),
        num_classes=4, preprocessor=ft.TokenClassifierPreprocessor(tok, SEQ))
    out.append(("token_classifier", tagger, {"text": TEXT_A}, reference(tagger, text_a), text_a))

    # XLNet's layout (`A <sep> <cls>`, left padded), its own SentencePiece tokenizer
    xlnet_clf = kb.tasks.TextClassifier(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 1, 2, 16, 32), num_classes=3,
        preprocessor=ft.TextClassifierPreprocessor(xlnet_tok, SEQ))
    xlnet_texts = [t.capitalize() for t in TEXT_A]
    f = xlnet_packed(xlnet_tok, xlnet_texts)
    ref = reference(xlnet_clf, f, special_ids(xlnet_tok))
    np.testing.assert_allclose(ref["logits"], xlnet_clf.predict(xlnet_texts, verbose=0),
                               atol=1e-6)
    out.append(("xlnet_text_classifier", xlnet_clf, {"text": xlnet_texts}, ref, f))

    real = kb.preprocessing.WordPieceTokenizer(vocab_file, lowercase=True)
    qa = kb.tasks.QuestionAnswerer(
        kb.models.BertBackbone(real.vocabulary_size(), 1, 2, 16, 32, max_sequence_length=64),
        preprocessor=ft.QuestionAnswererPreprocessor(real, 48, stride=16, max_question_length=16))
    f = qa.preprocessor._features([real(QA_QUESTIONS), real(QA_CONTEXTS)])
    special = {"cls": real.cls_token_id, "sep": real.sep_token_id, "pad": real.pad_token_id,
               "mask": real.mask_token_id}
    f = {k: v.numpy() for k, v in f.items()}
    ref = reference(qa, f, special)
    answers = qa.answer(QA_QUESTIONS, QA_CONTEXTS)  # in-process: offsets into the original
    ref.update(answer_start=np.array([a["start"] for a in answers], np.int32),
               answer_end=np.array([a["end"] for a in answers], np.int32),
               answer_text=np.array([a["text"].encode() for a in answers], object),
               null_score=np.array([a["null_score"] for a in answers], np.float32))
    out.append(("question_answerer", qa, {"question": QA_QUESTIONS, "context": QA_CONTEXTS}, ref,
                f))

    mc = kb.tasks.MultipleChoice(  # ELECTRA
        kb.models.ElectraBackbone(len(VOCAB), 1, 2, 16, 8, 32, max_sequence_length=32),
        preprocessor=ft.MultipleChoicePreprocessor(tok, SEQ))
    choices = [[b, a] for a, b in zip(TEXT_A, TEXT_B)]
    flat = packed(tok, tok([t for t in TEXT_A for _ in range(2)]),
                  tok([c for row in choices for c in row]))
    f = {k: v.reshape(3, 2, SEQ) for k, v in flat.items()}
    out.append(("multiple_choice", mc, {"prompt": TEXT_A, "choices": choices}, reference(mc, f), f))

    enc = kb.tasks.SentenceEncoder(albert_backbone(),  # ALBERT, the default mean pooling
                                   preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    ref = reference(enc, text_a)
    np.testing.assert_allclose(ref["embedding"], enc.encode(TEXT_A), atol=1e-5)
    out.append(("sentence_encoder", enc, {"text": TEXT_A}, ref, text_a))
    # "cls" on XLNet reads `<cls>`, last in its left-padded `A <sep> <cls>` rows
    xlnet_enc = kb.tasks.SentenceEncoder(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 1, 2, 16, 32), pooling_mode="cls",
        preprocessor=ft.TextClassifierPreprocessor(xlnet_tok, SEQ))
    f = xlnet_packed(xlnet_tok, xlnet_texts)
    ref = reference(xlnet_enc, f, special_ids(xlnet_tok))
    np.testing.assert_allclose(ref["embedding"], xlnet_enc.encode(xlnet_texts), atol=1e-5)
    out.append(("xlnet_sentence_encoder", xlnet_enc, {"text": xlnet_texts}, ref, f))

    mlm_pre = kb.preprocessing.MaskedLMPreprocessor(tok, SEQ)
    f = packed(tok, with_mask(tok, masked))
    disc = kb.models.ElectraBackbone(len(VOCAB), 1, 2, 16, 8, 32,
                                     max_sequence_length=32)
    electra = kb.tasks.ElectraPretrainer(discriminator=disc, preprocessor=mlm_pre)
    out.append(("ElectraPretrainer", electra, {"text": masked}, reference(electra, f), f))
    spanbert = kb.tasks.SpanBertPretrainer(
        kb.models.SpanBertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=32),
        position_embedding_dim=8, preprocessor=mlm_pre)
    out.append(("SpanBertPretrainer", spanbert, {"text": masked}, reference(spanbert, f), f))
    teacher = kb.tasks.MaskedLM(backbone(num_layers=2))
    student = kb.tasks.student_from_teacher(teacher.backbone, layers=(1,))
    distiller = kb.tasks.Distiller(teacher, student, preprocessor=mlm_pre)
    out.append(("Distiller", distiller, {"text": masked}, reference(distiller.student, f), f))
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    xlnet = kb.tasks.XLNetPretrainer(
        kb.models.XLNetBackbone(xlnet_tok.vocabulary_size(), 1, 2, 16, 32),
        preprocessor=XLNetPreprocessor(xlnet_tok, SEQ, batch_size=2))
    sp_masked = [t.replace("[MASK]", "<mask>").capitalize() for t in masked]
    f = xlnet_packed(xlnet_tok, sp_masked)
    out.append(("XLNetPretrainer", xlnet, {"text": sp_masked},
                reference(xlnet, f, special_ids(xlnet_tok)), f))
    return out


# A serving client's process: TensorFlow and tf-text only (tf-text imports Keras: what Keras and
# TensorFlow would import besides is left out).
FRESH = without_unused_imports("jax") + r'''
import contextlib, io, json, traceback
import numpy as np
import tensorflow as tf
spec = json.load(open(sys.argv[1]))  # a list of jobs, or {"jobs", "cli_dir", "cli_out"}
jobs = spec["jobs"] if isinstance(spec, dict) else spec
if isinstance(spec, dict) and spec.get("cli_dir"):
    # saved_model_cli as its console script runs it (`sys.exit(main())`), before tf-text is
    # imported
    from tensorflow.python.tools import saved_model_cli
    sys.argv = ["saved_model_cli", "show", "--dir", spec["cli_dir"], "--all"]
    stdout, code = io.StringIO(), None
    with contextlib.redirect_stdout(stdout):
        try:
            saved_model_cli.main()
        except SystemExit as exit:
            code = exit.code
        except Exception:
            code = traceback.format_exc()
    json.dump({"code": code, "stdout": stdout.getvalue()}, open(spec["cli_out"], "w"))
import tensorflow_text  # registers the tf-text ops the tokenizer uses
for job in jobs:
    model = tf.saved_model.load(job["dir"])
    inputs = {k: tf.constant(v) for k, v in job["inputs"].items()}
    out = model.signatures["serving_default"](**inputs)
    signature = model.signatures["token_ids"]
    ids = {k: tf.constant(np.asarray(v, np.int32)) for k, v in job["ids"].items()
           if k in signature.structured_input_signature[1]}  # DistilBERT has no segment ids
    out_ids = signature(**ids)
    np.savez(job["out"], **{k: v.numpy() for k, v in out.items()},
             **{"ids__" + k: v.numpy() for k, v in out_ids.items()})
# tensorflow_text pulls in keras itself; our code and keras-hub must not be needed
assert "keras_bertfam" not in sys.modules and "keras_hub" not in sys.modules
print("ok")
'''


@pytest.fixture(scope="module")
def exports(tmp_path_factory, bert_vocab, xlnet_spiece):
    root = tmp_path_factory.mktemp("exports")
    scratch = tmp_path_factory.mktemp("tempdir")  # the exports' temporary files, looked at below
    tok = tokenizer()
    done, models, features = [], {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(scratch))
        for name, model, inputs, ref, ids in cases(tok, bert_vocab, xlnet_spiece):
            path = str(root / name / "1")
            # QA (the real vocabulary) and XLNet (SentencePiece) export their own tokenizers
            own = name in ("question_answerer", "XLNetPretrainer", "xlnet_text_classifier",
                           "xlnet_sentence_encoder")
            signatures = kb.export.export_saved_model(model, path,
                                                      sequence_length=None if own else SEQ,
                                                      tokenizer=None if own else tok)
            assert signatures == ["serving_default", "token_ids"]
            done.append((name, path, inputs, ref))
            models[name] = model
            features[name] = ids
    left = sorted(n for n in os.listdir(scratch) if n.startswith("kb_export_"))
    return root, done, models, left, features


def test_every_export_passes_the_tf_text_2_12_audit(exports):
    done = exports[1]
    for name, path, _, _ in done:
        report = kb.export.audit_ops(path, tf_text="2.12.1")
        text_ops = {op for op, kind in report["ops"].items() if kind == "tf-text"}
        assert text_ops <= kb.export.TF_TEXT_2_12_OPS
        assert text_ops & {"FastWordpieceTokenizeWithOffsets", "SentencepieceTokenizeOp"}
        assert not report["unsupported"], name
        assert report["tensorflow"] == "2.12.1" and not report["unknown_attrs"], name
        assert os.path.exists(os.path.join(path, "assets", "vocab.txt"))
        assert os.listdir(os.path.join(path, "variables"))


@pytest.fixture(scope="module")
def fresh(exports, tmp_path_factory, serving_process):
    """One fresh TensorFlow process for every export (and for saved_model_cli, run first, before
    tf-text is imported; conftest's `serving_process`). -> (jobs, the process,
    saved_model_cli's {"code", "stdout"})."""
    done, features = exports[1], exports[4]
    tmp = tmp_path_factory.mktemp("fresh")
    jobs = []
    for name, path, inputs, ref in done:
        # the token_ids signature gets the packed features the reference was computed from
        ids = features[name]
        jobs.append({"dir": path, "inputs": inputs, "ids": ids, "out": str(tmp / f"{name}.npz")})
    spec = tmp / "jobs.json"
    cli_out = tmp / "saved_model_cli.json"
    spec.write_text(json.dumps({"jobs": jobs, "cli_out": str(cli_out),
                                "cli_dir": dict((n, p) for n, p, _, _ in done)["BertPretrainer"]},
                               default=lambda a: np.asarray(a).tolist()))
    proc = serving_process(FRESH, spec)
    cli = json.loads(cli_out.read_text()) if cli_out.exists() else None
    return jobs, proc, cli


def test_exports_leave_no_temporary_files(exports):
    """An in-memory vocabulary (every export here but QA's, whose is a file) is written to a
    temporary dir for the export's assets/ and removed once saved: each such export left a
    kb_export_* dir behind."""
    assert exports[3] == []
    for _, path, _, _ in exports[1]:
        assert os.path.exists(os.path.join(path, "assets", "vocab.txt")), path


def test_fresh_tensorflow_process_gives_the_same_outputs(exports, fresh):
    done = exports[1]
    jobs, proc, _ = fresh
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    for (name, path, inputs, ref), job in zip(done, jobs):
        got = np.load(job["out"], allow_pickle=True)
        assert set(ref) == {k for k in got.files if not k.startswith("ids__")}, name
        for key, expected in ref.items():
            if key.startswith("answer_"):  # QA's answers: strings only
                assert "ids__" + key not in got.files
                np.testing.assert_array_equal(got[key], expected, err_msg=f"{name}:{key}")
                continue
            if key == "null_score":  # QA's: per example from strings, per row from ids (here
                # one window an example: the same)
                np.testing.assert_allclose(got[key], expected, rtol=1e-5, err_msg=key)
                np.testing.assert_allclose(got["ids__" + key], expected, rtol=1e-5, err_msg=key)
                continue
            np.testing.assert_allclose(got["ids__" + key], expected, atol=1e-5,
                                       err_msg=f"{name}:token_ids:{key}")
            assert_dynamic_padding_equal(name, key, got, ref)


def assert_dynamic_padding_equal(name, key, got, ref):
    """The string signature pads to the batch's longest row: its per-position outputs are the
    fixed-length reference's first T positions (XLNet, padded on the left: its last T, and the
    mask slots' positions index that shorter row)."""
    value, expected = got[key], ref[key]
    if name != "XLNetPretrainer":
        expected = expected[tuple(slice(0, n) for n in value.shape)]
        if key.startswith("sbo_top"):
            # a slot of no [MASK] (weight 0) at the row's last position reads its right boundary
            # past the end: the padded reference reads a [PAD] there, the trimmed row nothing
            real = got["sbo_weights"] > 0
            assert real.any(), name
            value, expected = value[real], expected[real]
        np.testing.assert_allclose(value, expected, atol=1e-5, err_msg=f"{name}:{key}")
        return
    cut = SEQ - got["mask_weights"].shape[1]
    slots = ref["mask_weights"] > 0  # (B, T): the mask slots come first
    np.testing.assert_array_equal(got["mask_weights"].sum(1), ref["mask_weights"].sum(1))
    if key == "mask_positions":
        np.testing.assert_array_equal(value[slots[:, :value.shape[1]]] + cut, expected[slots])
    elif key == "mask_weights":
        pass
    elif value.ndim >= 2 and value.shape[1] == SEQ - cut:  # per slot
        np.testing.assert_allclose(value[slots[:, :value.shape[1]]], expected[slots], atol=1e-5,
                                   err_msg=f"{name}:{key}")
    else:
        np.testing.assert_allclose(value, expected, atol=1e-5, err_msg=f"{name}:{key}")


def _ids_for(name, inputs, vocab_file, xlnet_spiece):
    """Packed ids the token_ids signature gets: the same features as the reference (for
    test_longformer's exports; this module's keep the features `cases` computed)."""
    tok = tokenizer()
    if name == "backbone" or name in ("text_classifier", "token_classifier", "sentence_encoder",
                                      "distil_bert_text_classifier"):
        return packed(tok, tok(inputs["text"]))
    if name in ("masked_lm", "ElectraPretrainer", "SpanBertPretrainer", "Distiller"):
        return packed(tok, with_mask(tok, inputs["text"]))
    if name in ("XLNetPretrainer", "xlnet_text_classifier", "xlnet_sentence_encoder"):
        return xlnet_packed(kb.preprocessing.tokenizers.XLNetTokenizer(xlnet_spiece),
                            inputs["text"])
    if name in ("BertPretrainer", "AlbertPretrainer"):
        return packed(tok, with_mask(tok, inputs["text_a"]), tok(inputs["text_b"]))
    if name == "question_answerer":
        from keras_bertfam.preprocessing import finetuning as ft

        real = kb.preprocessing.WordPieceTokenizer(vocab_file, lowercase=True)
        f = ft.QuestionAnswererPreprocessor(real, 48, max_question_length=16)._features(
            [real(inputs["question"]), real(inputs["context"])])
        return {k: v.numpy() for k, v in f.items()}
    flat = packed(tok, tok([t for t in inputs["prompt"] for _ in range(2)]),
                  tok([c for row in inputs["choices"] for c in row]))
    return {k: v.reshape(3, 2, SEQ) for k, v in flat.items()}


def test_mlm_export_reads_mask_tokens_in_text(exports, tmp_path):
    done = exports[1]
    ref = dict((n, r) for n, _, _, r in done)["masked_lm"]
    # "[CLS] the [MASK] ..." -> slot 0 is position 2; "[CLS] a [MASK] plot [MASK]" -> 2 and 4
    np.testing.assert_array_equal(ref["mask_weights"].sum(1), [1, 2, 1])
    np.testing.assert_array_equal(ref["mask_positions"][:, :2], [[2, 0], [2, 4], [1, 0]])
    assert ref["mlm_top_ids"].shape == (3, SEQ, 5)
    refs = dict((n, r) for n, _, _, r in done)
    for name in ("ElectraPretrainer", "SpanBertPretrainer", "Distiller", "XLNetPretrainer"):
        np.testing.assert_array_equal(refs[name]["mask_weights"].sum(1), [1, 2, 1], err_msg=name)


def test_saved_model_cli_lists_signatures(fresh):
    """`saved_model_cli show --dir <BertPretrainer export> --all`, run in the fresh process."""
    _, proc, cli = fresh
    assert cli is not None and cli["code"] in (0, None), (cli, proc.stderr[-2000:])
    out = cli["stdout"]
    assert "signature_def['serving_default']" in out and "signature_def['token_ids']" in out
    for name in ("text_a", "text_b", "mlm_top_ids", "nsp_probabilities", "token_ids"):
        assert f"['{name}']" in out, name


def test_audit_catches_keras_hub_round_robin_packer(tmp_path):
    import keras_hub

    packer = keras_hub.layers.MultiSegmentPacker(SEQ, start_value=2, end_value=3,
                                                 truncate="round_robin")
    tok = tokenizer()
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2)
    def serve(a, b):
        ids, segments = packer((tok(a), tok(b)))
        return {"token_ids": ids, "segment_ids": segments}

    path = str(tmp_path / "bad" / "1")
    tf.saved_model.save(module, path, signatures={"serving_default": serve.get_concrete_function()})
    with pytest.raises(kb.export.UnsupportedOpsError, match="TFText>RoundRobinTrim"):
        kb.export.audit_ops(path, tf_text="2.12.1")
    # the same SavedModel is fine for servers linking tf-text 2.20+
    assert not kb.export.audit_ops(path, tf_text="2.20.0")["unsupported"]
    # and core-only targets reject the tokenizer's tf-text ops too
    report = kb.export.audit_ops(path, tf_text=None, raise_on_error=False)
    assert "FastWordpieceTokenizeWithOffsets" in report["unsupported"]


def test_audit_checks_the_target_tensorflow_not_the_running_one(tmp_path):
    """SegmentMaxV2 is core in TF 2.21 (which runs the audit) but not in 2.12.1."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32),
                                  tf.TensorSpec([None], tf.int32)])
    def serve(data, segments):
        return tf.raw_ops.SegmentMaxV2(data=data, segment_ids=segments, num_segments=3)

    path = str(tmp_path / "segment_max" / "1")
    tf.saved_model.save(module, path, signatures={"serving_default": serve.get_concrete_function()})
    with pytest.raises(kb.export.UnsupportedOpsError, match="SegmentMaxV2"):
        kb.export.audit_ops(path, tf_text="2.12.1")
    # the running TensorFlow's registry (the old behaviour) lets it through
    assert not kb.export.audit_ops(path, tf_text="2.12.1", tensorflow=None)["unsupported"]
    # the shipped lists are the registries they name
    assert len(kb.export.core_registry("2.12.1")) == 1845
    assert "SegmentMaxV2" not in kb.export.core_registry("2.12.1")
    assert len(kb.export.TF_TEXT_2_12_OPS) == 35 and len(kb.export.TF_TEXT_2_20_OPS) == 38


def test_audit_checks_attrs_and_export_strips_them(tmp_path, ids_export):
    """TF 2.21 writes `debug_name` on VarHandleOp; 2.12.1 does not define it."""
    module = tf.Module()
    module.scale = tf.Variable(2.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(x):
        return {"y": x * module.scale}

    path = str(tmp_path / "variable" / "1")
    tf.saved_model.save(module, path, signatures={"serving_default": serve.get_concrete_function()})
    with pytest.raises(kb.export.UnsupportedOpsError, match="VarHandleOp attr.*debug_name"):
        kb.export.audit_ops(path)
    report = kb.export.audit_ops(path, raise_on_error=False)
    assert report["unknown_attrs"] == {"VarHandleOp": ["debug_name"]}
    assert kb.export.strip_unknown_attrs(path) == {"VarHandleOp": ["debug_name"]}
    assert not kb.export.audit_ops(path)["unknown_attrs"]
    got = tf.saved_model.load(path).signatures["serving_default"](tf.constant([1.5]))
    np.testing.assert_allclose(got["y"].numpy(), [3.0])
    # our exports are stripped by default, and keep the attrs when asked
    task, stripped, _ = ids_export
    assert not kb.export.audit_ops(stripped)["unknown_attrs"]
    kb.export.export_saved_model(task, str(tmp_path / "b"), include_preprocessing=False,
                                 target_tensorflow=None)
    assert "VarHandleOp" in kb.export.audit_ops(str(tmp_path / "b"),
                                                raise_on_error=False)["unknown_attrs"]


@pytest.fixture(scope="module")
def ids_export(tmp_path_factory):
    """A TextClassifier (vocabulary 28, 32 positions) exported without preprocessing, with the
    defaults (stripped for TF 2.12.1). -> (task, path, the signature names export returned)."""
    keras.utils.set_random_seed(2)
    task = kb.tasks.TextClassifier(backbone(), num_classes=2)
    path = str(tmp_path_factory.mktemp("ids") / "1")
    names = kb.export.export_saved_model(task, path, include_preprocessing=False)
    return task, path, names


@pytest.fixture(scope="module")
def loaded(exports, ids_export):
    """`loaded(name)`: the module's export `name` (`exports`' names, "ids": `ids_export`'s)
    loaded in this process once, for every test calling its signatures (a SavedModel is not
    changed by serving it): a load and each signature's first call cost ~0.2-0.4 s of CPU."""
    paths = dict(((n, p) for n, p, _, _ in exports[1]), ids=ids_export[1])
    models = {}

    def load(name):
        if name not in models:
            models[name] = tf.saved_model.load(paths[name])
        return models[name]

    return load


def test_token_ids_signature_validates_its_input(ids_export, loaded):
    task, path, _ = ids_export  # vocabulary 28, 32 positions
    serve = loaded("ids").signatures["token_ids"]

    def call(ids, segments=None, mask=None):
        ids = np.asarray(ids, np.int32)
        return serve(token_ids=tf.constant(ids),
                     segment_ids=tf.constant(np.zeros_like(ids) if segments is None else segments,
                                             tf.int32),
                     padding_mask=tf.constant(np.ones_like(ids) if mask is None else mask,
                                              tf.int32))

    good = [[2, 5, 6, 3], [2, 7, 3, 0]]
    np.testing.assert_allclose(call(good)["logits"].numpy(),
                               task.predict({"token_ids": np.array(good), "segment_ids":
                                             np.zeros((2, 4)), "padding_mask": np.ones((2, 4))},
                                            verbose=0), atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"token_ids must be in \[0, 28\); got values from\] \[-1\]"):
        call([[2, -1, 3, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token_ids must be in \[0, 28\)"):
        call([[2, 28, 3, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"at most 32 positions .*max_sequence_length.*600"):
        call(np.full([1, 600], 5))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"segment_ids must be in \[0, 2\)"):
        call(good, segments=np.full([2, 4], 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"padding_mask must be in \[0, 2\)"):
        call(good, mask=np.full([2, 4], 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="segment_ids must have the shape"):
        call(good, segments=np.zeros([2, 3]))
    assert call(np.zeros([0, 4], np.int32))["logits"].shape == (0, 2)  # an empty batch


def test_a_softmax_classifier_serves_what_its_logits_serve(ids_export, loaded, tmp_path):
    """keras-hub's `TextClassifier(activation="softmax")` returns probabilities: its export's
    `logits`, `probabilities` and `labels` are those of the same weights with activation=None
    (serving its probabilities as `logits` gave a softmax of probabilities); a regression's
    `scores` are its predictions."""
    task = ids_export[0]
    soft = kb.tasks.TextClassifier(task.backbone, num_classes=2, activation="softmax")
    soft.head.set_weights(task.head.get_weights())
    kb.export.export_saved_model(soft, str(tmp_path / "1"), include_preprocessing=False)
    ids = np.array([[2, 5, 6, 3], [2, 7, 3, 0]], np.int32)
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": (ids > 0).astype(np.int32)}
    served = tf.saved_model.load(str(tmp_path / "1")).signatures["token_ids"](
        **{k: tf.constant(v) for k, v in features.items()})
    reference = loaded("ids").signatures["token_ids"](
        **{k: tf.constant(v) for k, v in features.items()})
    for key in ("logits", "probabilities", "labels"):
        np.testing.assert_allclose(served[key].numpy(), reference[key].numpy(), atol=1e-6,
                                   err_msg=key)
    np.testing.assert_allclose(served["probabilities"].numpy(),
                               soft(features).numpy(), atol=1e-6)
    # a regression's scores are its predictions, after the activation
    bounded = kb.tasks.TextClassifier(task.backbone, num_classes=1, activation="sigmoid")
    kb.export.export_saved_model(bounded, str(tmp_path / "2"), include_preprocessing=False)
    scores = tf.saved_model.load(str(tmp_path / "2")).signatures["token_ids"](
        **{k: tf.constant(v) for k, v in features.items()})["scores"].numpy()
    np.testing.assert_allclose(scores, bounded(features).numpy()[:, 0], atol=1e-6)


def test_each_signature_graph_is_saved_once(exports, ids_export):
    """The model's graph is in the SavedModel once: the string signature calls the token_ids
    function (with preprocessing, and ids only: both signatures name it). A token_ids function
    traced before saving was traced again by the save, and a string signature that traced the
    model itself held a second copy (each +20-24% saved_model.pb, an extra trace per export, a
    slower load). Written-out gradients are saved with the model (TensorFlow's default, so that a
    loaded model differentiates right) as functions of their own: the feed-forward's GELU + Dense
    backward has matmuls, but it is no copy of the model's graph."""
    def with_the_model(path):
        library = kb.export._read_saved_model(path).meta_graphs[0].graph_def.library.function
        return [f.signature.name for f in library
                if "internal_grad_fn" not in f.signature.name
                and any(node.op in ("MatMul", "Einsum", "BatchMatMulV2") for node in f.node_def)]

    path = dict((n, p) for n, p, _, _ in exports[1])["text_classifier"]
    assert len(with_the_model(path)) == 1, with_the_model(path)
    assert len(with_the_model(ids_export[1])) == 1, with_the_model(ids_export[1])


def test_requests_are_cut_to_whole_characters():
    """The string signature keeps CHARACTERS_PER_POSITION characters per position of each text,
    whole, whatever their UTF-8 widths (bytes are cut first, at 4 per character)."""
    from keras_bertfam.export import CHARACTERS_PER_POSITION, _clean_text

    texts = ["\U0001F600" * 100, "a" + "\U0001F600" * 100, "ü" * 200, "é\U0001F600a" * 50, "short"]
    got = _clean_text(tf.constant(texts), sequence_length=1).numpy()
    assert [g.decode() for g in got] == [t[:CHARACTERS_PER_POSITION] for t in texts]


def test_string_signature_bad_input(exports, loaded):
    """Empty batch, empty strings, 1 MB strings (cut before tokenizing), invalid UTF-8; and the
    request is padded to its longest text, not to sequence_length. The module's classifier and
    tagger exports (their preprocessor's tokenizer and length, dynamic padding: the defaults)."""
    clf = exports[2]["text_classifier"]
    serve = loaded("text_classifier").signatures["serving_default"]
    tag = loaded("token_classifier").signatures["serving_default"]
    assert serve(text=tf.constant([], tf.string))["logits"].shape == (0, 3)
    # a 1 MB text; and multi-byte characters past the cut (2 and 4 bytes each, + a space)
    texts = ["", "the film", "ada " * 250_000, "ü " * 3000, "\U0001F600 " * 3000]
    got = serve(text=tf.constant(texts))["logits"].numpy()
    np.testing.assert_allclose(got, clf.predict(texts, verbose=0), atol=1e-5)
    bad = tf.constant([b"the \xff\xfe film", b"\xc3"])  # invalid UTF-8 -> U+FFFD, dropped
    np.testing.assert_allclose(serve(text=bad)["logits"].numpy(),
                               clf.predict(["the  film", ""], verbose=0), atol=1e-5)
    # dynamic padding: "[CLS] the film [SEP]" -> 4 positions
    assert tag(text=tf.constant(["the film", "a"]))["logits"].shape == (2, 4, 4)
    assert tag(text=tf.constant(["a " * 100]))["logits"].shape == (1, SEQ, 4)


def test_export_errors(tmp_path, ids_export):
    task, exported, names = ids_export
    with pytest.raises(ValueError, match="needs a tokenizer"):
        kb.export.export_saved_model(task, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="max_sequence_length"):
        kb.export.export_saved_model(task, str(tmp_path / "b"), tokenizer=tokenizer(),
                                     sequence_length=64)
    # ids only: serving_default is the token_ids signature
    assert names == ["serving_default", "token_ids"]
    with pytest.raises(FileExistsError):
        kb.export.export_saved_model(task, exported, include_preprocessing=False)


def test_cli_export_from_preset_dir(tmp_path, exports):
    from keras_bertfam import cli

    # the module's classifier (TextClassifierPreprocessor(tokenizer(), SEQ)): its predict on
    # TEXT_A is traced already
    clf = exports[2]["text_classifier"]
    clf.save_to_preset(str(tmp_path / "preset"))
    out = str(tmp_path / "serving" / "clf" / "1")
    assert cli.main(["export", "--task", str(tmp_path / "preset"), "--output", out]) == 0
    loaded = tf.saved_model.load(out)
    got = loaded.signatures["serving_default"](text=tf.constant(TEXT_A))
    np.testing.assert_allclose(got["logits"].numpy(), clf.predict(TEXT_A, verbose=0), atol=1e-5)
    assert not kb.export.audit_ops(out)["unsupported"]


# === What the new signatures mean (in process, cheap) ===
def test_qa_export_answers_are_character_offsets_into_the_original(exports):
    done = exports[1]
    ref = dict((n, r) for n, _, _, r in done)["question_answerer"]
    starts, ends, texts = ref["answer_start"], ref["answer_end"], ref["answer_text"]
    shifted = 0
    for context, start, end, text in zip(QA_CONTEXTS, starts, ends, texts):
        if not context:
            assert (start, end, text) == (-1, -1, b"")
            continue
        assert context[start:end].encode() == text and end > start
        shifted += len(context[:start].encode()) != start  # bytes would differ here
    assert shifted >= 2


def served_and_answered(qa, path, questions, contexts):
    """Exports `qa` to `path`; its string signature's answers equal `qa.answer`'s.
    -> (the signature's outputs, `answer()`'s answers)."""
    kb.export.export_saved_model(qa, path)
    got = tf.saved_model.load(path).signatures["serving_default"](
        question=tf.constant(questions), context=tf.constant(contexts))
    want = qa.answer(questions, contexts)
    np.testing.assert_array_equal(got["answer_start"].numpy(), [a["start"] for a in want])
    np.testing.assert_array_equal(got["answer_end"].numpy(), [a["end"] for a in want])
    assert [t.decode() for t in got["answer_text"].numpy()] == [a["text"] for a in want]
    return got, want


def test_qa_export_reads_long_contexts_in_windows(tmp_path, bert_vocab):
    """Contexts of several windows: the string signature keeps each example's best span over
    its windows, as `answer()`, including answers past the first window."""
    from keras_bertfam.preprocessing import finetuning as ft

    # A seed whose random model answers some examples in their first window and some past it
    # (checked below): the equality covers both.
    keras.utils.set_random_seed(9)
    real = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    qa = kb.tasks.QuestionAnswerer(
        kb.models.BertBackbone(real.vocabulary_size(), 1, 2, 16, 32, max_sequence_length=64),
        preprocessor=ft.QuestionAnswererPreprocessor(real, 32, stride=8, max_question_length=8))
    contexts = [" ".join(f"Zoë met Ada {i + j} times in Zürich, café {j}." for j in range(5))
                for i in range(12)] + ["", "Short one."]
    questions = ["Who met Zoë?"] * len(contexts)
    path = str(tmp_path / "qa" / "1")
    got, want = served_and_answered(qa, path, questions, contexts)
    found = [i for i, a in enumerate(want) if a["start"] >= 0]
    np.testing.assert_allclose(got["span_score"].numpy()[found],
                               [want[i]["score"] for i in found], atol=1e-4)
    _, meta = qa.preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    windows = np.bincount(meta["example_index"].numpy())
    first_end = meta["token_end"].numpy()[np.searchsorted(meta["example_index"].numpy(),
                                                          np.arange(len(contexts)))].max(1)
    assert (windows[:12] >= 3).all()
    past = sum(want[i]["start"] >= first_end[i] for i in range(12))
    assert 2 <= past <= 10  # past the first window, and within it
    assert not kb.export.audit_ops(path)["unsupported"]


@pytest.mark.multibackend
def test_electra_serving_scores_the_text_as_given():
    tok = tokenizer()
    disc = kb.models.ElectraBackbone(len(VOCAB), 2, 2, 16, 8, 32,
                                     max_sequence_length=32)
    electra = kb.tasks.ElectraPretrainer(discriminator=disc)
    f = packed(tok, with_mask(tok, ["the [MASK] was great", "ada wrote it"]))
    first, second = reference(electra, f), reference(electra, f)
    np.testing.assert_array_equal(first["replaced_probabilities"],
                                  second["replaced_probabilities"])  # nothing sampled
    sequence = disc(f)["sequence_output"]
    expected = keras.ops.convert_to_numpy(keras.ops.sigmoid(electra.rtd_head(sequence)))
    np.testing.assert_allclose(first["replaced_probabilities"], expected * f["padding_mask"],
                               atol=1e-6)
    assert (first["replaced_probabilities"][f["padding_mask"] == 0] == 0).all()
    np.testing.assert_array_equal(first["token_ids"], f["token_ids"])
    assert first["mask_weights"].sum() == 1 and first["mask_positions"][0, 0] == 2


@pytest.mark.multibackend
def test_spanbert_mask_runs():
    from keras_bertfam.tasks.spanbert_pretrainer import mask_runs

    is_mask = np.array([[0, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1]], bool)
    starts, ends = (keras.ops.convert_to_numpy(v) for v in mask_runs(is_mask))
    np.testing.assert_array_equal(starts, [[0, 1, 1, 3, 4, 5], [0, 0, 0, 3, 4, 5]])
    np.testing.assert_array_equal(ends, [[0, 2, 2, 3, 4, 5], [2, 2, 2, 3, 4, 5]])


@pytest.mark.multibackend
def test_xlnet_serving_hides_the_masked_tokens():
    tok = tokenizer()
    xlnet = kb.tasks.XLNetPretrainer(kb.models.XLNetBackbone(len(VOCAB), 2, 2, 16, 32,
                                                             dropout=0.0))
    f = xlnet_packed(tok, ["the [MASK] was great", "a [MASK] plot"])
    # left padding: "... the [MASK] was great <sep> <cls>" ends the row
    np.testing.assert_array_equal(f["token_ids"][0, -7:], [0, 5, 4, 8, 9, 3, 2])
    inputs = xlnet.serving_features({k: keras.ops.convert_to_tensor(v) for k, v in f.items()},
                                    SPECIAL)
    positions = keras.ops.convert_to_numpy(inputs["mask_positions"])
    np.testing.assert_array_equal(positions[:, 0], [SEQ - 5, SEQ - 4])
    assert (f["token_ids"][[0, 1], positions[:, 0]] == 4).all()
    logits = keras.ops.convert_to_numpy(xlnet.serving_call(inputs))
    # the prediction at a mask does not see what the masked slot holds
    swapped = dict(inputs, token_ids=keras.ops.convert_to_tensor(
        np.where(f["token_ids"] == 4, 9, f["token_ids"]).astype("int32")))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(xlnet.serving_call(swapped))[:, 0],
                               logits[:, 0], atol=1e-5)
    # ...but the other tokens are seen
    other = dict(inputs, token_ids=keras.ops.convert_to_tensor(
        np.where(f["token_ids"] == 8, 9, f["token_ids"]).astype("int32")))
    assert not np.allclose(keras.ops.convert_to_numpy(xlnet.serving_call(other))[0, 0],
                           logits[0, 0], atol=1e-5)


def test_export_refuses_an_empty_or_file_export_dir(tmp_path, monkeypatch, ids_export):
    """An empty export_dir (os.path.isdir("") is False: the current directory, even a non-empty
    one, was written into) or a file is refused before anything is traced or written."""
    task = ids_export[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match=r"export_dir='': expected a directory path"):
        kb.export.export_saved_model(task, "", include_preprocessing=False)
    assert os.listdir(tmp_path) == ["notes.txt"]
    with pytest.raises(FileExistsError, match="is a file"):
        kb.export.export_saved_model(task, "notes.txt", include_preprocessing=False)


def test_export_refuses_a_sequence_length_that_is_not_positive(tmp_path, ids_export):
    """0 was the default length, silently; a negative one failed in the packer's trace."""
    for bad in (0, -3):
        with pytest.raises(ValueError, match=rf"sequence_length={bad}: expected a positive"):
            kb.export.export_saved_model(ids_export[0], str(tmp_path / "s"),
                                         tokenizer=tokenizer(), sequence_length=bad)
    assert not (tmp_path / "s").exists()


def test_export_refuses_a_tokenizer_larger_than_the_embedding_table(tmp_path, ids_export):
    """Ids the embedding table lacks: every request holding one failed in the token_ids check.
    Refused naming both sizes (the check a task makes of its preprocessor when built)."""
    big = kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB + ["zoe", "lake", "cafe"],
                                              lowercase=True)
    with pytest.raises(ValueError, match=r"vocabulary has 31 tokens but BertBackbone's "
                                         r"embedding table has vocabulary_size=28 rows"):
        kb.export.export_saved_model(ids_export[0], str(tmp_path / "t"), tokenizer=big)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("model, options, error, message", [
    (keras.Sequential([keras.layers.Dense(2)]), {}, TypeError,
     r"exports a kb.tasks task or a kb.models backbone; got Sequential"),
    ("bert_tiny_en_uncased", {}, TypeError, r"kb.models backbone; got str 'bert_tiny_en_uncased'"),
    (None, {}, TypeError, r"kb.models backbone; got NoneType None"),
    ("task", {"dynamic_padding": "no"}, ValueError, r"dynamic_padding='no': expected True or"),
    ("task", {"include_preprocessing": 0}, ValueError, r"include_preprocessing=0: expected True"),
], ids=["keras_model", "preset_name", "none", "dynamic_padding_str", "include_preprocessing_int"])
def test_export_refuses_what_is_not_ours_or_not_a_flag(tmp_path, ids_export, model, options,
                                                        error, message):
    """Another model was refused as having no tokenizer (it has none to give), a functional one
    failed in Keras ("Output with path `` is not connected"); dynamic_padding="no" exported
    dynamic padding (a truthy string)."""
    model = ids_export[0] if model == "task" else model
    with pytest.raises(error, match=message):
        kb.export.export_saved_model(model, str(tmp_path / "1"), tokenizer=tokenizer(), **options)
    assert not (tmp_path / "1").exists()


def test_export_refuses_an_export_dir_under_a_file(tmp_path, ids_export):
    """TensorFlow's FailedPreconditionError from deep in the save, after tracing."""
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(NotADirectoryError, match=r"notes.txt' is a file, not a directory"):
        kb.export.export_saved_model(ids_export[0], str(tmp_path / "notes.txt" / "1"),
                                     include_preprocessing=False)


def _not_a_saved_model(tmp_path, kind):
    folder = tmp_path / kind
    if kind == "file":
        folder.write_text("x")
        return str(folder)
    if kind != "missing":
        folder.mkdir()
    contents = {"corrupt": b"\x00garbage\xff\xfe" * 10, "empty": b""}
    if kind in contents:
        (folder / "saved_model.pb").write_bytes(contents[kind])
    return str(folder)


@pytest.mark.parametrize("kind, error, message", [
    ("missing", FileNotFoundError, r"missing' does not exist: expected a SavedModel directory"),
    ("file", FileNotFoundError, r"file' is not a directory: expected a SavedModel directory"),
    ("no_pb", FileNotFoundError, r"no_pb' has no saved_model.pb: expected a SavedModel"),
    ("corrupt", ValueError, r"corrupt/saved_model.pb' \(100 bytes\) is not a SavedModel proto"),
    ("empty", ValueError, r"empty/saved_model.pb' \(0 bytes\) holds no meta graph"),
], ids=["missing", "file", "no_pb", "corrupt", "empty"])
@pytest.mark.parametrize("function", ["list_ops", "audit_ops", "strip_unknown_attrs"])
def test_op_tools_refuse_what_is_not_a_saved_model(tmp_path, function, kind, error, message):
    """A damaged saved_model.pb was protobuf's DecodeError without the file's name; an empty
    one listed no op and passed the audit."""
    with pytest.raises(error, match=message):
        getattr(kb.export, function)(_not_a_saved_model(tmp_path, kind))


@pytest.mark.parametrize("function", ["list_ops", "audit_ops", "strip_unknown_attrs"])
def test_op_tools_refuse_a_path_that_is_not_a_path(function):
    """os.path's "expected str, bytes or os.PathLike object, not NoneType"."""
    with pytest.raises(TypeError, match=r"export_dir=None: expected the path of a SavedModel"):
        getattr(kb.export, function)(None)


def test_strip_unknown_attrs_loses_nothing_when_its_write_fails(tmp_path, monkeypatch):
    """saved_model.pb was rewritten in place: a write that failed (here: serializing) left it
    empty, which then listed no op and passed the audit. And tensorflow=None, which core_registry's
    message offered, is refused by name."""
    module = tf.Module()
    module.scale = tf.Variable(2.0)
    serve = tf.function(lambda x: {"y": x * module.scale},
                        input_signature=[tf.TensorSpec([None], tf.float32)])
    path = str(tmp_path / "1")
    tf.saved_model.save(module, path, signatures={"serving_default": serve.get_concrete_function()})
    before = (tmp_path / "1" / "saved_model.pb").read_bytes()
    with pytest.raises(ValueError, match=r"strip_unknown_attrs\(tensorflow=None\): expected the"):
        kb.export.strip_unknown_attrs(path, tensorflow=None)
    read = kb.export._read_saved_model

    class Unwritable:
        def __init__(self, proto):
            self.meta_graphs = proto.meta_graphs

        def SerializeToString(self):
            raise OSError("No space left on device")

    monkeypatch.setattr(kb.export, "_read_saved_model", lambda d: Unwritable(read(d)))
    with pytest.raises(OSError, match="No space left"):
        kb.export.strip_unknown_attrs(path)
    assert (tmp_path / "1" / "saved_model.pb").read_bytes() == before
    assert sorted(os.listdir(path)) == ["assets", "fingerprint.pb", "saved_model.pb", "variables"]


# === Requests the string and token_ids signatures must serve as predict does, or refuse by name
def test_qa_export_reads_invalid_utf8_as_answer_does(exports, loaded):
    """Contexts that are not valid UTF-8: each invalid sequence is one U+FFFD (as for every
    other signature and in `answer()`); offsets and answer text are the cleaned context's. The
    string signature answered from the raw bytes: a text shifted off its offsets ("da " for
    "Ada"), or a failed request (a surrogate's 3 bytes, 1 character to `substr`, are 3 U+FFFD
    to the tokenizer)."""
    qa = exports[2]["question_answerer"]
    serve = loaded("question_answerer").signatures["serving_default"]
    questions = [b"Who wrote it?", b"Who?", b"Who \xff wrote?", b"Where?", b"Who?"]
    contexts = [b"\xed\xa0\x80 Ada Lovelace wrote it in 1843.", b"\x80\x80 Ada wrote it",
                b"Ada wrote \xff the film \xc3", b"Ada \xf0\x9f\x98 wrote",
                "Zoë Brontë lives in Zürich.".encode()]
    want = qa.answer(questions, contexts)
    got = serve(question=tf.constant(questions), context=tf.constant(contexts))
    np.testing.assert_array_equal(got["answer_start"].numpy(), [a["start"] for a in want])
    np.testing.assert_array_equal(got["answer_end"].numpy(), [a["end"] for a in want])
    assert got["answer_text"].numpy().tolist() == [a["text"] for a in want]
    for context, answer in zip(contexts, want):  # bytes in, bytes out: the cleaned context's
        text = context.decode("utf-8", "replace")
        assert answer["text"] == text[answer["start"]:answer["end"]].encode()
    # valid UTF-8 bytes answer as the same text as a str (offsets in characters, not bytes)
    as_str = qa.answer([questions[-1].decode()], [contexts[-1].decode()])[0]
    assert (want[-1]["start"], want[-1]["end"]) == (as_str["start"], as_str["end"])
    assert want[-1]["text"] == as_str["text"].encode() and as_str["end"] > as_str["start"]


def test_string_signature_reads_past_text_that_tokenizes_to_nothing(exports, loaded):
    """A text whose first CHARACTERS_PER_POSITION * sequence_length characters are whitespace,
    zero-width or combining characters was served as empty (the cut came first) while predict
    read the words after them. Such characters now count 1/SILENT_PER_CHARACTER of a character
    towards the cut (WordPiece, SentencePiece)."""
    models = exports[2]
    clf = models["text_classifier"]
    serve = loaded("text_classifier").signatures["serving_default"]
    budget = kb.export.CHARACTERS_PER_POSITION * SEQ
    texts = [" " * budget + "the film was great", "\u200b" * budget + "ada wrote it",
             "a" + "\u0301" * budget + " dull plot",
             "\n\t\u3000\u00a0" * (budget // 2) + "bad actor", "the film"]
    np.testing.assert_allclose(serve(text=tf.constant(texts))["logits"].numpy(),
                               clf.predict(texts, verbose=0), atol=1e-5)
    tag = models["token_classifier"]
    serve_tag = loaded("token_classifier").signatures["serving_default"]
    got = serve_tag(text=tf.constant(texts[:2]))
    mask = got["padding_mask"].numpy()
    assert (mask.sum(1) == [6, 5]).all()  # [CLS] the film was great [SEP]; [CLS] ada wrote it
    np.testing.assert_allclose(got["logits"].numpy() * mask[..., None],
                               tag.predict(texts[:2], verbose=0)[:, :mask.shape[1]]
                               * mask[..., None], atol=1e-5)


def test_requests_are_cut_after_a_bounded_number_of_silent_characters():
    """The cut still bounds each text's work: silent characters count 1/SILENT_PER_CHARACTER,
    so a 1 MB run of them keeps SILENT_PER_CHARACTER * CHARACTERS_PER_POSITION *
    sequence_length; other characters count 1 (and every character for byte-level BPE, whose
    whitespace and zero-width characters are tokens)."""
    from keras_bertfam.export import CHARACTERS_PER_POSITION, SILENT_PER_CHARACTER, _clean_text

    budget = CHARACTERS_PER_POSITION * 2
    texts = [" " * 1_000_000, " " * (budget * 3) + "word " * budget, "\u200bé" * budget]
    got = [g.decode() for g in _clean_text(tf.constant(texts), 2, tokenizer()).numpy()]
    assert got[0] == " " * (SILENT_PER_CHARACTER * budget)
    assert texts[1].startswith(got[1]) and got[1].startswith(" " * (budget * 3) + "word word")
    assert 0 < got[1].count("word") <= budget // 4
    assert got[2] == texts[2][:len(got[2])] and got[2].count("é") <= budget
    bpe = type("BPE", (), {"kind": "byte_pair"})()
    assert len(_clean_text(tf.constant(texts[:1]), 2, bpe).numpy()[0]) == budget


def _error(call, *args, **kwargs):
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        call(*args, **kwargs)
    return " ".join(str(caught.value).split())


def test_malformed_string_requests_are_refused_by_name(loaded):
    """Scalars or matrices where a batch of strings is expected, segments of different counts,
    a multiple-choice request without choices: a message naming the input and what was
    expected, where they met TensorFlow's errors inside the graph ("input must be a vector",
    "Incompatible shapes: [3] vs. [2]", "Reduction axis -1 is empty"). An empty batch is an
    empty result."""
    def signature(name):
        return loaded(name).signatures["serving_default"]

    clf = signature("text_classifier")
    assert "text must be a vector of strings [batch]; got shape] []" in _error(
        clf, text=tf.constant("the film"))
    assert "text must be a vector of strings [batch]; got shape] [1 1]" in _error(
        clf, text=tf.constant([["the film"]]))
    qa = signature("question_answerer")
    message = _error(qa, question=tf.constant(["a", "b"]), context=tf.constant(["a", "b", "c"]))
    assert "question and context must have the same number of strings; got] [2] [and] [3]" \
        in message
    assert "context must be a vector" in _error(qa, question=tf.constant(["a"]),
                                                context=tf.constant("a"))
    pair = signature("BertPretrainer")
    assert "text_a and text_b must have the same number of strings; got] [1] [and] [3]" in \
        _error(pair, text_a=tf.constant(["a"]), text_b=tf.constant(["a", "b", "c"]))
    mc = signature("multiple_choice")
    assert ("choices must hold at least one choice per prompt (a [batch, choices] matrix of "
            "strings); got shape] [2 0]") in _error(
        mc, prompt=tf.constant(["a", "b"]), choices=tf.zeros([2, 0], tf.string))
    assert "prompt and choices must have the same number of rows; got] [3] [and] [1]" in _error(
        mc, prompt=tf.constant(["a", "b", "c"]), choices=tf.constant([["x", "y"]]))
    assert "choices must be a matrix of strings [batch, choices]; got shape] [2]" in _error(
        mc, prompt=tf.constant(["a"]), choices=tf.constant(["x", "y"]))
    for choices in ([0, 2], [0, 0]):  # empty batches
        out = mc(prompt=tf.constant([], tf.string), choices=tf.zeros(choices, tf.string))
        assert out["logits"].shape == (0, choices[1])
    out = qa(question=tf.constant([], tf.string), context=tf.constant([], tf.string))
    assert out["answer_text"].shape == (0,) and out["start_logits"].shape[0] == 0


def test_malformed_token_ids_are_refused_by_name(loaded):
    """Rank-1 or zero-length token_ids met "Invalid reduction dimension" or "slice index 0 of
    dimension 1 out of bounds" inside the model."""
    serve = loaded("ids").signatures["token_ids"]

    def call(ids):
        ids = tf.constant(np.asarray(ids, np.int32))
        return serve(token_ids=ids, segment_ids=tf.zeros_like(ids), padding_mask=tf.ones_like(ids))

    assert ("token_ids signature: token_ids must be a [batch, length] int32 matrix; got shape] "
            "[4]") in _error(call, [2, 5, 6, 3])
    assert ("token_ids signature: token_ids must have at least one position; got shape] "
            "[2 0]") in _error(call, np.zeros([2, 0]))
    assert call(np.zeros([0, 4]))["logits"].shape == (0, 2)


def test_longformer_token_ids_serve_an_empty_batch(tmp_path):
    """A Longformer's empty batch met "condition [0,4,1,1], then [0,2,2,16] ... must be
    broadcastable" in its attention; every other model returned an empty result."""
    keras.utils.set_random_seed(3)
    bb = kb.models.LongformerBackbone(vocabulary_size=len(VOCAB), num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, attention_window=4,
                                      max_sequence_length=32)
    task = kb.tasks.TextClassifier(bb, num_classes=2)
    path = str(tmp_path / "1")
    kb.export.export_saved_model(task, path, include_preprocessing=False)
    serve = tf.saved_model.load(path).signatures["token_ids"]
    ids = np.array([[0, 5, 6, 2]], np.int32)
    inputs = {n: tf.constant(ids if n == "token_ids" else (np.ones_like(ids) if n ==
                                                             "padding_mask" else 0 * ids))
              for n in serve.structured_input_signature[1]}
    np.testing.assert_allclose(serve(**inputs)["logits"].numpy(),
                               task.predict({k: v.numpy() for k, v in inputs.items()},
                                            verbose=0), atol=1e-5)
    out = serve(**{k: v[:0] for k, v in inputs.items()})
    assert out["logits"].shape == (0, 2)
