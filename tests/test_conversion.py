"""HF transformers conversion of every family's heads, export back to HF, and bad checkpoints.

- `convert_task`: each family's HF head model (ALBERT `AlbertForPreTraining` / `AlbertForMaskedLM`,
  `RobertaForMaskedLM`, `DistilBertForMaskedLM`, ELECTRA `ElectraForPreTraining` +
  `ElectraForMaskedLM`, `XLNetLMHeadModel`, `XLNetForSequenceClassification`, every family's
  `*ForMultipleChoice`) gives the same logits as our task (<= 1e-4).
- `export_to_transformers`: ours -> HF directory -> `transformers.AutoModel` gives the same hidden
  states (<= 1e-4), converts back to the same weights and config, and HF's `AutoTokenizer` reads
  the tokenizer files with the same ids as ours; task heads export under HF's architectures.
- Bad input: a head checkpoint of another family, a checkpoint without the head, head tensors no
  head of the family reads, shapes that do not match the config, models HF cannot represent.

HF models are random-initialized from tiny configs and saved to tmp (nothing is downloaded);
their biases and LayerNorms are perturbed so that a wrong mapping cannot hide behind 0 and 1.
"""
import os
import random
import re
import shutil
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import to_numpy
from keras_bertfam.presets import checkpoints, hf_heads

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 120
POSITIONS = np.array([[1, 2, 4], [0, 3, 5]], "int32")


