"""keras-hub preset directories of every family keras-hub 0.32 has: BERT, RoBERTa, ALBERT,
DistilBERT, ELECTRA, XLNet (keras-hub has no SpanBERT, and no XLNet tokenizer).

Tiny keras-hub models with random weights are saved with keras-hub's own `save_to_preset` into
tmp (nothing is downloaded); our `from_preset` must give keras-hub's hidden states and token ids.
"""
import dataclasses
import os
import unicodedata
import warnings

import keras_hub
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import default_corpus_documents, to_numpy
from keras_bertfam.presets import checkpoints, keras_hub_format

SIZES = dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16)
VOCAB = 30522  # the BERT uncased vocabulary of the `bert_vocab` fixture


def _keras_hub_backbone(family, vocabulary_size=VOCAB):
    m = keras_hub.models
    sizes = dict(SIZES, max_sequence_length=16)
    if family == "bert":
        return m.BertBackbone(vocabulary_size=vocabulary_size, **sizes)
    if family == "roberta":
        return m.RobertaBackbone(vocabulary_size=vocabulary_size, **sizes)
    if family == "albert":  # 4 layers in 2 groups: the group order must agree
        return m.AlbertBackbone(vocabulary_size=vocabulary_size, embedding_dim=4, num_groups=2,
                                **dict(sizes, num_layers=4))
    if family == "distil_bert":
        return m.DistilBertBackbone(vocabulary_size=vocabulary_size, **sizes)
    if family == "electra":
        return m.ElectraBackbone(vocab_size=vocabulary_size, embedding_dim=4, **sizes)
    assert family == "xlnet"
    return m.XLNetBackbone(vocabulary_size=vocabulary_size, **SIZES)


def _randomize(model):
    """Non-trivial values everywhere (LayerNorm gammas around 1, biases non-zero)."""
    for w in model.weights:
        rng = np.random.default_rng(len(w.path) + 7 * sum(map(ord, w.path)))
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32") +
                 (1.0 if w.path.endswith("gamma") else 0.0))


