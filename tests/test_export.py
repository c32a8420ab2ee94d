"""SavedModel export: every task's export passes the tf-text 2.12.1 op audit, loads in a fresh
process that imports only tensorflow + tensorflow_text, and gives the in-process outputs (<= 1e-5);
the audit catches keras-hub's round-robin packer; saved_model_cli lists the signatures."""
import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a film was great dull bad good movie story actor plot who wrote it ada , . ! ? "
    "##s ##ing ##ed"
).split()
SEQ = 16
TEXT_A = ["the film was great!", "a dull plot, bad actor", "ada wrote it"]
TEXT_B = ["good story", "the movie", "who wrote it?"]


def tokenizer():
    return kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)


def backbone():
    return kb.models.BertBackbone(len(VOCAB), 2, 2, 16, 32, max_sequence_length=32)


def packed(tok, *segments):
    packer = kb.preprocessing.SegmentPacker(SEQ, start_value=2, end_value=3, pad_value=0)
    ids, seg, mask = packer(tuple(segments))
    return {"token_ids": tf.cast(ids, tf.int32).numpy(), "segment_ids": seg.numpy(),
            "padding_mask": tf.cast(mask, tf.int32).numpy()}


def with_mask(tok, texts):
    """Token ids of texts where '[MASK]' stands for the mask id (built by hand, not by export)."""
    rows = []
    for text in texts:
        ids = []
        for i, piece in enumerate(text.split("[MASK]")):
            ids += [4] if i else []
            ids += tok([piece]).to_list()[0] if piece.strip() else []
        rows.append(ids)
    return tf.ragged.constant(rows, dtype=tf.int32)


def reference(task, features):
    """In-process outputs: the model on packed features, then its serving_outputs."""
    inputs = task.serving_features({k: keras.ops.convert_to_tensor(v) for k, v in features.items()},
                                   {"mask": 4})
    out = task({k: inputs[k] for k in task.input}, training=False)
    return {k: keras.ops.convert_to_numpy(v) for k, v in task.serving_outputs(inputs, out).items()}