def _perturbed(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _save(model, path):
    _perturbed(model).save_pretrained(str(path))
    return str(path)


def _inputs(first=None, pad=None):
    """Two rows of 9 ids, the second padded after 6 tokens (RoBERTa: `first` <s>, `pad` <pad>)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, VOCAB, (2, 9)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    if first is not None:
        ids[:, 0] = first
    if pad is not None:
        ids[mask == 0] = pad
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def _hf(model, x, segments=True, **kwargs):
    with torch.no_grad():
        if segments:
            kwargs["token_type_ids"] = torch.tensor(x["segment_ids"]).long()
        return model(input_ids=torch.tensor(x["token_ids"]).long(),
                     attention_mask=torch.tensor(x["padding_mask"]).long(), **kwargs)


def _at_positions(logits):
    return np.take_along_axis(logits.numpy(), POSITIONS[:, :, None], axis=1)


def _max_diff(a, b):
    return float(np.abs(to_numpy(a) - np.asarray(b)).max())


def _albert_config(**overrides):
    cfg = dict(vocab_size=VOCAB, embedding_size=8, hidden_size=16, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    return transformers.AlbertConfig(**dict(cfg, **overrides))


# === HF heads -> our tasks ===
def test_albert_pretraining_mlm_and_sop_heads(tmp_path):
    hf = transformers.AlbertForPreTraining.from_pretrained(
        _save(transformers.AlbertForPreTraining(_albert_config()), tmp_path / "pt"))
    task = kb.presets.convert_task(str(tmp_path / "pt"), kb.tasks.AlbertPretrainer,
                                   preprocessor=None)
    assert task.mlm_head.dense.units == 8  # the MLM transform at E, tied to the V x E table
    x = _inputs()
    out, ref = task(dict(x, mask_positions=POSITIONS)), _hf(hf, x)
    assert _max_diff(out["mlm_logits"], _at_positions(ref.prediction_logits)) <= 1e-4
    assert _max_diff(out["pair_logits"], ref.sop_logits) <= 1e-4

    # AlbertForMaskedLM saves no pooler: the backbone keeps its own, without a warning (MaskedLM
    # does not read it: tests/test_load_warnings.py)
    hf = transformers.AlbertForMaskedLM.from_pretrained(
        _save(transformers.AlbertForMaskedLM(_albert_config()), tmp_path / "mlm"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlm = kb.presets.convert_task(str(tmp_path / "mlm"), kb.tasks.MaskedLM, preprocessor=None)
    assert not [w for w in caught if "pooler" in str(w.message)], [str(w.message) for w in caught]
    ref = _at_positions(_hf(hf, x).logits)
    assert _max_diff(mlm(dict(x, mask_positions=POSITIONS)), ref) <= 1e-4



def test_roberta_masked_lm_head(tmp_path):
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=34, type_vocab_size=1,
                                     layer_norm_eps=1e-5, pad_token_id=1)
    hf = transformers.RobertaForMaskedLM.from_pretrained(
        _save(transformers.RobertaForMaskedLM(cfg), tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no pooler in RobertaForMaskedLM
        task = kb.presets.convert_task(str(tmp_path), kb.tasks.MaskedLM, preprocessor=None)
    x = _inputs(first=0, pad=1)
    ref = _hf(hf, x, segments=False).logits
    assert _max_diff(task(dict(x, mask_positions=POSITIONS)), _at_positions(ref)) <= 1e-4


def test_from_preset_loads_the_heads_a_checkpoint_has(tmp_path, electra_dirs):
    """`Task.from_preset` on an HF directory: the heads come when the checkpoint has them (a
    classifier of another label count stays new, with a warning)."""
    hf = transformers.AlbertForPreTraining.from_pretrained(
        _save(transformers.AlbertForPreTraining(_albert_config()), tmp_path / "pt"))
    x = _inputs()
    ref = _hf(hf, x)
    task = kb.tasks.AlbertPretrainer.from_preset(str(tmp_path / "pt"), preprocessor=None)
    out = task(dict(x, mask_positions=POSITIONS))
    assert _max_diff(out["mlm_logits"], _at_positions(ref.prediction_logits)) <= 1e-4
    assert _max_diff(out["pair_logits"], ref.sop_logits) <= 1e-4

    # ELECTRA's pretrainer, from a discriminator and a generator checkpoint
    disc_dir, gen_dir = electra_dirs
    electra = kb.tasks.ElectraPretrainer.from_preset(disc_dir, generator_preset=gen_dir,
                                                     preprocessor=None)
    strict = kb.presets.convert_task(disc_dir, kb.tasks.ElectraPretrainer, preprocessor=None,
                                     generator_preset=gen_dir)
    for a, b in zip(electra.weights, strict.weights):
        if "float" in str(a.dtype):  # not the sampler's seed state
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))

    clf_dir = _save(transformers.AlbertForSequenceClassification(_albert_config(num_labels=3)),
                    tmp_path / "clf")
    hf = transformers.AlbertForSequenceClassification.from_pretrained(clf_dir)
    clf = kb.tasks.TextClassifier.from_preset(clf_dir, num_classes=3, preprocessor=None)
    assert _max_diff(clf(x, training=False), _hf(hf, x).logits) <= 1e-4
    with pytest.warns(UserWarning, match=r"head was not loaded.*Shape mismatch for classifier"
                      ) as caught:
        other = kb.tasks.TextClassifier.from_preset(clf_dir, num_classes=2, preprocessor=None)
    assert [w.filename for w in caught if "head was not loaded" in str(w.message)] == [__file__]
    assert other.head.kernel.shape == (16, 2)


def test_distil_bert_masked_lm_head(tmp_path):
    cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2,
                                        hidden_dim=32, max_position_embeddings=32)
    hf = transformers.DistilBertForMaskedLM.from_pretrained(
        _save(transformers.DistilBertForMaskedLM(cfg), tmp_path))
    task = kb.presets.convert_task(str(tmp_path), kb.tasks.MaskedLM, preprocessor=None)
    x = _inputs()
    ref = _hf(hf, x, segments=False).logits
    out = task({"token_ids": x["token_ids"], "padding_mask": x["padding_mask"],
                "mask_positions": POSITIONS})
    assert _max_diff(out, _at_positions(ref)) <= 1e-4


# Small HF configs of the families whose heads are not BERT's: `(HF class prefix, config)`.
HEAD_FAMILIES = {
    "roberta": ("Roberta", lambda **kw: transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1,
        **kw)),
    "electra": ("Electra", lambda **kw: transformers.ElectraConfig(
        vocab_size=VOCAB, embedding_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32, **kw)),
    "distil_bert": ("DistilBert", lambda **kw: transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
        max_position_embeddings=32, **kw)),
}


def _hf_head_model(family, head, **config):
    """e.g. `RobertaForTokenClassification` of the family's small config."""
    prefix, make_config = HEAD_FAMILIES[family]
    return getattr(transformers, f"{prefix}For{head}")(make_config(**config))


def _family_inputs(family, backbone):
    x = _inputs(first=0, pad=1) if family == "roberta" else _inputs()
    return {k: v for k, v in x.items() if k in backbone.input}


@pytest.mark.parametrize("family", sorted(HEAD_FAMILIES))
def test_token_classification_heads(family, tmp_path):
    hf = _hf_head_model(family, "TokenClassification", num_labels=5)
    path = _save(hf, tmp_path)
    task = kb.presets.convert_task(path, kb.tasks.TokenClassifier, preprocessor=None)
    assert task.num_classes == 5
    x = _family_inputs(family, task.backbone)
    ref = _hf(hf, x, segments="segment_ids" in x).logits.numpy()
    valid = x["padding_mask"].astype(bool)
    assert np.abs(to_numpy(task(x, training=False)) - ref)[valid].max() <= 1e-4


QA_CONFIGS = dict(HEAD_FAMILIES, bert=("Bert", lambda **kw: transformers.BertConfig(
    vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=32, **kw)),
    albert=("Albert", lambda **kw: _albert_config(num_hidden_layers=1, **kw)))


@pytest.mark.parametrize("family", ["bert", "albert", "roberta", "electra", "distil_bert"])
def test_untied_mlm_decoder_is_refused_not_replaced(family, tmp_path):
    """An HF `*ForMaskedLM` saved with `tie_word_embeddings=False` holds its own decoder. Ours
    ties the decoder to the word embeddings, so loading it replaced the decoder with the
    embeddings silently (logits off by up to ~13, other argmax tokens): now refused, naming
    the tensors, by `from_preset` and `convert_task`; its backbone and a classifier still load.
    BERT / ALBERT pretraining, which loads the MLM head of a *ForMaskedLM (its pair head new),
    refuses it too."""
    prefix, make_config = QA_CONFIGS[family]
    hf = getattr(transformers, f"{prefix}ForMaskedLM")(make_config(tie_word_embeddings=False))
    decoder = hf.get_output_embeddings()
    with torch.no_grad():
        decoder.weight.normal_(0.0, 0.5)
    path = _save(hf, tmp_path / "hf")
    loads = [lambda: kb.tasks.MaskedLM.from_preset(path, preprocessor=None),
             lambda: kb.presets.convert_task(path, kb.tasks.MaskedLM, preprocessor=None)]
    pretrainer = {"bert": kb.tasks.BertPretrainer, "albert": kb.tasks.AlbertPretrainer}.get(family)
    if pretrainer is not None:
        loads.append(lambda: pretrainer.from_preset(path, preprocessor=None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no pooler weights; the pair head is new
        for load in loads:
            with pytest.raises(ValueError, match=r"differs from .*word_embeddings.* untied"):
                load()
        kb.tasks.TextClassifier.from_preset(path, num_classes=2, preprocessor=None)


@pytest.mark.parametrize("family", sorted(QA_CONFIGS))
def test_question_answering_heads(family, tmp_path):
    """HF `*ForQuestionAnswering` -> QuestionAnswerer (`from_preset` and strict `convert_task`):
    the same start / end logits at every real position; exported back, HF loads it whole."""
    prefix, make_config = QA_CONFIGS[family]
    hf = getattr(transformers, f"{prefix}ForQuestionAnswering")(make_config())
    with torch.no_grad():
        hf.qa_outputs.weight.normal_(0.0, 0.5)
    path = _save(hf, tmp_path / "hf")
    qa = kb.tasks.QuestionAnswerer.from_preset(path, preprocessor=None)
    strict = kb.presets.convert_task(path, kb.tasks.QuestionAnswerer, preprocessor=None)
    x = _family_inputs(family, qa.backbone)
    ref = _hf(hf, x, segments="segment_ids" in x)
    valid = x["padding_mask"].astype(bool)
    for model in (qa, strict):
        out = model(x, training=False)
        for key in ("start_logits", "end_logits"):
            diff = np.abs(to_numpy(out[key]) - getattr(ref, key).numpy())[valid]
            assert diff.max() <= 1e-4, (family, key)
    out_dir = kb.presets.export_to_transformers(qa, str(tmp_path / "out"))
    again, info = transformers.AutoModelForQuestionAnswering.from_pretrained(
        out_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    np.testing.assert_allclose(_hf(again.eval(), x, segments="segment_ids" in x).start_logits,
                               ref.start_logits, atol=1e-5)


@pytest.mark.parametrize("head,task", [("SequenceClassification", kb.tasks.TextClassifier),
                                       ("TokenClassification", kb.tasks.TokenClassifier)])
def test_hf_classifier_labels_are_read_when_num_classes_is_not_given(head, task, tmp_path):
    """HF's `AutoModelFor*.from_pretrained` reads the checkpoint's labels (`id2label`); ours
    built 2 classes and dropped the 3-label head with a shape warning. Given, `num_classes`
    still wins."""
    hf = _hf_head_model("electra", head, num_labels=3)
    path = _save(hf, tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf = task.from_preset(path, preprocessor=None)
    assert clf.num_classes == 3
    assert not [w for w in caught if "not loaded" in str(w.message)]
    x = _family_inputs("electra", clf.backbone)
    assert _max_diff(clf(x, training=False), _hf(hf, x).logits) <= 1e-4


def test_hf_multi_label_checkpoint_warns_that_it_loads_single_label(tmp_path):
    """An HF classifier saved with problem_type="multi_label_classification" (a sigmoid and
    BCE per label) loaded silently as a softmax single-label TextClassifier."""
    hf = _hf_head_model("electra", "SequenceClassification", num_labels=3,
                        problem_type="multi_label_classification")
    path = _save(hf, tmp_path / "hf")
    for load in (lambda: kb.tasks.TextClassifier.from_preset(path, preprocessor=None),
                 lambda: kb.presets.convert_task(path, kb.tasks.TextClassifier,
                                                 preprocessor=None)):
        with pytest.warns(UserWarning, match=r"multi_label_classification.*single-label"):
            assert load().num_classes == 3
    single = _save(_hf_head_model("electra", "SequenceClassification", num_labels=3),
                   tmp_path / "single")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kb.tasks.TextClassifier.from_preset(single, preprocessor=None)
    assert not [w for w in caught if "multi_label" in str(w.message)]


@pytest.mark.multibackend  # no tf.data: HF (torch) is only the reference
@pytest.mark.parametrize("num_labels", [3, 1])
@pytest.mark.parametrize("family", sorted(HEAD_FAMILIES))
def test_sequence_classification_heads(family, num_labels, tmp_path):
    """HF `*ForSequenceClassification` (RoBERTa: dense + tanh on <s>, our pooler; DistilBERT /
    ELECTRA: a ReLU / GELU hidden layer on [CLS], TextClassifier's default for them) -> our
    TextClassifier with the same logits -> export -> HF again: no missing or unexpected keys, the
    same logits and state dict; and back to the same weights. `num_labels=1`: regression."""
    hf = _hf_head_model(family, "SequenceClassification", num_labels=num_labels)
    with torch.no_grad():  # logits of order 1: a wrong activation or a lost layer shows
        for name, p in hf.named_parameters():
            if "classifier" in name:
                p.normal_(0.0, 0.5)
    path = _save(hf, tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf = kb.tasks.TextClassifier.from_preset(path, num_classes=num_labels, preprocessor=None)
    assert not [w for w in caught if "pooler" in str(w.message)]
    if family == "roberta":  # classifier.dense is the pooler, not a new hidden layer
        assert clf.hidden_dense is None
        np.testing.assert_array_equal(to_numpy(clf.backbone.pooler_dense.kernel),
                                      hf.classifier.dense.weight.detach().numpy().T)
    else:
        assert clf.hidden_dense is not None
    x = _family_inputs(family, clf.backbone)
    segments = "segment_ids" in x
    ours = to_numpy(clf(x, training=False))
    assert ours.shape == (2, num_labels)
    assert _max_diff(ours, _hf(hf, x, segments=segments).logits) <= 1e-4

    out = kb.presets.export_to_transformers(clf, str(tmp_path / "out"))
    again, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, output_loading_info=True)
    assert type(again) is type(hf)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert _max_diff(ours, _hf(again.eval(), x, segments=segments).logits) <= 1e-4
    theirs, exported = hf.state_dict(), again.state_dict()
    assert sorted(theirs) == sorted(exported)
    for key, value in theirs.items():
        np.testing.assert_array_equal(exported[key].numpy(), value.numpy(), err_msg=key)

    back = kb.presets.convert_task(out, kb.tasks.TextClassifier, preprocessor=None)
    assert back.num_classes == num_labels
    for a, b in zip(back.weights, clf.weights):
        if "float" in str(a.dtype):  # not the dropouts' seed states
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))

    # a head HF's cannot hold: new (with a warning) from the checkpoint, an error to export
    other = "tanh" if family == "roberta" else None
    message = rf"hidden_activation={other!r}\) has no counterpart in HF's head"
    with pytest.warns(UserWarning, match=r"head was not loaded.*" + message):
        mismatched = kb.tasks.TextClassifier.from_preset(
            path, num_classes=num_labels, hidden_activation=other, preprocessor=None)
    with pytest.raises(checkpoints.CheckpointError, match=message):
        kb.presets.export_to_transformers(mismatched, str(tmp_path / "mismatched"))


HF_CONFIGS = dict(
    QA_CONFIGS, spanbert=QA_CONFIGS["bert"],
    xlnet=("XLNet", lambda: transformers.XLNetConfig(vocab_size=VOCAB, d_model=16, n_layer=1,
                                                     n_head=2, d_inner=32)),
    longformer=("Longformer", lambda: transformers.LongformerConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=34, attention_window=4, pad_token_id=1,
        type_vocab_size=1)))


# === Multiple choice: HF *ForMultipleChoice <-> MultipleChoice ===
def _choice_inputs(family):
    """(B=2, C=3, T=9) rows packed in the family's layout, some padded: `[CLS] a a [SEP] b ..
    [SEP]` (RoBERTa / Longformer: `<s> a a </s></s> b .. </s>`, HF's three separators that
    Longformer's default global attention looks for), XLNet's `a a <sep> b .. <sep> <cls>`
    padded on the left with segment ids 0 / 1 / 2 / 3."""
    lengths = np.array([[9, 7, 6], [6, 9, 8]])
    rng = np.random.default_rng(0)
    ids = rng.integers(5, VOCAB, (2, 3, 9)).astype("int32")
    position = np.arange(9)
    mask = (position < lengths[..., None]).astype("int32")
    segments = ((position >= 4) & (mask == 1)).astype("int32")
    first, sep, pad = {"roberta": (0, 2, 1), "longformer": (0, 2, 1)}.get(family, (2, 3, 0))
    ids[..., 0], ids[..., 3] = first, sep
    if family in ("roberta", "longformer"):
        ids[..., 4] = sep
        segments[:] = 0  # RoBERTa's checkpoints have one token type
    np.put_along_axis(ids, lengths[..., None] - 1, sep, axis=-1)
    ids[mask == 0] = pad
    if family == "xlnet":  # `a a <sep> b .. <sep> <cls>` on the right, padding on the left
        for b, c in np.ndindex(lengths.shape):
            n = lengths[b, c]
            row = np.concatenate([ids[b, c, 1:n], [4]])  # [CLS] dropped, <cls> (4) last
            ids[b, c] = np.concatenate([np.full(9 - n, pad), row])
            segments[b, c] = [3] * (9 - n) + [0] * 3 + [1] * (n - 4) + [2]
        mask = np.flip(mask, -1).copy()
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def _hf_choice_logits(model, x, segments):
    with torch.no_grad():
        return model(input_ids=torch.tensor(x["token_ids"]).long(),
                     attention_mask=torch.tensor(x["padding_mask"]).float(),
                     token_type_ids=(torch.tensor(x["segment_ids"]).long() if segments
                                     else None)).logits.numpy()


# On JAX and torch, the two heads that differ in kind (ELECTRA's GELU summary on the first token,
# XLNet's tanh summary at <cls>, last): the others are the same Dense on the pooled output, and
# each costs a JAX compile of a new backbone (17 s for all eight).
@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.multibackend) if f in ("electra", "xlnet") else f
    for f in sorted(HF_CONFIGS)])