def _inputs(vocabulary_size=VOCAB, batch=2, length=9, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocabulary_size, (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 6:] = 0  # right padding in the second row
    segments = np.zeros_like(ids)
    segments[:, 4:] = 1
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def _keras_hub_output(kh, x):
    out = kh({k: v for k, v in x.items() if k in kh.input})
    return to_numpy(out["sequence_output"] if isinstance(out, dict) else out)


def _our_inputs(backbone, x, family):
    x = {k: v for k, v in x.items() if k in backbone.input}
    if family == "roberta":  # one token type: keras-hub's RoBERTa takes no segment ids
        x["segment_ids"] = np.zeros_like(x["token_ids"])
    return x


OURS = {"bert": "BertBackbone", "roberta": "RobertaBackbone", "albert": "AlbertBackbone",
        "distil_bert": "DistilBertBackbone", "electra": "ElectraBackbone", "xlnet": "XLNetBackbone"}


# === Backbones: the same hidden states as keras-hub's ===
@pytest.mark.parametrize("family", [
    "bert", pytest.param("roberta", marks=pytest.mark.multibackend),
    pytest.param("albert", marks=pytest.mark.multibackend), "distil_bert", "electra"])
def test_encoder_backbone_equals_keras_hub(family, tmp_path):
    kh = _keras_hub_backbone(family)
    _randomize(kh)
    kh.save_to_preset(str(tmp_path))
    ours = getattr(kb.models, OURS[family]).from_preset(str(tmp_path))
    assert type(ours).family == family
    x = _inputs()
    theirs = _keras_hub_output(kh, x)
    out = ours(_our_inputs(ours, x, family))
    # Every position, padding included: same weights, same ops.
    assert np.abs(to_numpy(out["sequence_output"]) - theirs).max() <= 1e-5
    if family in ("bert", "albert"):  # keras-hub's pooler is ours; RoBERTa / DistilBERT have none
        pooled = to_numpy(kh({k: v for k, v in x.items() if k in kh.input})["pooled_output"])
        assert np.abs(to_numpy(out["pooled_output"]) - pooled).max() <= 1e-5
    # The generic `kb.presets.load_backbone` picks the family from the directory alone.
    again = kb.presets.load_backbone(str(tmp_path))
    assert type(again) is type(ours)


@pytest.mark.multibackend
def test_xlnet_backbone_equals_keras_hub_per_example(tmp_path):
    """keras-hub 0.32's XLNetBackbone mixes up the examples of a batch (it reshapes (T, B) tensors
    to (B, T) instead of transposing them: its batch outputs differ from its own one-example
    outputs), so the comparison is one example at a time, padded and unpadded."""
    kh = _keras_hub_backbone("xlnet", vocabulary_size=120)
    _randomize(kh)
    kh.save_to_preset(str(tmp_path))
    ours = kb.models.XLNetBackbone.from_preset(str(tmp_path))
    x = _inputs(vocabulary_size=120)
    batch = to_numpy(ours(x)["sequence_output"])
    for i in range(2):
        one = {k: v[i:i + 1] for k, v in x.items()}
        out = to_numpy(ours(one)["sequence_output"])
        assert np.abs(out - _keras_hub_output(kh, one)).max() <= 1e-5
        assert np.abs(batch[i:i + 1] - out).max() <= 1e-5  # ours is batch-independent


# === Tokenizers: the same ids as keras-hub's ===
@pytest.fixture(scope="module")
def texts():
    """Real sentences of the default corpus and a few with odd characters."""
    from keras_bertfam.preprocessing import corpus

    docs = default_corpus_documents(20000, 30)  # = default_corpus().skip(20000).take(30)
    lines = [s.decode() for s in corpus.split_sentences(docs).flat_values.numpy()][:50]
    return lines + [
        "Héllo wörld — naïve café, 1990, “quotes” ‘single’ … 東京 🙂 tabs\tand  spaces",
        "ﬁnance Straße ΣΊΣΥΦΟΣ Ｆｕｌｌｗｉｄｔｈ ½ x²", "it's 3,000,000 dollars!! (really?)",
        "  leading and trailing  ", "",
    ]


def _ids(tokenizer, texts):
    return [[int(i) for i in row] for row in tokenizer(texts)]


def _untouched_by_normalization(text):
    """keras-hub's WordPiece lowercase=True keeps accents (an accented word becomes [UNK]) and
    applies NFKC; ours strips accents as BERT's own tokenizer does. Texts that neither changes
    must tokenize the same."""
    stripped = "".join(c for c in unicodedata.normalize("NFD", text)
                       if unicodedata.category(c) != "Mn")
    return stripped == text and unicodedata.normalize("NFKC", text) == text


@pytest.mark.parametrize("family,cls,lowercase", [
    ("distil_bert", "DistilBertTokenizer", True), ("electra", "ElectraTokenizer", False),
    ("bert", "BertTokenizer", True)])
def test_wordpiece_tokenizer_equals_keras_hub(family, cls, lowercase, tmp_path, bert_vocab,
                                              texts):
    theirs = getattr(keras_hub.models, cls)(vocabulary=bert_vocab, lowercase=lowercase)
    theirs.save_to_preset(str(tmp_path))  # a tokenizer alone: tokenizer.json + assets
    assert not os.path.exists(tmp_path / "config.json")
    ours = kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    assert isinstance(ours, kb.preprocessing.WordPieceTokenizer)
    assert ours.bert_lowercase == lowercase
    same = [t for t in texts if not lowercase or _untouched_by_normalization(t)]
    assert len(same) >= 40
    assert _ids(ours, same) == _ids(theirs, same)


@pytest.fixture(scope="module")
def first_reviews():
    """= default_corpus().take(300), without starting its pipeline (conftest)."""
    return default_corpus_documents(0, 300)


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory, first_reviews):
    out = tmp_path_factory.mktemp("bpe")
    kb.preprocessing.train_byte_pair_vocabulary(first_reviews, 1000, output_dir=str(out))
    return str(out / "vocab.json"), str(out / "merges.txt")


@pytest.fixture(scope="module")
def spm_proto(tmp_path_factory, first_reviews):
    proto = str(tmp_path_factory.mktemp("spm") / "spiece.model")
    kb.preprocessing.train_sentencepiece_model(first_reviews, 1000, output_file=proto)
    return proto


def test_byte_pair_tokenizer_equals_keras_hub(tmp_path, bpe_files, texts):
    vocabulary, merges = bpe_files
    theirs = keras_hub.models.RobertaTokenizer(vocabulary=vocabulary, merges=merges)
    theirs.save_to_preset(str(tmp_path))
    ours = kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    assert isinstance(ours, kb.preprocessing.BytePairTokenizer)
    assert _ids(ours, texts) == _ids(theirs, texts)