def cases(tok):
    """(name, model, serving inputs, in-process reference outputs)."""
    keras.utils.set_random_seed(1)
    out = []
    bb = backbone()
    f = packed(tok, tok(TEXT_A))
    ref = {k: keras.ops.convert_to_numpy(v) for k, v in bb(f).items()}
    ref["padding_mask"] = f["padding_mask"]
    out.append(("backbone", bb, {"text": TEXT_A}, ref))

    masked = ["the [MASK] was great", "a [MASK] plot [MASK]", "[MASK]"]
    mlm = kb.tasks.MaskedLM(backbone(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(tok, SEQ))
    out.append(("masked_lm", mlm, {"text": masked}, reference(mlm, packed(tok, with_mask(tok, masked)))))

    for cls in (kb.tasks.BertPretrainer, kb.tasks.AlbertPretrainer):
        task = cls(backbone(), preprocessor=kb.preprocessing.MaskedLMPreprocessor(tok, SEQ))
        f = packed(tok, with_mask(tok, masked), tok(TEXT_B))
        out.append((cls.__name__, task, {"text_a": masked, "text_b": TEXT_B}, reference(task, f)))

    from keras_bertfam.preprocessing import finetuning as ft

    clf = kb.tasks.TextClassifier(backbone(), num_classes=3,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    ref = reference(clf, packed(tok, tok(TEXT_A)))
    np.testing.assert_allclose(ref["logits"], clf.predict(TEXT_A, verbose=0), atol=1e-6)
    out.append(("text_classifier", clf, {"text": TEXT_A}, ref))

    tagger = kb.tasks.TokenClassifier(backbone(), num_classes=4,
                                      preprocessor=ft.TokenClassifierPreprocessor(tok, SEQ))
    out.append(("token_classifier", tagger, {"text": TEXT_A}, reference(tagger, packed(tok, tok(TEXT_A)))))

    qa = kb.tasks.QuestionAnswerer(backbone(), preprocessor=ft.QuestionAnswererPreprocessor(
        tok, SEQ, stride=4, max_question_length=4))
    out.append(("question_answerer", qa, {"question": TEXT_B, "context": TEXT_A},
                reference(qa, packed(tok, tok(TEXT_B), tok(TEXT_A)))))

    mc = kb.tasks.MultipleChoice(backbone(), preprocessor=ft.MultipleChoicePreprocessor(tok, SEQ))
    choices = [[b, a] for a, b in zip(TEXT_A, TEXT_B)]
    flat = packed(tok, tok([t for t in TEXT_A for _ in range(2)]),
                  tok([c for row in choices for c in row]))
    out.append(("multiple_choice", mc, {"prompt": TEXT_A, "choices": choices},
                reference(mc, {k: v.reshape(3, 2, SEQ) for k, v in flat.items()})))

    enc = kb.tasks.SentenceEncoder(backbone(), preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    out.append(("sentence_encoder", enc, {"text": TEXT_A}, reference(enc, packed(tok, tok(TEXT_A)))))
    return out


FRESH = r'''
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # registers the tf-text ops the tokenizer uses
jobs = json.load(open(sys.argv[1]))
for job in jobs:
    model = tf.saved_model.load(job["dir"])
    inputs = {k: tf.constant(v) for k, v in job["inputs"].items()}
    out = model.signatures["serving_default"](**inputs)
    ids = {k: tf.constant(np.asarray(v, np.int32)) for k, v in job["ids"].items()}
    out_ids = model.signatures["token_ids"](**ids)
    np.savez(job["out"], **{k: v.numpy() for k, v in out.items()},
             **{"ids__" + k: v.numpy() for k, v in out_ids.items()})
# tensorflow_text pulls in keras itself; our code and keras-hub must not be needed
assert "keras_bertfam" not in sys.modules and "keras_hub" not in sys.modules
print("ok")
'''


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    tok = tokenizer()
    done = []
    for name, model, inputs, ref in cases(tok):
        path = str(root / name / "1")
        signatures = kb.export.export_saved_model(model, path, sequence_length=SEQ,
                                                     tokenizer=tok)
        assert signatures == ["serving_default", "token_ids"]
        done.append((name, path, inputs, ref))
    return root, done


def test_every_export_passes_the_tf_text_2_12_audit(exports):
    _, done = exports
    for name, path, _, _ in done:
        report = kb.export.audit_ops(path, tf_text="2.12.1")
        text_ops = {op for op, kind in report["ops"].items() if kind == "tf-text"}
        assert text_ops <= kb.export.TF_TEXT_2_12_OPS and "FastWordpieceTokenizeWithOffsets" in text_ops
        assert not report["unsupported"], name
        assert os.path.exists(os.path.join(path, "assets", "vocab.txt"))
        assert os.listdir(os.path.join(path, "variables"))


def test_fresh_tensorflow_process_gives_the_same_outputs(exports, tmp_path):
    _, done = exports
    jobs = []
    for name, path, inputs, ref in done:
        ids = {k: v for k, v in _ids_for(name, inputs).items()}
        jobs.append({"dir": path, "inputs": inputs, "ids": ids, "out": str(tmp_path / f"{name}.npz")})
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs, default=lambda a: np.asarray(a).tolist()))
    proc = subprocess.run([sys.executable, "-c", FRESH, str(spec)], capture_output=True, text=True,
                          timeout=170, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    for (name, path, inputs, ref), job in zip(done, jobs):
        got = np.load(job["out"])
        assert set(ref) == {k for k in got.files if not k.startswith("ids__")}, name
        for key, expected in ref.items():
            np.testing.assert_allclose(got[key], expected, atol=1e-5, err_msg=f"{name}:{key}")
            np.testing.assert_allclose(got["ids__" + key], expected, atol=1e-5,
                                       err_msg=f"{name}:token_ids:{key}")


def _ids_for(name, inputs):
    """Packed ids the token_ids signature gets: the same features as the reference."""
    tok = tokenizer()
    if name == "backbone" or name in ("text_classifier", "token_classifier", "sentence_encoder"):
        return packed(tok, tok(inputs["text"]))
    if name == "masked_lm":
        return packed(tok, with_mask(tok, inputs["text"]))
    if name in ("BertPretrainer", "AlbertPretrainer"):
        return packed(tok, with_mask(tok, inputs["text_a"]), tok(inputs["text_b"]))
    if name == "question_answerer":
        return packed(tok, tok(inputs["question"]), tok(inputs["context"]))
    flat = packed(tok, tok([t for t in inputs["prompt"] for _ in range(2)]),
                  tok([c for row in inputs["choices"] for c in row]))
    return {k: v.reshape(3, 2, SEQ) for k, v in flat.items()}


def test_mlm_export_reads_mask_tokens_in_text(exports, tmp_path):
    _, done = exports
    ref = dict((n, r) for n, _, _, r in done)["masked_lm"]
    # "[CLS] the [MASK] ..." -> slot 0 is position 2; "[CLS] a [MASK] plot [MASK]" -> 2 and 4
    np.testing.assert_array_equal(ref["mask_weights"].sum(1), [1, 2, 1])
    np.testing.assert_array_equal(ref["mask_positions"][:, :2], [[2, 0], [2, 4], [1, 0]])
    assert ref["mlm_top_ids"].shape == (3, SEQ, 5)


def test_saved_model_cli_lists_signatures(exports):
    _, done = exports
    path = dict((n, p) for n, p, _, _ in done)["BertPretrainer"]
    cli = shutil.which("saved_model_cli") or os.path.join(os.path.dirname(sys.executable),
                                                         "saved_model_cli")
    proc = subprocess.run([cli, "show", "--dir", path, "--all"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
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


def test_export_errors(tmp_path):
    task = kb.tasks.TextClassifier(backbone(), num_classes=2)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        kb.export.export_saved_model(task, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="max_sequence_length"):
        kb.export.export_saved_model(task, str(tmp_path / "b"), tokenizer=tokenizer(),
                                     sequence_length=64)
    # ids only: serving_default is the token_ids signature
    names = kb.export.export_saved_model(task, str(tmp_path / "c"), include_preprocessing=False)
    assert names == ["serving_default", "token_ids"]
    with pytest.raises(FileExistsError):
        kb.export.export_saved_model(task, str(tmp_path / "c"), include_preprocessing=False)


def test_cli_export_from_preset_dir(tmp_path):
    from keras_bertfam import cli
    from keras_bertfam.preprocessing import finetuning as ft

    tok = tokenizer()
    clf = kb.tasks.TextClassifier(backbone(), num_classes=3,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, SEQ))
    clf.save_to_preset(str(tmp_path / "preset"))
    out = str(tmp_path / "serving" / "clf" / "1")
    assert cli.main(["export", "--task", str(tmp_path / "preset"), "--output", out]) == 0
    loaded = tf.saved_model.load(out)
    got = loaded.signatures["serving_default"](text=tf.constant(TEXT_A))
    np.testing.assert_allclose(got["logits"].numpy(), clf.predict(TEXT_A, verbose=0), atol=1e-5)
    assert not kb.export.audit_ops(out)["unsupported"]