def test_multiple_choice_heads(family, tmp_path):
    """HF `*ForMultipleChoice` -> MultipleChoice, by `from_preset` (which loaded a new random
    scoring head before, silently dropping the checkpoint's) and by strict `convert_task`: the
    same (B, C) logits on the same packed rows (Longformer: HF's default global attention, on
    the choice after `</s></s>`, against ours derived in the graph); exported back, HF loads it
    with no missing or unexpected key and gives the same logits."""
    prefix, make_config = HF_CONFIGS[family]
    hf = getattr(transformers, f"{prefix}ForMultipleChoice")(make_config())
    with torch.no_grad():  # scores of order 1: a wrong activation or a lost layer shows
        for name, p in hf.named_parameters():
            if name.startswith(("classifier", "pre_classifier", "sequence_summary",
                                "logits_proj")):
                p.normal_(0.0, 0.5)
    path = _save(hf, tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mc = kb.tasks.MultipleChoice.from_preset(path, preprocessor=None)
    assert not [str(w.message) for w in caught if "head" in str(w.message)]
    x = {k: v for k, v in _choice_inputs(family).items() if k in mc.input}
    segments = "segment_ids" in x and family not in ("roberta", "longformer")
    ref = _hf_choice_logits(hf, x, segments)
    assert ref.shape == (2, 3)
    ours = to_numpy(mc(x, training=False))
    assert _max_diff(ours, ref) <= 1e-4, (family, _max_diff(ours, ref))
    if family == "longformer":  # our global attention is HF's default, on the choice
        from keras_bertfam.models.longformer import global_attention_for_task
        from transformers.models.longformer import modeling_longformer

        flat = {k: v.reshape(6, 9) for k, v in x.items()}
        theirs = modeling_longformer._compute_global_attention_mask(
            torch.tensor(flat["token_ids"]), 2, before_sep_token=False).numpy()
        np.testing.assert_array_equal(
            to_numpy(global_attention_for_task(flat, "MultipleChoice")),
            theirs * flat["padding_mask"])
        assert 0 < theirs.sum() < theirs.size
    strict = kb.presets.convert_task(path, kb.tasks.MultipleChoice, preprocessor=None)
    diffs = (_max_diff(ours, ref), _max_diff(strict(x, training=False), ref))
    print(f"\n{family} MultipleChoice max |ours - HF| (from_preset, convert_task): {diffs}")
    assert max(diffs) <= 1e-4, (family, diffs)

    out = kb.presets.export_to_transformers(mc, str(tmp_path / "out"))
    again, info = transformers.AutoModelForMultipleChoice.from_pretrained(
        out, output_loading_info=True)
    assert type(again) is type(hf)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert _max_diff(ours, _hf_choice_logits(again.eval(), x, segments)) <= 1e-4


def _electra_config(hidden, intermediate):
    return transformers.ElectraConfig(vocab_size=VOCAB, embedding_size=8, hidden_size=hidden,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=intermediate, max_position_embeddings=32)


@pytest.fixture(scope="module")
def electra_dirs(tmp_path_factory):
    """An ElectraForPreTraining discriminator and an ElectraForMaskedLM generator sharing their
    embeddings (as the released pairs do)."""
    root = tmp_path_factory.mktemp("electra")
    disc = _perturbed(transformers.ElectraForPreTraining(_electra_config(16, 32)))
    gen = _perturbed(transformers.ElectraForMaskedLM(_electra_config(8, 16)))
    with torch.no_grad():
        shared = disc.state_dict()
        for name, p in gen.named_parameters():
            if name.startswith("electra.embeddings."):
                p.copy_(shared[name])
    disc.save_pretrained(str(root / "disc"))
    gen.save_pretrained(str(root / "gen"))
    return str(root / "disc"), str(root / "gen")


def test_electra_discriminator_and_generator_heads(electra_dirs):
    disc_dir, gen_dir = electra_dirs
    hf_disc = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
    hf_gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).eval()
    task = kb.presets.convert_task(disc_dir, kb.tasks.ElectraPretrainer, preprocessor=None,
                                   generator_preset=gen_dir)
    assert task.generator.hidden_dim == 8 and task.discriminator.hidden_dim == 16
    x = _inputs()
    valid = x["padding_mask"].astype(bool)
    # no masked slot (positions 0 are padding slots): the discriminator sees the input unchanged
    out = task(dict(x, mask_positions=np.zeros_like(POSITIONS)))
    ref = _hf(hf_disc, x).logits.numpy()
    assert np.abs(to_numpy(out["rtd_logits"]) - ref)[valid].max() <= 1e-4
    out = task(dict(x, mask_positions=POSITIONS))
    ref_gen = _at_positions(_hf(hf_gen, x).logits)
    assert _max_diff(out["mlm_logits"], ref_gen) <= 1e-4
    # the generator checkpoint alone is a MaskedLM on an ElectraBackbone
    generator = kb.presets.convert_task(gen_dir, kb.tasks.MaskedLM, preprocessor=None)
    assert _max_diff(generator(dict(x, mask_positions=POSITIONS)), ref_gen) <= 1e-4