def test_sentencepiece_tokenizer_equals_keras_hub(tmp_path, spm_proto, texts):
    """keras-hub's AlbertTokenizer runs the SentencePiece model alone, so ours runs without
    lowercasing or accent stripping; what stays is ALBERT's "``" / "''" -> '"' (none in these
    texts). keras-hub runs the Python SentencePiece library, ours tf-text's: they may break
    Viterbi ties differently ("!!!!" as "!!!" + "!" or "!" + "!!!"), the same pieces and score."""
    import sentencepiece as spm

    theirs = keras_hub.models.AlbertTokenizer(proto=spm_proto)
    theirs.save_to_preset(str(tmp_path))
    ours = kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    assert isinstance(ours, kb.preprocessing.SentencePieceTokenizer)
    assert (ours.lowercase, ours.keep_accents) == (False, True)
    sp = spm.SentencePieceProcessor(model_file=spm_proto)
    score = lambda ids: sum(sp.get_score(i) for i in ids)  # noqa: E731
    exact = 0
    for a, b in zip(_ids(ours, texts), _ids(theirs, texts)):
        exact += a == b
        assert sorted(sp.id_to_piece(a)) == sorted(sp.id_to_piece(b))
        assert abs(score(a) - score(b)) < 1e-4
    assert exact >= len(texts) - 3


# === Tasks: from_preset loads the backbone and tokenizer of a keras-hub directory ===
def _keras_hub_tokenizer(family, bert_vocab, bpe_files, spm_proto):
    m = keras_hub.models
    if family == "roberta":
        return m.RobertaTokenizer(vocabulary=bpe_files[0], merges=bpe_files[1])
    if family == "albert":
        return m.AlbertTokenizer(proto=spm_proto)
    cls = {"bert": m.BertTokenizer, "distil_bert": m.DistilBertTokenizer,
           "electra": m.ElectraTokenizer}[family]
    return cls(vocabulary=bert_vocab, lowercase=True)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "distil_bert", "electra"])
def test_tasks_from_keras_hub_preset(family, tmp_path, bert_vocab, bpe_files, spm_proto):
    tokenizer = _keras_hub_tokenizer(family, bert_vocab, bpe_files, spm_proto)
    vocabulary_size = tokenizer.vocabulary_size()
    kh = _keras_hub_backbone(family, vocabulary_size=vocabulary_size)
    _randomize(kh)
    kh.save_to_preset(str(tmp_path))
    tokenizer.save_to_preset(str(tmp_path))
    x = _inputs(vocabulary_size=vocabulary_size)
    theirs = _keras_hub_output(kh, x)
    clf = kb.tasks.TextClassifier.from_preset(str(tmp_path), num_classes=3, sequence_length=8)
    mlm = kb.tasks.MaskedLM.from_preset(str(tmp_path), sequence_length=8)
    for task in (clf, mlm):
        assert type(task.backbone).family == family
        out = task.backbone(_our_inputs(task.backbone, x, family))["sequence_output"]
        assert np.abs(to_numpy(out) - theirs).max() <= 1e-5
        assert task.preprocessor.tokenizer.vocabulary_size() == vocabulary_size
    assert clf.predict(["a keras-hub preset", "and a second text"], verbose=0).shape == (2, 3)


def test_xlnet_task_from_keras_hub_preset_without_tokenizer(tmp_path):
    kh = _keras_hub_backbone("xlnet", vocabulary_size=120)
    _randomize(kh)
    kh.save_to_preset(str(tmp_path))
    clf = kb.tasks.TextClassifier.from_preset(str(tmp_path), num_classes=2, preprocessor=None)
    one = {k: v[:1] for k, v in _inputs(vocabulary_size=120).items()}
    assert np.abs(to_numpy(clf.backbone(one)["sequence_output"]) -
                  _keras_hub_output(kh, one)).max() <= 1e-5
    with pytest.raises(ValueError, match="keras-hub has no tokenizer"):
        kb.preprocessing.Tokenizer.from_preset(str(tmp_path))


# === Bad input ===
def test_keras_hub_family_we_do_not_load(tmp_path):
    keras_hub.models.FNetBackbone(vocabulary_size=20, num_layers=1, hidden_dim=4,
                                  intermediate_dim=8, max_sequence_length=8).save_to_preset(
        str(tmp_path))
    with pytest.raises(ValueError, match="keras-hub FNetBackbone preset; no family") as e:
        kb.presets.load_backbone(str(tmp_path))
    assert str(tmp_path) in str(e.value) and "RobertaBackbone" in str(e.value)