def test_electra_pretrainer_exports_both_models(electra_dirs, tmp_path):
    task = kb.presets.convert_task(electra_dirs[0], kb.tasks.ElectraPretrainer, preprocessor=None,
                                   generator_preset=electra_dirs[1])
    disc_dir, gen_dir = str(tmp_path / "disc"), str(tmp_path / "gen")
    kb.presets.export_to_transformers(task, disc_dir, generator_path=gen_dir)
    hf_disc = _reloaded_without_missing_keys(disc_dir, "ElectraForPreTraining")
    hf_gen = _reloaded_without_missing_keys(gen_dir, "ElectraForMaskedLM")
    x = _inputs()
    valid = x["padding_mask"].astype(bool)
    out = task(dict(x, mask_positions=np.zeros_like(POSITIONS)))
    assert np.abs(to_numpy(out["rtd_logits"]) - _hf(hf_disc, x).logits.numpy())[valid].max() <= 1e-4
    out = task(dict(x, mask_positions=POSITIONS))
    assert _max_diff(out["mlm_logits"], _at_positions(_hf(hf_gen, x).logits)) <= 1e-4
    again = kb.presets.convert_task(disc_dir, kb.tasks.ElectraPretrainer, preprocessor=None,
                                    generator_preset=gen_dir)
    for ours, theirs in zip(task.weights, again.weights):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs), err_msg=ours.path)
    with pytest.raises(ValueError, match="generator_path is for an ElectraPretrainer"):
        kb.presets.export_to_transformers(task.discriminator, disc_dir, generator_path=gen_dir)


def test_electra_generator_with_other_embeddings_warns(tmp_path, electra_dirs):
    """ElectraPretrainer shares the discriminator's embeddings: a generator checkpoint whose
    embeddings differ cannot be reproduced exactly, which a warning says."""
    gen = transformers.ElectraForMaskedLM(_electra_config(8, 16))
    other = _save(gen, tmp_path)
    with pytest.warns(UserWarning, match=r"shares embeddings\.word_embeddings\.weight .* holds "
                      "another"):
        kb.presets.convert_task(electra_dirs[0], kb.tasks.ElectraPretrainer, preprocessor=None,
                                generator_preset=other)
    with warnings.catch_warnings(record=True) as caught:  # the matched pair: no warning
        warnings.simplefilter("always")
        kb.presets.convert_task(electra_dirs[0], kb.tasks.ElectraPretrainer, preprocessor=None,
                                generator_preset=electra_dirs[1])
    assert not [w for w in caught if "shares" in str(w.message)]


def test_xlnet_lm_head(tmp_path):
    cfg = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=37,
                                   dropout=0.0)
    hf = transformers.XLNetLMHeadModel.from_pretrained(
        _save(transformers.XLNetLMHeadModel(cfg), tmp_path))
    task = kb.presets.convert_task(str(tmp_path), kb.tasks.XLNetPretrainer, preprocessor=None)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, (2, 9)).astype("int32")
    seg, pad = np.zeros_like(ids), np.ones_like(ids)
    perm = rng.integers(0, 2, (2, 9, 9)).astype("float32")
    target_mapping = np.zeros((2, 3, 9), "float32")
    target_mapping[:, [0, 1, 2], [2, 5, 7]] = 1

    def logits(model):
        with torch.no_grad():
            return model(torch.tensor(ids).long(), attention_mask=torch.tensor(pad).float(),
                         token_type_ids=torch.tensor(seg).long(), perm_mask=torch.tensor(perm),
                         target_mapping=torch.tensor(target_mapping)).logits.numpy()

    out = task({"token_ids": ids, "segment_ids": seg, "padding_mask": pad, "perm_mask": perm,
                "target_mapping": target_mapping})
    assert out.shape == (2, 3, VOCAB)
    assert _max_diff(out, logits(hf)) <= 1e-4
    # and back: our pretrainer -> XLNetLMHeadModel
    kb.presets.export_to_transformers(task, str(tmp_path / "export"))
    again = _reloaded_without_missing_keys(str(tmp_path / "export"), "XLNetLMHeadModel")
    assert _max_diff(out, logits(again)) <= 1e-4


def _xlnet_packed(tok, first, second=None, length=16):
    """XLNet's layout written out (HF `XLNetTokenizer`'s `build_inputs_with_special_tokens`,
    `create_token_type_ids_from_sequences`, left padding, longest-first truncation): `A <sep>
    (B <sep>) <cls>`, segment ids 0 / 1 / 2, padding's 3."""
    rows = []
    for i, text in enumerate(first):
        a = tok([text]).to_list()[0]
        b = None if second is None else tok([second[i]]).to_list()[0]
        budget = length - (2 if b is None else 3)
        while len(a) + len(b or []) > budget:
            if b is None or len(a) > len(b):
                a = a[:-1]
            else:
                b = b[:-1]
        ids = a + [tok.sep_token_id] + (b + [tok.sep_token_id] if b is not None else [])
        seg = [0] * (len(a) + 1) + ([1] * (len(b) + 1) if b is not None else []) + [2]
        ids, n = ids + [tok.cls_token_id], length - len(ids) - 1
        rows.append(([tok.pad_token_id] * n + ids, [3] * n + seg, [0] * n + [1] * len(ids)))
    return {k: np.array([r[j] for r in rows], "int32")
            for j, k in enumerate(("token_ids", "segment_ids", "padding_mask"))}


def _xlnet_checkpoint(tmp_path, tokenizer_files, architecture, num_labels):
    """A random-init HF `architecture` (tiny XLNet) saved in tmp_path with our tiny XLNet
    SentencePiece model beside it; returns (our tokenizer of it, the reloaded HF model)."""
    shutil.copy(tokenizer_files["xlnet"], tmp_path / "spiece.model")
    tok = kb.preprocessing.XLNetTokenizer(str(tmp_path / "spiece.model"))
    cfg = transformers.XLNetConfig(vocab_size=tok.vocabulary_size(), d_model=32, n_layer=1,
                                   n_head=4, d_inner=37, dropout=0.0, num_labels=num_labels)
    model = getattr(transformers, architecture)
    return tok, model.from_pretrained(_save(model(cfg), tmp_path)).eval()


def _hf_logits(model, f):
    """An HF model's logits on packed features (`token_ids`, `segment_ids`, `padding_mask`)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor(f["token_ids"]).long(),
                     token_type_ids=torch.tensor(f["segment_ids"]).long(),
                     attention_mask=torch.tensor(f["padding_mask"]).float()).logits.numpy()


@pytest.mark.multibackend  # the model on every backend; its inputs from tf.data, as users'
def test_xlnet_text_classifier_is_hfs_sequence_classification(tmp_path, tokenizer_files):
    """XLNet's classifier reads its summary at `<cls>`, the LAST position (HF
    `XLNetForSequenceClassification`: `summary_type="last"`, summary Linear + tanh, then
    `logits_proj`); its preprocessor packs XLNet's layout, padded on the left. Before, the
    classifier packed BERT's `<cls> A <sep>` and read position 0. Checked: the packing against
    XLNet's layout written out (pairs and truncation too), the logits of the converted checkpoint
    against HF's, the export back to HF, dynamic padding (cut on the left) and the SavedModel."""
    tok, hf = _xlnet_checkpoint(tmp_path, tokenizer_files, "XLNetForSequenceClassification", 3)
    clf = kb.presets.convert_task(str(tmp_path), kb.tasks.TextClassifier, sequence_length=16)
    assert clf.hidden_activation == "tanh" and clf.preprocessor.padding_side == "left"

    pairs = ["a lazy dog", "the seven wizards quietly box jugs of liquid while the fox jumps", ""]
    texts = SENTENCES + ["fox"]
    predicted = []  # clf's logits on `texts` (read again below) and on the pairs
    for x, f in ((texts, _xlnet_packed(tok, texts)),
                 ((texts, pairs), _xlnet_packed(tok, texts, pairs))):
        ours = {k: to_numpy(v) for k, v in clf.preprocessor(x).items()}
        for key in f:
            np.testing.assert_array_equal(ours[key], f[key])
        predicted.append(clf.predict(x, verbose=0))
        assert _max_diff(predicted[-1], _hf_logits(hf, f)) <= 1e-4
    logits = predicted[0]
    f = _xlnet_packed(tok, texts)
    kb.presets.export_to_transformers(clf, str(tmp_path / "export"))
    again = _reloaded_without_missing_keys(str(tmp_path / "export"),
                                           "XLNetForSequenceClassification")
    assert _max_diff(logits, _hf_logits(again, f)) <= 1e-4
    # Dynamic padding cuts XLNet's rows on the left: the same logits on narrower batches
    dynamic = kb.tasks.TextClassifier(clf.backbone, num_classes=3, preprocessor=(
        kb.preprocessing.TextClassifierPreprocessor(tok, 16, pad_to_batch_max=True)))
    dynamic.set_weights(clf.get_weights())
    cut = to_numpy(dynamic.preprocessor(["fox", "a dog"])["token_ids"])
    assert cut.shape[1] < 16 and (cut[:, -1] == tok.cls_token_id).all()
    np.testing.assert_allclose(dynamic.predict(texts, verbose=0), logits, atol=1e-5)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        kb.export.export_saved_model(dynamic, str(tmp_path / "serving" / "1"))
        serve = tf.saved_model.load(str(tmp_path / "serving" / "1")).signatures["serving_default"]
        np.testing.assert_allclose(serve(text=tf.constant(texts))["logits"].numpy(), logits,
                                   atol=1e-5)


@pytest.mark.multibackend
def test_xlnet_token_classifier_is_hfs_token_classification(tmp_path, tokenizer_files):
    """XLNetForTokenClassification: the pieces of the words, `<sep> <cls>` after them, padded on
    the left; the labels sit on each word's first piece there. Converted from HF, the logits
    at every real position equal HF's (and those of the export back to HF), `predict_words`
    reads the first pieces, and `fit`'s labels line up with them."""
    tok, hf = _xlnet_checkpoint(tmp_path, tokenizer_files, "XLNetForTokenClassification", 4)
    tagger = kb.presets.convert_task(str(tmp_path), kb.tasks.TokenClassifier, num_classes=4,
                                     sequence_length=12)
    words = [["the", "quick", "wizards"], ["seven", "jugs", "of", "liquid", "box", "the", "fox",
                                           "quietly", "over", "lazy", "dog"]]
    pieces = [[p for w in row for p in tok([w]).to_list()[0]] for row in words]
    f = _xlnet_packed(tok, [" ".join(row) for row in words], length=12)
    for i, row in enumerate(pieces):  # the words' pieces, tokenized word by word
        kept = row[:10]
        np.testing.assert_array_equal(f["token_ids"][i][12 - 2 - len(kept):-2], kept)
    import tensorflow as tf

    x, labels, weights = tagger.preprocessor(tf.ragged.constant(words), tf.ragged.constant(
        [[1, 2, 3], [3, 2, 1, 0, 1, 2, 3, 0, 1, 2, 3]]))
    for key in f:
        np.testing.assert_array_equal(to_numpy(x[key]), f[key])
    firsts = []  # each kept word's first piece, counted in pieces
    for row in words:
        starts = np.cumsum([0] + [len(tok([w]).to_list()[0]) for w in row])[:-1]
        firsts.append([int(k) for k in starts if k < 10])
    for i, row in enumerate(firsts):
        start = 12 - 2 - len(pieces[i][:10])
        assert list(np.nonzero(to_numpy(weights)[i])[0]) == [start + k for k in row]
    ref = _hf_logits(hf, f)
    ours = tagger.predict(words, verbose=0)
    real = f["padding_mask"].astype(bool)
    assert _max_diff(ours[real], ref[real]) <= 1e-4
    kb.presets.export_to_transformers(tagger, str(tmp_path / "export"))  # and back to HF
    again = _reloaded_without_missing_keys(str(tmp_path / "export"), "XLNetForTokenClassification")
    assert _max_diff(ours[real], _hf_logits(again, f)[real]) <= 1e-4
    predicted = tagger.predict_words(words)
    for i, row in enumerate(firsts):
        start = 12 - 2 - len(pieces[i][:10])
        got = [predicted[i][w] for w in range(len(words[i])) if predicted[i][w] >= 0]
        assert got == list(np.argmax(ref[i, [start + k for k in row]], axis=-1))
    assert predicted[1][-1] == -1  # cut by truncation


# Questions and contexts packed into XLNet's QA windows (a long context in several windows, a
# short one left padded): the batch HF's XLNetForQuestionAnsweringSimple and ours both read.
XLNET_QA = (["Where does the owner live?", "Who?"],
            ["The quick brown fox jumps over the lazy dog while seven wizards box jugs of liquid;"
             " the owner lives in Lyon.", "Ada did."])


def _xlnet_qa_checkpoint(tmp_path, architecture, vocabulary_size):
    """A random-init tiny HF XLNet `architecture` saved in tmp_path -> (path, reloaded model)."""
    cfg = transformers.XLNetConfig(vocab_size=vocabulary_size, d_model=16, n_layer=1, n_head=2,
                                   d_inner=32, dropout=0.0)
    model = getattr(transformers, architecture)(cfg)
    if hasattr(model, "qa_outputs"):
        with torch.no_grad():
            model.qa_outputs.weight.normal_(0.0, 0.5)
    path = _save(model, tmp_path / architecture)
    return path, getattr(transformers, architecture).from_pretrained(path).eval()


def _hf_spans(model, f):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(f["token_ids"]).long(),
                    token_type_ids=torch.tensor(f["segment_ids"]).long(),
                    attention_mask=torch.tensor(f["padding_mask"]).float())
    return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}


# TensorFlow only, as every family's QA head test (XLNet's model on every backend with HF's
# head: test_xlnet_text_classifier_is_hfs_sequence_classification)
def test_xlnet_question_answerer_is_hfs_simple_qa_head(tmp_path, tokenizer_files):
    """HF `XLNetForQuestionAnsweringSimple` (`qa_outputs`, a Linear over the last hidden states)
    <-> QuestionAnswerer on XLNetBackbone: `from_preset` and strict `convert_task` give HF's
    start / end logits at every real position of XLNet's QA windows (`context <sep> question
    <sep> <cls>`, left padded, with the attention mask); exported back,
    AutoModelForQuestionAnswering loads it as XLNetForQuestionAnsweringSimple, whole."""
    tok = _tokenizer("wordpiece", tokenizer_files)
    path, hf = _xlnet_qa_checkpoint(tmp_path, "XLNetForQuestionAnsweringSimple",
                                    tok.vocabulary_size())
    qa = kb.tasks.QuestionAnswerer.from_preset(path, preprocessor=None)
    strict = kb.presets.convert_task(path, kb.tasks.QuestionAnswerer, preprocessor=None)
    windows = kb.preprocessing.QuestionAnswererPreprocessor(tok, 24, stride=6,
                                                            max_question_length=6, layout="xlnet")
    f, _ = windows.windows(*XLNET_QA)
    f = {k: to_numpy(v) for k, v in f.items()}
    assert len(f["token_ids"]) >= 3 and (f["padding_mask"][:, 0] == 0).any()  # left padded
    assert (f["token_ids"][:, -1] == tok.cls_token_id).all()
    ref, real = _hf_spans(hf, f), f["padding_mask"].astype(bool)
    for model in (qa, strict):
        out = model(f, training=False)
        for key in ref:
            assert _max_diff(to_numpy(out[key])[real], ref[key][real]) <= 1e-4, key
    out_dir = kb.presets.export_to_transformers(qa, str(tmp_path / "out"))
    again, info = transformers.AutoModelForQuestionAnswering.from_pretrained(
        out_dir, output_loading_info=True)
    assert type(again).__name__ == "XLNetForQuestionAnsweringSimple"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back = _hf_spans(again.eval(), f)
    for key in ref:
        assert _max_diff(back[key][real], ref[key][real]) <= 1e-4