def test_keras_hub_preset_missing_files(tmp_path, bert_vocab):
    kh = _keras_hub_backbone("distil_bert")
    kh.save_to_preset(str(tmp_path))
    keras_hub.models.DistilBertTokenizer(vocabulary=bert_vocab).save_to_preset(str(tmp_path))
    os.remove(tmp_path / "model.weights.h5")
    with pytest.raises(FileNotFoundError, match="has no model.weights.h5") as e:
        kb.models.DistilBertBackbone.from_preset(str(tmp_path))
    assert str(tmp_path) in str(e.value)
    unloaded = kb.models.DistilBertBackbone.from_preset(str(tmp_path), load_weights=False)
    assert unloaded.num_layers == 2
    os.remove(tmp_path / "assets" / "tokenizer" / "vocabulary.txt")
    with pytest.raises(FileNotFoundError, match="lacks its tokenizer's vocabulary.txt") as e:
        kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    assert str(tmp_path) in str(e.value)
    os.remove(tmp_path / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        kb.preprocessing.Tokenizer.from_preset(str(tmp_path))


def test_keras_hub_tokenizer_only_dir_has_no_backbone(tmp_path, bert_vocab):
    keras_hub.models.BertTokenizer(vocabulary=bert_vocab).save_to_preset(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no config.json: it holds a tokenizer only"):
        kb.models.BertBackbone.from_preset(str(tmp_path))


def test_keras_hub_preset_of_another_family(tmp_path):
    _keras_hub_backbone("roberta").save_to_preset(str(tmp_path))
    with pytest.raises(ValueError, match="is a 'roberta' preset; BertBackbone loads 'bert'"):
        kb.models.BertBackbone.from_preset(str(tmp_path))
    # keras-hub has no SpanBERT; its BERT (tanh GELU) is not a SpanBertBackbone (exact GELU).
    _keras_hub_backbone("bert").save_to_preset(str(tmp_path / "bert"))
    with pytest.raises(ValueError, match="is a 'bert' preset; SpanBertBackbone loads 'spanbert'"):
        kb.models.SpanBertBackbone.from_preset(str(tmp_path / "bert"))


def test_keras_hub_tokenizer_of_a_family_we_do_not_load(tmp_path):
    keras_hub.models.GPT2Tokenizer(vocabulary={"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3},
                                   merges=["a b"]).save_to_preset(str(tmp_path))
    with pytest.raises(ValueError, match="keras-hub GPT2Tokenizer preset; no family"):
        kb.preprocessing.Tokenizer.from_preset(str(tmp_path))


def test_keras_hub_albert_we_cannot_represent(tmp_path):
    m = keras_hub.models
    m.AlbertBackbone(vocabulary_size=20, embedding_dim=8, **dict(SIZES, max_sequence_length=8)
                     ).save_to_preset(str(tmp_path / "e_eq_h"))
    with pytest.raises(checkpoints.CheckpointError, match="embedding_dim == hidden_dim"):
        kb.models.AlbertBackbone.from_preset(str(tmp_path / "e_eq_h"))


@pytest.mark.multibackend
def test_keras_hub_albert_inner_repetitions_load_and_agree(tmp_path):
    """keras-hub's `num_inner_repetitions`: R distinct blocks per group, each layer runs all R."""
    kh = keras_hub.models.AlbertBackbone(vocabulary_size=20, embedding_dim=4, num_groups=2,
                                         num_inner_repetitions=2,
                                         **dict(SIZES, num_layers=4, max_sequence_length=8))
    _randomize(kh)
    kh.save_to_preset(str(tmp_path))
    ours = kb.models.AlbertBackbone.from_preset(str(tmp_path))
    assert ours.num_inner_repetitions == 2 and ours.num_params() == kh.count_params()
    x = _inputs(vocabulary_size=20, length=8)
    np.testing.assert_allclose(to_numpy(ours(x)["sequence_output"]), _keras_hub_output(kh, x),
                               atol=1e-4)


def test_keras_hub_weights_without_a_place_fail(tmp_path, monkeypatch):
    """Every keras-hub weight is used or declared unused: without ELECTRA's declaration of its
    pooler, loading fails and names it (a changed keras-hub layout cannot half-load)."""
    _keras_hub_backbone("electra").save_to_preset(str(tmp_path))
    fmt = keras_hub_format.KERAS_HUB["ElectraBackbone"]
    monkeypatch.setitem(keras_hub_format.KERAS_HUB, "ElectraBackbone",
                        dataclasses.replace(fmt, unused=()))
    with pytest.raises(checkpoints.CheckpointError, match="pooled_dense/kernel"):
        kb.models.ElectraBackbone.from_preset(str(tmp_path))


def test_keras_hub_corrupt_weights(tmp_path):
    _keras_hub_backbone("bert").save_to_preset(str(tmp_path))
    with open(tmp_path / "model.weights.h5", "wb") as f:
        f.write(b"not an h5 file")
    with pytest.raises(checkpoints.CheckpointError, match="corrupt or does not match"):
        kb.models.BertBackbone.from_preset(str(tmp_path))


def test_keras_hub_config_with_fewer_layers_than_its_weights_is_refused(tmp_path):
    """Keras' load_weights fills the model's variables and skips the file's others: a keras-hub
    config.json saying 1 layer over a 2-layer model.weights.h5 loaded silently, the second
    layer dropped (outputs off by ~3e-2). As with HF's checkpoints, every stored weight must
    be used."""
    import json

    _keras_hub_backbone("bert").save_to_preset(str(tmp_path))
    assert kb.models.BertBackbone.from_preset(str(tmp_path)).num_layers == SIZES["num_layers"]
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    config["config"]["num_layers"] = SIZES["num_layers"] - 1
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(checkpoints.CheckpointError, match=r"model.weights.h5' holds \d+ weight "
                       r"arrays.*config.json \d+.*num_layers"):
        kb.models.BertBackbone.from_preset(str(tmp_path))


def test_keras_hub_task_dir_warns_that_its_head_is_not_loaded(tmp_path, bert_vocab):
    """(keras-hub heads that load: tests/test_keras_hub_task_heads.py)"""
    m = keras_hub.models
    backbone = _keras_hub_backbone("bert")
    preprocessor = m.BertTextClassifierPreprocessor(
        m.BertTokenizer(vocabulary=bert_vocab, lowercase=True), sequence_length=8)
    m.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor).save_to_preset(
        str(tmp_path))
    # (a task of another kind than the one saved: its head is not this task's)
    with pytest.warns(UserWarning, match="keras-hub BertTextClassifier.*not its head weights"):
        clf = kb.tasks.TokenClassifier.from_preset(str(tmp_path), num_classes=3,
                                                   sequence_length=8)
    assert isinstance(clf.backbone, kb.models.BertBackbone)
    with warnings.catch_warnings(record=True) as caught:  # a backbone has no head to lose
        warnings.simplefilter("always")
        assert kb.models.BertBackbone.from_preset(str(tmp_path)).num_layers == 2
    assert not [w for w in caught if "head weights" in str(w.message)]


def test_frozen_backbone_stays_frozen(tmp_path):
    """keras-hub's config.json keeps `trainable: false` (its from_preset gives a frozen
    backbone): ours loads it frozen, and our save_to_preset keeps it, for the backbone and for a
    task's backbone."""
    kh = _keras_hub_backbone("bert", vocabulary_size=50)
    kh.trainable = False
    kh.save_to_preset(str(tmp_path / "kh"))
    assert not keras_hub.models.Backbone.from_preset(str(tmp_path / "kh")).trainable
    ours = kb.models.BertBackbone.from_preset(str(tmp_path / "kh"))
    assert not ours.trainable and not ours.trainable_weights
    ours.save_to_preset(str(tmp_path / "ours"))
    again = kb.models.BertBackbone.from_preset(str(tmp_path / "ours"))
    assert not again.trainable and not again.trainable_weights
    task = kb.tasks.TextClassifier.from_preset(str(tmp_path / "ours"), num_classes=2,
                                               preprocessor=None)
    assert not task.backbone.trainable and task.trainable_weights  # the head trains
    task.save_to_preset(str(tmp_path / "task"))
    task = kb.tasks.TextClassifier.from_preset(str(tmp_path / "task"), preprocessor=None)
    assert not task.backbone.trainable and len(task.trainable_weights) == 2
    # unfrozen again, it saves trainable
    again.trainable = True
    again.save_to_preset(str(tmp_path / "thawed"))
    assert kb.models.BertBackbone.from_preset(str(tmp_path / "thawed")).trainable