def test_xlnet_beam_search_qa_checkpoint_is_another_model(tmp_path, tokenizer_files):
    """HF's `XLNetForQuestionAnswering` (beam-search head: start_n_top / end_n_top, an end head
    on each start candidate, answer_class) is not QuestionAnswerer's one Linear: `convert_task`
    refuses it by name; `from_preset` warns, loads the backbone and starts a new head."""
    tok = _tokenizer("wordpiece", tokenizer_files)
    path, hf = _xlnet_qa_checkpoint(tmp_path, "XLNetForQuestionAnswering", tok.vocabulary_size())
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"is a XLNetForQuestionAnswering checkpoint, HF's beam-search SQuAD "
                             r"head .*QuestionAnswerer loads its heads from "
                             r"XLNetForQuestionAnsweringSimple"):
        kb.presets.convert_task(path, kb.tasks.QuestionAnswerer, preprocessor=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qa = kb.tasks.QuestionAnswerer.from_preset(path, preprocessor=None)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(said) == 1 and re.search(r"is a XLNetForQuestionAnswering checkpoint, HF's "
                                        r"beam-search .*its head is new", said[0]), said
    np.testing.assert_array_equal(to_numpy(qa.backbone.word_embedding.embeddings),
                                  hf.transformer.word_embedding.weight.detach().numpy())


def test_xlnet_layout_is_the_tasks(tokenizer_files):
    """The layout follows the task's backbone (an XLNet backbone with a WordPiece tokenizer still
    reads `<cls>` last, so it packs XLNet's layout); a preprocessor built with the other layout
    is refused by name; question answering's windows follow it too (`context <sep> question
    <sep> <cls>` on XLNet, HF's run_qa.py)."""
    wordpiece = _tokenizer("wordpiece", tokenizer_files)
    xlnet = _tokenizer("xlnet", tokenizer_files)
    pre = kb.preprocessing.TextClassifierPreprocessor
    assert pre(xlnet, 16).packing_layout == "xlnet" and pre(wordpiece, 16).packing_layout == "bert"
    backbone = kb.models.XLNetBackbone(wordpiece.vocabulary_size(), 1, 2, 16, 32)
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre(wordpiece, 16))
    ids = to_numpy(clf.preprocessor(["the fox"])["token_ids"])[0]
    assert ids[-1] == wordpiece.cls_token_id and ids[0] == wordpiece.pad_token_id
    bert = kb.models.BertBackbone(xlnet.vocabulary_size(), 1, 2, 16, 32)
    on_bert = kb.tasks.TextClassifier(bert, num_classes=2, preprocessor=pre(xlnet, 16))
    assert to_numpy(on_bert.preprocessor(["the fox"])["token_ids"])[0, 0] == xlnet.cls_token_id
    with pytest.raises(ValueError, match=r"TextClassifier on XLNetBackbone reads its rows "
                                         r"packed in XLNet's layout .*layout='bert'"):
        kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre(wordpiece, 16,
                                                                          layout="bert"))
    qa_pre = kb.preprocessing.QuestionAnswererPreprocessor
    assert qa_pre(xlnet, 128, layout="xlnet").packing_layout == "xlnet"
    with pytest.raises(ValueError, match=r"QuestionAnswererPreprocessor packs the layouts "
                                         r"\('auto', 'bert', 'xlnet'\); got layout='xlnet '"):
        qa_pre(xlnet, 128, layout="xlnet ")
    qa = kb.tasks.QuestionAnswerer(backbone, preprocessor=qa_pre(wordpiece, 16, stride=4,
                                                                 max_question_length=4))
    ids = to_numpy(qa.preprocessor(([" fox?"], ["the quick brown fox"]))["token_ids"])
    assert ids[0, -1] == wordpiece.cls_token_id and ids[0, 0] == wordpiece.pad_token_id
    with pytest.raises(ValueError, match=r"QuestionAnswerer on XLNetBackbone reads its rows "
                                         r"packed in XLNet's layout .*layout='bert'"):
        kb.tasks.QuestionAnswerer(backbone, preprocessor=qa_pre(
            wordpiece, 16, max_question_length=4, layout="bert"))
    mc = kb.tasks.MultipleChoice(backbone, preprocessor=kb.preprocessing.MultipleChoicePreprocessor(
        wordpiece, 16))
    ids = to_numpy(mc.preprocessor((["the fox"], [["a dog", "a cat"]]))["token_ids"])
    assert (ids[..., -1] == wordpiece.cls_token_id).all()
    # One preprocessor for an XLNet and a BERT task: the second would repack the first's rows
    shared = pre(wordpiece, 16)
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=shared)
    kb.tasks.TextClassifier(backbone, num_classes=3, preprocessor=shared)  # same layout: fine
    with pytest.raises(ValueError, match=r"This TextClassifierPreprocessor already packs rows for "
                                         r"a task that reads XLNet's layout; TextClassifier on "
                                         r"BertBackbone reads BERT's"):
        kb.tasks.TextClassifier(kb.models.BertBackbone(wordpiece.vocabulary_size(), 1, 2, 16, 32),
                                num_classes=2, preprocessor=shared)
    assert shared.packing_layout == "xlnet"


# === Export: ours -> HF -> ours ===
SENTENCES = ["the quick brown fox jumps over the lazy dog.", "Seven wizards box jugs, quietly!"]


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, bert_vocab):
    """Files of one small tokenizer of each kind: WordPiece (BERT's uncased vocabulary), a
    byte-level BPE and an ALBERT SentencePiece model trained on a few sentences."""
    words = ("the quick brown fox jumps over lazy dog while seven wizards quietly box jugs of "
             "liquid").split()
    rng = random.Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(200)]
    root = tmp_path_factory.mktemp("tokenizers")
    kb.preprocessing.train_byte_pair_vocabulary(docs, 300, output_dir=str(root))
    kb.preprocessing.train_sentencepiece_model(docs, 45, output_file=str(root / "spiece.model"))
    kb.preprocessing.train_xlnet_sentencepiece_model(docs, 50,
                                                     output_file=str(root / "xlnet.model"))
    return {"wordpiece": bert_vocab, "byte_pair": (str(root / "vocab.json"),
                                                   str(root / "merges.txt")),
            "sentencepiece": str(root / "spiece.model"), "xlnet": str(root / "xlnet.model")}


def _tokenizer(kind, files):
    # Made in each test: the session reset between tests drops tf-text's SentencePiece resource.
    if kind == "wordpiece":
        return kb.preprocessing.WordPieceTokenizer(files[kind], lowercase=True)
    if kind == "byte_pair":
        return kb.preprocessing.BytePairTokenizer(*files[kind])
    if kind == "xlnet":
        return kb.preprocessing.XLNetTokenizer(files[kind])
    return kb.preprocessing.SentencePieceTokenizer(files[kind], lowercase=True)


SMALL = dict(num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=30)
EXPORTS = {
    "roberta": (kb.models.RobertaBackbone, {}, "byte_pair", "RobertaModel"),
    "albert": (kb.models.AlbertBackbone, dict(embedding_dim=8), "sentencepiece", "AlbertModel"),
    "distil_bert": (kb.models.DistilBertBackbone, {}, "wordpiece", "DistilBertModel"),
    "electra": (kb.models.ElectraBackbone, dict(embedding_dim=8), "wordpiece", "ElectraModel"),
    "spanbert": (kb.models.SpanBertBackbone, {}, "wordpiece", "BertModel"),
    "bert": (kb.models.BertBackbone, dict(activation="gelu_approximate"), "wordpiece",
             "BertModel"),
    "xlnet": (lambda vocabulary_size, max_sequence_length, **kw: kb.models.XLNetBackbone(
        vocabulary_size, **kw, mem_len=4), {}, "xlnet", "XLNetModel"),
}


def _perturb_weights(model):
    for w in model.weights:
        if "float" in str(w.dtype):  # not a sampler's seed state
            w.assign(to_numpy(w) + np.random.default_rng(len(w.path)).normal(0, 0.05, w.shape))
    return model


def _config(backbone):
    return {k: v for k, v in backbone.get_config().items() if k not in ("name", "dtype")}


@pytest.mark.parametrize("family", sorted(EXPORTS))
def test_export_round_trip(family, tokenizer_files, tmp_path):
    cls, options, kind, architecture = EXPORTS[family]
    tokenizer = _tokenizer(kind, tokenizer_files)
    backbone = _perturb_weights(cls(vocabulary_size=tokenizer.vocabulary_size(), **SMALL,
                                    **options))
    path = kb.presets.export_to_transformers(backbone, str(tmp_path), tokenizer=tokenizer)

    hf = transformers.AutoModel.from_pretrained(path).eval()
    assert type(hf).__name__ == architecture
    ids = tokenizer(SENTENCES[:1]).to_list()[0]
    x = {"token_ids": np.array([[tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id]] * 2,
                               "int32")}
    x["padding_mask"] = np.ones_like(x["token_ids"])
    x["padding_mask"][1, 4:] = 0
    x["token_ids"][1, 4:] = tokenizer.pad_token_id
    if "segment_ids" in backbone.input:
        x["segment_ids"] = np.zeros_like(x["token_ids"])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x["token_ids"]).long(),
                 attention_mask=torch.tensor(x["padding_mask"]).long()).last_hidden_state
    ours = to_numpy(backbone(x)["sequence_output"])
    valid = x["padding_mask"].astype(bool)
    assert np.abs(ours - ref.numpy())[valid].max() <= 1e-4

    back = type(backbone).from_preset(path)
    assert _config(back) == _config(backbone)
    for a, b in zip(back.weights, backbone.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    for text in SENTENCES:
        assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == (
            tokenizer([text]).to_list()[0])
    assert kb.preprocessing.Tokenizer.from_preset(path)(SENTENCES).to_list() == (
        tokenizer(SENTENCES).to_list())


def _reloaded_without_missing_keys(path, architecture):
    model, info = getattr(transformers, architecture).from_pretrained(path,
                                                                      output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    return model.eval()


@pytest.mark.parametrize("family", ["albert", "electra", "roberta", "distil_bert"])
def test_export_pretraining_heads(family, tmp_path):
    """Our task -> the family's HF head model (no weight left to initialize) -> the same logits,
    and back through convert_task."""
    cls, options, _, _ = EXPORTS[family]
    backbone = cls(vocabulary_size=VOCAB, **SMALL, **options)
    task_cls = {"albert": kb.tasks.AlbertPretrainer,
                "electra": kb.tasks.ElectraPretrainer}.get(family, kb.tasks.MaskedLM)
    task = (task_cls(discriminator=backbone) if family == "electra" else task_cls(backbone))
    _perturb_weights(task)
    kb.presets.export_to_transformers(task, str(tmp_path))
    architecture = kb.presets.FAMILIES[family].hf_task_architectures[task_cls.__name__]
    hf = _reloaded_without_missing_keys(str(tmp_path), architecture)
    x = _inputs(first=0, pad=1) if family == "roberta" else _inputs()
    x = {k: v for k, v in x.items() if k in backbone.input}
    ref = _hf(hf, x, segments="segment_ids" in x)
    if family == "electra":
        out = task(dict(x, mask_positions=np.zeros_like(POSITIONS)))["rtd_logits"]
        valid = x["padding_mask"].astype(bool)
        assert np.abs(to_numpy(out) - ref.logits.numpy())[valid].max() <= 1e-4
    elif family == "albert":
        out = task(dict(x, mask_positions=POSITIONS))
        assert _max_diff(out["mlm_logits"], _at_positions(ref.prediction_logits)) <= 1e-4
        assert _max_diff(out["pair_logits"], ref.sop_logits) <= 1e-4
    else:
        assert _max_diff(task(dict(x, mask_positions=POSITIONS)), _at_positions(ref.logits)) <= 1e-4
    back = kb.presets.convert_task(str(tmp_path), task_cls, preprocessor=None)
    heads = kb.presets.FAMILIES[family].hf_task_heads[task_cls.__name__]
    for (a, _, _), (b, _, _) in zip(heads(back), heads(task)):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


# === Bad input ===
def test_head_checkpoint_of_another_family(tmp_path):
    bert_dir = _save(transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)), tmp_path / "bert")
    with pytest.raises(ValueError, match=r"AlbertPretrainer's HF heads come from checkpoints of "
                       r"the 'albert' \(AlbertForPreTraining\) family; .* 'bert' checkpoint "
                       r"\(BertForPreTraining\)"):
        kb.presets.convert_task(bert_dir, kb.tasks.AlbertPretrainer, preprocessor=None)
    with pytest.raises(ValueError, match=r"'electra' \(ElectraForPreTraining\)"):
        kb.presets.convert_task(bert_dir, kb.tasks.ElectraPretrainer, preprocessor=None)


def test_checkpoint_without_the_head(tmp_path, electra_dirs):
    albert_dir = _save(transformers.AlbertModel(_albert_config()), tmp_path / "albert")
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"lacks 7 weight\(s\) the AlbertPretrainer head needs, e\.g\. "
                             r"\['predictions\.dense\.weight'.*is a AlbertModel checkpoint; "
                             r"AlbertPretrainer loads its heads from AlbertForPreTraining"):
        kb.presets.convert_task(albert_dir, kb.tasks.AlbertPretrainer, preprocessor=None)
    disc_dir, gen_dir = electra_dirs
    # the two ELECTRA checkpoints swapped: the discriminator head is not in a generator
    with pytest.raises(checkpoints.CheckpointError, match=r"generator_predictions.*is a "
                       r"ElectraForPreTraining checkpoint; ElectraPretrainer loads its "
                       r"generator_preset heads from ElectraForMaskedLM"):
        kb.presets.convert_task(disc_dir, kb.tasks.ElectraPretrainer, preprocessor=None,
                                generator_preset=disc_dir)
    with pytest.raises(checkpoints.CheckpointError, match="discriminator_predictions.*is a "
                       "ElectraForMaskedLM checkpoint"):
        kb.presets.convert_task(gen_dir, kb.tasks.ElectraPretrainer, preprocessor=None)


def _bert_config(**overrides):
    return transformers.BertConfig(**dict(dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=32), **overrides))


def test_head_tensor_no_head_has_a_place_for(tmp_path):
    """A tensor outside the base model that no head of the family reads (a classifier with a
    layer more than HF's) fails `convert_task`, naming it; `from_preset` warns and loads the
    rest."""
    from safetensors.numpy import load_file, save_file

    path = _save(transformers.BertForSequenceClassification(_bert_config(num_labels=3)), tmp_path)
    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    state["classifier.extra.weight"] = np.ones((3, 3), "float32")
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"model\.safetensors' holds 1 tensor\(s\) outside the base model "
                             r"that no bert head has a place for, e\.g\. "
                             r"\['classifier\.extra\.weight'\]; TextClassifier loads its heads "
                             r"from BertForSequenceClassification: "
                             r"\['classifier\.bias', 'classifier\.weight'\]"):
        kb.presets.convert_task(path, kb.tasks.TextClassifier, preprocessor=None)
    with pytest.warns(UserWarning, match=r"\['classifier\.extra\.weight'\].*they are not loaded"
                      ) as caught:
        clf = kb.tasks.TextClassifier.from_preset(path, num_classes=3, preprocessor=None)
    assert [w.filename for w in caught if "not loaded" in str(w.message)] == [__file__]
    np.testing.assert_array_equal(to_numpy(clf.head.bias), state["classifier.bias"])


def test_another_tasks_head_is_dropped_with_a_warning(tmp_path):
    """BertForPreTraining into MaskedLM: its NSP head is another task's head of the family,
    dropped with a warning naming it (HF's "Some weights ... were not used"); `from_preset`,
    which loads whatever heads a checkpoint has, says nothing."""
    path = _save(transformers.BertForPreTraining(_bert_config()), tmp_path)
    hf = transformers.BertForPreTraining.from_pretrained(path)
    with pytest.warns(UserWarning, match=r"not used: \['cls\.seq_relationship\.bias', "
                                         r"'cls\.seq_relationship\.weight'\]"):
        mlm = kb.presets.convert_task(path, kb.tasks.MaskedLM, preprocessor=None)
    x = _inputs()
    ref = _at_positions(_hf(hf, x).prediction_logits)
    assert _max_diff(mlm(dict(x, mask_positions=POSITIONS)), ref) <= 1e-4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kb.tasks.MaskedLM.from_preset(path, preprocessor=None)
    assert not [str(w.message) for w in caught if "seq_relationship" in str(w.message)]


@pytest.mark.parametrize("family", sorted(kb.presets.FAMILIES))
def test_every_hf_head_tensor_is_known(family):
    """Each of the family's HF head models, with the tied decoders a `.bin` checkpoint saves: every
    tensor outside the base model is read by a head of the family or declared unused
    (`hf_tied_heads`, each of which some head model has)."""
    spec = kb.presets.FAMILIES[family]
    known = hf_heads.known_head_keys(spec)
    seen = set()
    for architecture in spec.hf_task_architectures.values():
        state = getattr(transformers, architecture)(HF_CONFIGS[family][1]()).state_dict()
        keys = {k for k in checkpoints.head_keys(state, spec.hf_prefixes)
                if not k.endswith(checkpoints.HF_BUFFERS)}
        assert keys and keys <= known, (architecture, sorted(keys - known))
        seen |= keys
    assert set(spec.hf_tied_heads) <= seen


def test_legacy_layer_norm_names(tmp_path):
    """google-bert/bert-base-uncased's weights still name LayerNorms `gamma` / `beta`."""
    from safetensors.numpy import load_file, save_file

    path = _save(transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)), tmp_path)
    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
    assert "bert.embeddings.LayerNorm.gamma" in legacy and "cls.predictions.bias" in legacy
    save_file(legacy, weights, metadata={"format": "pt"})
    task = kb.presets.convert_task(path, kb.tasks.BertPretrainer, preprocessor=None)
    np.testing.assert_array_equal(to_numpy(task.backbone.embeddings.layer_norm.gamma),
                                  state["bert.embeddings.LayerNorm.weight"])
    np.testing.assert_array_equal(to_numpy(task.mlm_head.layer_norm.beta),
                                  state["cls.predictions.transform.LayerNorm.bias"])


def test_checkpoint_shapes_not_matching_the_config(tmp_path, electra_dirs):
    import json

    bad = str(tmp_path / "bad")
    shutil.copytree(electra_dirs[0], bad)
    with open(os.path.join(bad, "config.json")) as f:
        config = json.load(f)
    config["embedding_size"] = 12
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(checkpoints.CheckpointError, match=r"Shape mismatch for embeddings\."
                       r"word_embeddings\.weight: the checkpoint has \(120, 8\), the "
                       r"ElectraBackbone expects \(120, 12\)"):
        kb.presets.convert_task(bad, kb.tasks.ElectraPretrainer, preprocessor=None)


def test_export_refuses_what_hf_cannot_represent(tmp_path):
    albert = kb.models.AlbertBackbone(vocabulary_size=VOCAB, **SMALL, embedding_dim=8,
                                      share="attention")
    with pytest.raises(NotImplementedError, match="share='attention'"):
        kb.presets.export_to_transformers(albert, str(tmp_path / "albert"))
    xlnet = kb.models.XLNetBackbone(VOCAB, 1, 2, 16, 32, untie_r=False)
    with pytest.raises(NotImplementedError, match="untie_r=False"):
        kb.presets.export_to_transformers(xlnet, str(tmp_path / "xlnet"))
    assert not os.listdir(tmp_path)  # nothing half-written


def test_export_writes_every_weight_or_says_which_not(tmp_path, monkeypatch):
    """A task's layers no HF class has (SpanBertPretrainer's span-boundary head) and an
    ElectraPretrainer without `generator_path` export with a warning naming what is left out; a
    weight no weight map writes is an error."""
    backbone = kb.models.BertBackbone(vocabulary_size=VOCAB, **SMALL)
    spanbert = kb.tasks.SpanBertPretrainer(kb.models.SpanBertBackbone(vocabulary_size=VOCAB,
                                                                      **SMALL))
    # its MLM head as BertForMaskedLM's; no HF class has the span-boundary head
    with pytest.warns(UserWarning, match=r"\d+ weight\(s\) of the SpanBertPretrainer are not "
                      r"exported \(no HF class of the 'spanbert' family has its \['sbo_head'\]"):
        kb.presets.export_to_transformers(spanbert, str(tmp_path / "sbo"))
    _reloaded_without_missing_keys(str(tmp_path / "sbo"), "BertForMaskedLM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the span-boundary head is new
        again = kb.tasks.SpanBertPretrainer.from_preset(str(tmp_path / "sbo"), preprocessor=None)
    for a, b in zip(again.mlm_head.weights, spanbert.mlm_head.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    electra = kb.tasks.ElectraPretrainer(discriminator=kb.models.ElectraBackbone(
        vocabulary_size=VOCAB, **SMALL, embedding_dim=8))
    with pytest.warns(UserWarning, match="not exported .its generator goes to generator_path"
                      ) as caught:
        kb.presets.export_to_transformers(electra, str(tmp_path / "electra"))
    assert [w.filename for w in caught if "not exported" in str(w.message)] == [__file__]
    monkeypatch.setitem(kb.presets.FAMILIES["bert"].hf_task_heads, "TextClassifier",
                        lambda task: checkpoints.dense(task.head, "classifier")[:1])
    with pytest.raises(NotImplementedError, match=r"would drop 1 weight\(s\) of the "
                                                  r"TextClassifier .*e\.g\. \['[^']*bias'\]"):
        kb.presets.export_to_transformers(kb.tasks.TextClassifier(backbone, num_classes=2),
                                          str(tmp_path / "clf"))
    # a whole layer no map writes, not declared as SpanBERT's is (hf_unexported_layers): an error
    monkeypatch.setitem(kb.presets.FAMILIES["bert"].hf_task_heads, "TextClassifier",
                        lambda task: [])
    with pytest.raises(NotImplementedError, match=r"would drop 2 weight\(s\) of the "
                                                  r"TextClassifier"):
        kb.presets.export_to_transformers(kb.tasks.TextClassifier(backbone, num_classes=2),
                                          str(tmp_path / "clf"))
    assert not os.path.exists(tmp_path / "clf")


# === Sharded checkpoints (save_pretrained(max_shard_size=...)) ===
def _sharded(tmp_path, fmt):
    """A BertForPreTraining saved in shards: HF's model.safetensors.index.json +
    model-0000i-of-0000N.safetensors, or (fmt "bin", which transformers 5 no longer writes) the
    same shards as pytorch_model.bin.index.json + pytorch_model-0000i-of-0000N.bin."""
    import json

    from safetensors.numpy import load_file

    hf = _perturbed(transformers.BertForPreTraining(_bert_config()))
    path = str(tmp_path / fmt)
    hf.save_pretrained(path, max_shard_size="20KB")
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    assert len(set(weight_map.values())) > 2
    if fmt == "bin":
        for shard in sorted(set(weight_map.values())):
            state = {k: torch.from_numpy(v)
                     for k, v in load_file(os.path.join(path, shard)).items()}
            os.remove(os.path.join(path, shard))
            torch.save(state, os.path.join(path, shard.replace("model-", "pytorch_model-")
                                           .replace(".safetensors", ".bin")))
        weight_map = {k: v.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
                      for k, v in weight_map.items()}
        os.remove(index)
        index = os.path.join(path, "pytorch_model.bin.index.json")
        with open(index, "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return hf, path, index, weight_map


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_sharded_checkpoint_loads_as_hfs_model(fmt, tmp_path):
    """Every shard read: the backbone and the pretraining heads give HF's outputs."""
    hf, path, _, _ = _sharded(tmp_path, fmt)
    x = _inputs()
    ref = _hf(hf, x)
    task = kb.presets.convert_task(path, kb.tasks.BertPretrainer, preprocessor=None)
    out = task(dict(x, mask_positions=POSITIONS))
    assert _max_diff(out["mlm_logits"], _at_positions(ref.prediction_logits)) <= 1e-4
    assert _max_diff(out["pair_logits"], ref.seq_relationship_logits) <= 1e-4
    backbone = kb.models.BertBackbone.from_preset(path)
    with torch.no_grad():
        hidden = hf.bert(input_ids=torch.tensor(x["token_ids"]).long(),
                         attention_mask=torch.tensor(x["padding_mask"]).long()).last_hidden_state
    assert _max_diff(backbone(x)["sequence_output"], hidden) <= 1e-4


def test_sharded_checkpoint_errors_name_the_shard(tmp_path):
    """A shard missing, a tensor the index lists but its shard lacks, a tensor two shards claim,
    a shard the index does not list, non-finite values and a tensor the config has no place
    for: each refused, naming the file and tensor."""
    import json

    from safetensors.numpy import load_file, save_file

    _, path, index, weight_map = _sharded(tmp_path, "safetensors")
    shards = sorted(set(weight_map.values()))
    key = "bert.encoder.layer.1.output.dense.weight"
    shard = os.path.join(path, weight_map[key])

    def edited(name, edit):
        bad = str(tmp_path / name)
        shutil.copytree(path, bad)
        edit(bad)
        return bad

    def rewrite(shard_path, change):
        state = load_file(shard_path)
        change(state)
        save_file(state, shard_path, metadata={"format": "pt"})

    bad = edited("missing", lambda d: os.remove(os.path.join(d, shards[-1])))
    with pytest.raises(FileNotFoundError, match=re.escape(shards[-1]) + ".*" + re.escape(
            "model.safetensors.index.json")):
        kb.models.BertBackbone.from_preset(bad)

    bad = edited("lacks", lambda d: rewrite(os.path.join(d, weight_map[key]),
                                            lambda s: s.pop(key)))
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(weight_map[key]) +
                       r"' lacks 1 tensor\(s\) .*index.json' lists in it.*" + re.escape(key)):
        kb.models.BertBackbone.from_preset(bad)

    other = weight_map["bert.embeddings.word_embeddings.weight"]
    assert other != weight_map[key]
    bad = edited("twice", lambda d: rewrite(
        os.path.join(d, other), lambda s: s.update({key: load_file(shard)[key]})))
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(other) + r"' holds " +
                       re.escape(repr(key)) + r", which .*index.json' lists in " +
                       re.escape(weight_map[key])):
        kb.models.BertBackbone.from_preset(bad)

    def unlist(d):
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: v for k, v in weight_map.items() if v != shards[0]}}, f)
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(shards[0]) + r"' is shard 1 "
                       r"of \d+, but .*index.json' lists no tensor in it"):
        kb.models.BertBackbone.from_preset(edited("unlisted", unlist))

    bad = edited("nan", lambda d: rewrite(os.path.join(d, weight_map[key]),
                                          lambda s: s[key].__setitem__((0, 0), np.nan)))
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(weight_map[key]) +
                       r"': tensor " + re.escape(repr(key)) + r".* 1 non-finite"):
        kb.models.BertBackbone.from_preset(bad)

    with pytest.raises(checkpoints.CheckpointError, match=r"holds \d+ tensor\(s\) the "
                       r"BertBackbone has no place for, e\.g\. \['encoder\.layer\.1\."):
        kb.models.BertBackbone.from_preset(path, num_layers=1)
