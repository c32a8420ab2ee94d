"""Presets: the registry, parameter counts, every kind of `from_preset` source, HF task heads,
export to transformers, the real MiniLM as a sentence encoder, and bad input.

HF reference models are random-initialized from a config and saved to tmp (never downloaded); the
HF hub cache is a fake one built in tmp.
"""
import importlib
import json
import os
import re
import shutil

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import to_numpy, unblock_imports
from keras_bertfam.presets import checkpoints, integrity
from keras_bertfam.presets.params import count_params, encoder_param_count, encoder_arguments

TINY_HF = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=64)


def _ids(batch=2, length=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 5000, (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def _hf_sequence(model, x):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
                    token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long))
    return out


def _max_diff_on_tokens(a, b, mask):
    keep = mask.astype(bool)
    return float(np.abs(np.asarray(a)[keep] - np.asarray(b)[keep]).max())


@pytest.fixture(scope="module")
def hf_pretraining_dir(tmp_path_factory, bert_vocab):
    import torch
    import transformers

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("hf_bert_pretraining"))
    model = transformers.BertForPreTraining(transformers.BertConfig(**TINY_HF)).eval()
    model.save_pretrained(path)
    shutil.copy(bert_vocab, os.path.join(path, "vocab.txt"))
    return path


# === Registry ===
def test_list_prints_a_table_and_unknown_names_suggest(capsys):
    names = kb.presets.list()
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["name", "family", "size", "params", "source"]
    row = next(line for line in table if line.startswith("bert_tiny_en_uncased "))
    assert "L2 H128 A2" in row and "4.4M" in row and "google/bert_uncased_L-2_H-128_A-2" in row
    assert "all_minilm_l6_v2" in names and len(names) == len(kb.presets.PRESETS)
    with pytest.raises(ValueError, match="Did you mean bert_tiny_en_uncased"):
        kb.models.BertBackbone.from_preset("bert_tiny_en_uncase")
    with pytest.raises(ValueError, match="No presets of family"):
        kb.presets.list("bret")


ENCODER_OPTIONS = [
    dict(),
    dict(embedding_dim=8),
    dict(num_segments=0, pooler=False),
    dict(position_offset=2, num_segments=1),
    dict(embedding_dim=8, num_groups=1, share="all"),
    dict(num_groups=2, share="attention"),
    dict(num_groups=2, share="ffn"),
]


@pytest.mark.multibackend
@pytest.mark.parametrize("options", ENCODER_OPTIONS)
def test_analytic_count_equals_built_model(options):
    config = dict(vocabulary_size=50, num_layers=4, num_heads=2, hidden_dim=16,
                  intermediate_dim=24, max_sequence_length=12, **options)
    backbone = kb.models.EncoderBackbone(**config)
    assert backbone.num_params() == encoder_param_count(**config)


@pytest.mark.parametrize("options", [dict(), dict(untie_r=False), dict(num_heads=4, num_layers=1)])
def test_xlnet_analytic_count_equals_built_model(options):
    """XLNet is not an EncoderBackbone: its FamilySpec counts (tied and shared relative biases;
    one layer, four heads)."""
    from keras_bertfam.presets.families.xlnet import xlnet_param_count

    config = dict(dict(vocabulary_size=50, num_layers=3, num_heads=2, hidden_dim=16,
                       intermediate_dim=24), **options)
    assert kb.models.XLNetBackbone(**config).num_params() == xlnet_param_count(config)


def test_every_registered_preset_count(collect_only_new_objects):
    """Each preset's registered count equals its config's, computed without building anything
    (analytic per family, cross-checked against built models above and below); the small ones
    are also built."""
    for name, preset in kb.presets.PRESETS.items():
        assert kb.presets.count_params(name) == preset.params, name
    small = [p for p in kb.presets.PRESETS.values() if p.params < 12_000_000]
    assert small
    for preset in small:
        spec = kb.presets.FAMILIES[preset.family]
        built = spec.backbone_cls(**preset.config)
        assert built.num_params() == preset.params, preset.name
        keras.backend.clear_session()
    with pytest.raises(TypeError, match="XLNetBackbone is not an EncoderBackbone"):
        count_params(kb.models.XLNetBackbone, kb.presets.get("xlnet_base_en").config)


def test_family_arguments_are_read_without_building():
    args = encoder_arguments(kb.models.BertBackbone, kb.presets.get("bert_tiny_en_uncased").config)
    assert args["hidden_dim"] == 128 and args["num_segments"] == 2 and args["pooler"] is True


# === Sources: our preset dirs, HF dirs, keras-hub dirs, the HF hub cache, registered names ===
def test_our_preset_dir_round_trip(tmp_path, bert_vocab):
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    kb.presets.save_backbone(backbone, str(tmp_path), tokenizer=tokenizer)
    again = kb.models.BertBackbone.from_preset(str(tmp_path))
    x = _ids()
    np.testing.assert_allclose(to_numpy(again(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)
    tok = kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    assert tok(["Hello world"]).to_list() == tokenizer(["Hello world"]).to_list()


def test_preset_paths_as_pathlib_and_home(tmp_path, bert_vocab, monkeypatch):
    """`from_preset` and `save_to_preset` take a `pathlib.Path` (from_preset refused one) and
    expand "~" (save_to_preset("~/x") made a directory named "~" in the working directory;
    from_preset("~/x") looked for an HF hub model)."""
    import pathlib

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=(
        kb.preprocessing.finetuning.TextClassifierPreprocessor(
            kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True), 8)))
    clf.save_to_preset("~/task")
    backbone.save_to_preset(pathlib.Path("~/backbone").expanduser())
    assert sorted(os.listdir(tmp_path / "home")) == ["backbone", "task"]
    assert not os.path.exists(tmp_path / "~")
    x = _ids()
    for preset in ("~/task", tmp_path / "home" / "task", pathlib.Path("~/backbone")):
        again = kb.models.BertBackbone.from_preset(preset)
        np.testing.assert_allclose(to_numpy(again(x)["sequence_output"]),
                                   to_numpy(backbone(x)["sequence_output"]), atol=1e-6)
    assert kb.preprocessing.Tokenizer.from_preset(pathlib.Path("~/task")).vocabulary_size() == 30522
    kb.tasks.TextClassifier.from_preset(tmp_path / "home" / "task")
    with pytest.raises(TypeError, match=r"a name or a directory path \(str or pathlib.Path\), got 3"):
        kb.models.BertBackbone.from_preset(3)


def test_damaged_json_files_and_decoder_configs_are_refused_naming_the_file(tmp_path,
                                                                          hf_pretraining_dir):
    """A truncated, binary or non-object config.json / keras_bertfam.json is an error naming the
    file, not json's or the codec's bare error; an HF decoder's config (`is_decoder`,
    `add_cross_attention`: causal, cross-attending) is refused (it loaded as a bidirectional
    encoder, outputs off by ~3e-2)."""
    bad = str(tmp_path / "hf")
    shutil.copytree(hf_pretraining_dir, bad)
    config_file = os.path.join(bad, "config.json")
    config = open(config_file).read()
    for content, match in ((config[:40], "not a readable JSON file"),
                           (b"\xff\xfe\x00binary", "not a readable JSON file"),
                           ("[1, 2]", "holds a JSON list")):
        with open(config_file, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(checkpoints.CheckpointError, match=match) as e:
            kb.models.BertBackbone.from_preset(bad)
        assert "config.json" in str(e.value)
    for key in ("is_decoder", "add_cross_attention"):
        with open(config_file, "w") as f:
            json.dump(dict(json.loads(config), **{key: True}), f)
        with pytest.raises(checkpoints.CheckpointError, match=f"a decoder's config.*{key}"):
            kb.models.BertBackbone.from_preset(bad)
    ours = str(tmp_path / "ours")
    kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16,
                           intermediate_dim=32).save_to_preset(ours)
    manifest = os.path.join(ours, "keras_bertfam.json")
    with open(manifest, "w") as f:
        f.write('{"format_version": 1, "fam')
    with pytest.raises(checkpoints.CheckpointError, match="keras_bertfam.json.*not a readable"):
        kb.models.BertBackbone.from_preset(ours)


def test_a_preset_without_checksums_is_checked_finite(tmp_path):
    """A preset directory saved before checksums existed (its manifest has no "files") loaded
    NaN weights silently: its weights are checked finite, as HF's and keras-hub's are (a
    weights file that records its tensors' digests names the tensor changed; one saved before
    it did, as those presets' were, is checked finite)."""
    import h5py

    from keras_bertfam.models import weights_files

    path = str(tmp_path / "legacy")
    kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16,
                           intermediate_dim=32).save_to_preset(path)
    manifest = os.path.join(path, "keras_bertfam.json")
    with open(manifest) as f:
        config = json.load(f)
    del config["files"]
    with open(manifest, "w") as f:
        json.dump(config, f)
    kb.models.BertBackbone.from_preset(path)  # finite: loads
    with h5py.File(os.path.join(path, "backbone.weights.h5"), "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        names = [n for n in names if "/vars/" in n]
        f[names[-1]][...] = np.nan
    with pytest.raises(checkpoints.CheckpointError, match=r"backbone.weights.h5.*damaged: the "
                       rf"bytes of 1 tensor\(s\) changed after it was saved: \['{names[-1]}'\]"):
        kb.models.BertBackbone.from_preset(path)
    with h5py.File(os.path.join(path, "backbone.weights.h5"), "r+") as f:
        del f[weights_files.RECORD_PATH]
    with pytest.raises(checkpoints.CheckpointError, match=r"backbone.weights.h5.*non-finite"):
        kb.models.BertBackbone.from_preset(path)


def test_a_task_preset_reloaded_with_another_num_classes_gets_a_new_head(tmp_path, bert_vocab):
    """keras-hub's `from_preset(..., num_classes=)` on a fine-tuned task builds a new head; ours
    said the task weights file was "corrupt or saved from another config". Now the head is new,
    with a warning naming the saved and given values, and the backbone is the preset's."""
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    pre = kb.preprocessing.finetuning.TextClassifierPreprocessor(
        kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True), 8)
    kb.tasks.TextClassifier(backbone, num_classes=3, preprocessor=pre).save_to_preset(
        str(tmp_path / "clf"))
    same = kb.tasks.TextClassifier.from_preset(str(tmp_path / "clf"))
    assert same.num_classes == 3
    with pytest.warns(UserWarning, match=r"saved with \{'num_classes': 3\}; with "
                      r"\{'num_classes': 5\}.*the head is new"):
        other = kb.tasks.TextClassifier.from_preset(str(tmp_path / "clf"), num_classes=5)
    assert other.num_classes == 5
    x = _ids()
    np.testing.assert_allclose(to_numpy(other.backbone(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


def test_overriding_a_setting_the_weights_were_trained_with_warns(tmp_path, bert_vocab,
                                                                  hf_pretraining_dir):
    """`from_preset(preset, activation="relu")` on weights trained under GELU loaded them under
    ReLU silently (as keras-hub's and HF's do): a setting that changes what the weights compute,
    overridden while loading them, is said, naming the key, the preset's value and the
    override; training settings (dropout) and loads without weights are not."""
    import warnings

    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    pre = kb.preprocessing.finetuning.TextClassifierPreprocessor(
        kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True), 8)
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre,
                            hidden_activation="gelu").save_to_preset(str(tmp_path / "clf"))
    backbone.save_to_preset(str(tmp_path / "backbone"))
    message = (r"{!r} was saved with {}={!r}; loading its weights with {}={!r} computes "
               r"something else than they were trained for")
    for preset in (str(tmp_path / "backbone"), hf_pretraining_dir):
        with pytest.warns(UserWarning, match=re.escape(message.format(
                preset, "activation", "gelu", "activation", "relu"))) as caught:
            kb.models.BertBackbone.from_preset(preset, activation="relu",
                                               layer_norm_epsilon=1e-12)
        # At the from_preset line, through keras_bertfam and Keras' from_preset machinery.
        assert {w.filename for w in caught if "activation=" in str(w.message)} == {__file__}
    with pytest.warns(UserWarning, match=re.escape(message.format(
            str(tmp_path / "clf"), "hidden_activation", "gelu", "hidden_activation", "relu"))):
        kb.tasks.TextClassifier.from_preset(str(tmp_path / "clf"), hidden_activation="relu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kb.models.BertBackbone.from_preset(str(tmp_path / "backbone"), dropout=0.3)
        kb.models.BertBackbone.from_preset(str(tmp_path / "backbone"), activation="relu",
                                           load_weights=False)
        kb.tasks.TextClassifier.from_preset(str(tmp_path / "clf"), dropout=0.5)


def test_convert_warns_on_an_override_of_a_setting_the_weights_were_trained_with(
        hf_pretraining_dir):
    """`kb.presets.convert(hf_dir, activation="relu")` loaded GELU-trained weights under ReLU
    silently where `from_preset` warns: it warns alike, at the caller's line."""
    import warnings

    with pytest.warns(UserWarning, match=re.escape(
            f"{hf_pretraining_dir!r} was saved with activation='gelu'; loading its weights with "
            f"activation='relu' computes something else")) as caught:
        kb.presets.convert(hf_pretraining_dir, activation="relu")
    assert [w.filename for w in caught if "activation=" in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kb.presets.convert(hf_pretraining_dir, dropout=0.3)
        kb.presets.convert(hf_pretraining_dir, activation="relu", load_weights=False)


def test_a_preset_reloads_the_tokenizer_it_was_saved_with(tmp_path, bert_vocab):
    """A preset rebuilds its tokenizer from the class and options it was saved with: a WordPiece
    vocabulary on an XLNet backbone, XLNet's SentencePiece on a BERT one (both failed to load:
    the family's own tokenizer was looked for), and options the family's maker used to drop
    (`strip_accents=False` reloaded as True: other ids, silently; special tokens)."""
    import random

    rng = random.Random(0)
    words = ("the quick brown fox jumps over lazy dog while seven wizards quietly box jugs of "
             "liquid café naïve").split()
    docs = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(200)]
    spiece = str(tmp_path / "xlnet.model")
    kb.preprocessing.train_xlnet_sentencepiece_model(docs, 50, output_file=spiece)
    small = dict(num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32)
    cases = {
        "xlnet+wordpiece": (lambda v: kb.models.XLNetBackbone(v, **small),
                            lambda: kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True,
                                                                        strip_accents=False)),
        "bert+xlnet_sentencepiece": (
            lambda v: kb.models.BertBackbone(v, max_sequence_length=32, **small),
            lambda: kb.preprocessing.XLNetTokenizer(spiece, lowercase=True)),
        "bert+wordpiece_accents_kept": (
            lambda v: kb.models.BertBackbone(v, max_sequence_length=32, **small),
            lambda: kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True,
                                                        strip_accents=False)),
    }
    text = ["The naïve café fox."]
    for name, (backbone, tokenizer) in cases.items():
        tokenizer = tokenizer()
        task = kb.tasks.TextClassifier(backbone(tokenizer.vocabulary_size()), num_classes=2,
                                       preprocessor=kb.preprocessing.TextClassifierPreprocessor(
                                           tokenizer, 16))
        task.save_to_preset(str(tmp_path / name))
        again = kb.tasks.TextClassifier.from_preset(str(tmp_path / name))
        loaded = again.preprocessor.tokenizer
        assert type(loaded) is type(tokenizer), name
        unnamed = lambda t: {k: v for k, v in t.get_config().items() if k != "name"}  # noqa: E731
        assert unnamed(loaded) == unnamed(tokenizer), name
        np.testing.assert_array_equal(to_numpy(again.preprocessor(text)["token_ids"]),
                                      to_numpy(task.preprocessor(text)["token_ids"]), err_msg=name)
        if name == "xlnet+wordpiece":  # HF's XLNet tokenizer files cannot hold a WordPiece one
            with pytest.raises(ValueError, match="writes xlnet's HF tokenizer files, from a "
                                                 "XLNetTokenizer; this TextClassifier has a "
                                                 "WordPieceTokenizer"):
                kb.presets.export_to_transformers(again, str(tmp_path / "hf"))
    # the accent is kept: "café" is not "cafe" (the family's maker used to strip it on reload)
    kept = kb.presets.load_tokenizer(str(tmp_path / "bert+wordpiece_accents_kept"))
    assert kept(["café"]).to_list() != kb.preprocessing.WordPieceTokenizer(
        bert_vocab, lowercase=True)(["café"]).to_list()


def test_keras_hub_preset_dir(tmp_path, bert_vocab):
    import keras_hub

    kh = keras_hub.models.BertBackbone(vocabulary_size=30522, num_layers=2, num_heads=2,
                                       hidden_dim=16, intermediate_dim=32, max_sequence_length=32)
    for w in kh.weights:  # non-trivial LayerNorm and bias values
        w.assign(np.random.default_rng(len(w.path)).normal(0, 0.2, w.shape).astype("float32") +
                 (1.0 if w.path.endswith("gamma") else 0.0))
    kh.save_to_preset(str(tmp_path))
    keras_hub.models.BertTokenizer(vocabulary=bert_vocab, lowercase=True).save_to_preset(
        str(tmp_path))
    assert os.path.exists(tmp_path / "metadata.json")
    ours = kb.models.BertBackbone.from_preset(str(tmp_path))
    x = _ids()
    theirs = kh(x)
    out = ours(x)
    assert _max_diff_on_tokens(to_numpy(out["sequence_output"]), to_numpy(
        theirs["sequence_output"]), x["padding_mask"]) <= 1e-4
    np.testing.assert_allclose(to_numpy(out["pooled_output"]), to_numpy(theirs["pooled_output"]),
                               atol=1e-4)
    tok = kb.preprocessing.Tokenizer.from_preset(str(tmp_path))
    reference = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    text = ["Does BERT know Snuffleupagus?"]
    assert tok.bert_lowercase and tok(text).to_list() == reference(text).to_list()
    clf = kb.tasks.TextClassifier.from_preset(str(tmp_path), num_classes=2, sequence_length=8)
    assert clf.predict(["a keras-hub preset"], verbose=0).shape == (1, 2)


def _tiny_preset_of(kind, path, bert_vocab, hf_dir):
    """A tiny BERT preset directory of each source: ours, keras-hub's, HF's."""
    sizes = dict(vocabulary_size=30522, num_layers=1, num_heads=2, hidden_dim=16,
                 intermediate_dim=32, max_sequence_length=16)
    if kind == "ours":
        kb.presets.save_backbone(kb.models.BertBackbone(**sizes), path,
                                 tokenizer=kb.preprocessing.WordPieceTokenizer(bert_vocab))
    elif kind == "keras_hub":
        import keras_hub

        keras_hub.models.BertBackbone(**sizes).save_to_preset(path)
        keras_hub.models.BertTokenizer(vocabulary=bert_vocab).save_to_preset(path)
    else:
        return hf_dir
    return path


@pytest.mark.parametrize("kind", ["ours", "keras_hub", "hf"])
def test_a_bad_argument_fails_before_any_weights_are_read(tmp_path, monkeypatch, bert_vocab,
                                                          hf_pretraining_dir, kind):
    """A bad preprocessor or task argument of `from_preset` is refused, with its own message,
    before the preset's weights are read (a typo cost a whole load first)."""
    import h5py

    where = _tiny_preset_of(kind, str(tmp_path), bert_vocab, hf_pretraining_dir)

    def reads_weights(*args, **kwargs):
        raise AssertionError("weights read before the arguments were checked")

    def verify(root, recorded, names, _verify=integrity.verify):  # the checksum reads them too
        if any(name.endswith(".h5") for name in names):
            reads_weights()
        return _verify(root, recorded, names)

    for reader in ((h5py, "File", reads_weights), (checkpoints, "load_state_dict", reads_weights),
                   (integrity, "verify", verify)):
        monkeypatch.setattr(*reader)
    for kwargs, message in (
            ({"pad_to_multiple_of": 0}, "pad_to_multiple_of must be a positive int or 'auto', "
                                        "got 0"),
            ({"num_clases": 3}, r"TextClassifier got unexpected keyword argument\(s\) "
                                r"\['num_clases'\]"),
            ({"num_classes": 0}, "num_classes must be a positive int, got 0")):
        with pytest.raises((ValueError, TypeError), match=message):
            kb.tasks.TextClassifier.from_preset(where, sequence_length=8, **kwargs)
    with pytest.raises(Exception, match="weights read before"):  # good ones: the weights read
        kb.tasks.TextClassifier.from_preset(where, sequence_length=8)


def _fake_hub_cache(root, repo_id, model_dir, revision="0123456789abcdef"):
    """huggingface_hub's cache layout: models--org--name/{refs/main, snapshots/<rev>/...}."""
    repo = os.path.join(root, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", revision)
    shutil.copytree(model_dir, snapshot)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(revision)
    return snapshot


def test_hf_hub_id_from_the_local_cache(tmp_path, monkeypatch, hf_pretraining_dir):
    import transformers

    cache = str(tmp_path / "hub")
    _fake_hub_cache(cache, "someorg/tiny-bert", hf_pretraining_dir)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backbone = kb.models.BertBackbone.from_preset("someorg/tiny-bert")
    hf = transformers.BertModel.from_pretrained(hf_pretraining_dir).eval()
    x = _ids()
    ref = _hf_sequence(hf, x).last_hidden_state.numpy()
    assert _max_diff_on_tokens(to_numpy(backbone(x)["sequence_output"]), ref,
                               x["padding_mask"]) <= 1e-4
    tok = kb.preprocessing.Tokenizer.from_preset("hf://someorg/tiny-bert")
    assert tok(["hello"]).to_list() == [[7592]]
    # not cached and not asked to download: a clear error, no network
    with pytest.raises(FileNotFoundError, match="download=True"):
        kb.models.BertBackbone.from_preset("someorg/not-cached")
    # HF_HOME works too
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    _fake_hub_cache(str(tmp_path / "home" / "hub"), "other/tiny", hf_pretraining_dir)
    assert kb.presets.load_backbone("other/tiny").num_layers == 2


def test_registered_name_resolves_through_the_cache(tmp_path, monkeypatch):
    import transformers

    preset = kb.presets.get("bert_tiny_en_uncased")
    model_dir = str(tmp_path / "model")
    transformers.BertModel(transformers.BertConfig(
        vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512)).save_pretrained(model_dir)
    cache = str(tmp_path / "hub")
    _fake_hub_cache(cache, preset.hf_id, model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    loaded = kb.models.BertBackbone.from_preset("bert_tiny_en_uncased")
    state = checkpoints.load_state_dict(model_dir)
    np.testing.assert_array_equal(to_numpy(loaded.token_embedding.embeddings),
                                  state["embeddings.word_embeddings.weight"])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="load_weights=False"):
        kb.models.BertBackbone.from_preset("bert_tiny_en_uncased")
    assert kb.models.BertBackbone.from_preset("bert_tiny_en_uncased",
                                              load_weights=False).num_params() == preset.params


# === HF heads and export ===
def test_convert_task_bert_pretraining_heads(hf_pretraining_dir):
    import transformers

    hf = transformers.BertForPreTraining.from_pretrained(hf_pretraining_dir).eval()
    task = kb.presets.convert_task(hf_pretraining_dir, kb.tasks.BertPretrainer, preprocessor=None)
    x = _ids()
    positions = np.array([[1, 2, 4], [0, 3, 4]])
    out = task(dict(x, mask_positions=positions))
    ref = _hf_sequence(hf, x)
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[:, :, None], axis=1)
    assert np.abs(to_numpy(out["mlm_logits"]) - ref_mlm).max() <= 1e-4
    assert np.abs(to_numpy(out["pair_logits"]) - ref.seq_relationship_logits.numpy()).max() <= 1e-4
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"lacks 2 weight\(s\) the MultipleChoice head needs, e\.g\. "
                             r"\['classifier\.weight', 'classifier\.bias'\]; .* is a "
                             r"BertForPreTraining checkpoint; MultipleChoice loads its heads "
                             r"from BertForMultipleChoice"):
        kb.presets.convert_task(hf_pretraining_dir, kb.tasks.MultipleChoice, preprocessor=None)


def test_export_to_transformers_round_trip(tmp_path, bert_vocab):
    import transformers

    keras.utils.set_random_seed(3)
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=2, num_heads=4,
                                      hidden_dim=32, intermediate_dim=64, max_sequence_length=64)
    for w in backbone.weights:  # perturb LayerNorms and biases away from 1 / 0
        w.assign(to_numpy(w) + np.random.default_rng(len(w.path)).normal(0, 0.05, w.shape))
    kb.presets.export_to_transformers(backbone, str(tmp_path / "bert"))
    hf = transformers.BertModel.from_pretrained(str(tmp_path / "bert")).eval()
    x = _ids()
    ref = _hf_sequence(hf, x)
    ours = backbone(x)
    assert _max_diff_on_tokens(to_numpy(ours["sequence_output"]), ref.last_hidden_state.numpy(),
                               x["padding_mask"]) <= 1e-4
    assert np.abs(to_numpy(ours["pooled_output"]) - ref.pooler_output.numpy()).max() <= 1e-4
    back = kb.presets.convert(str(tmp_path / "bert"))
    for a, b in zip(back.weights, backbone.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-7)

    # a task with its head and tokenizer -> BertForSequenceClassification
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    from keras_bertfam.preprocessing.finetuning import TextClassifierPreprocessor

    clf = kb.tasks.TextClassifier(backbone, num_classes=3,
                                  preprocessor=TextClassifierPreprocessor(tokenizer, 16))
    kb.presets.export_to_transformers(clf, str(tmp_path / "clf"))
    hf_clf = transformers.BertForSequenceClassification.from_pretrained(
        str(tmp_path / "clf")).eval()
    np.testing.assert_allclose(_hf_sequence(hf_clf, x).logits.numpy(),
                               to_numpy(clf.predict(x, verbose=0)) if False else to_numpy(
                                   clf(x, training=False)), atol=1e-4)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "clf"))
    assert hf_tok("Café, naïve!")["input_ids"][1:-1] == tokenizer(["Café, naïve!"]).to_list()[0]
    again = kb.presets.convert_task(str(tmp_path / "clf"), kb.tasks.TextClassifier,
                                    preprocessor=None)
    assert again.num_classes == 3
    np.testing.assert_allclose(to_numpy(again(x, training=False)), to_numpy(clf(x, training=False)),
                               atol=1e-6)


# === The real MiniLM ===
def test_all_minilm_l6_v2_equals_sentence_transformers(minilm_dir):
    unblock_imports()  # sentence-transformers imports scikit-learn
    st = importlib.import_module("sentence_transformers")
    model = st.SentenceTransformer(minilm_dir, device="cpu")
    sentences = ["A man is eating food.", "Café au lait, naïve résumé!", "short",
                 "A much longer sentence about the weather in Zürich " * 4]
    ref = model.encode(sentences, convert_to_numpy=True)
    encoder = kb.tasks.SentenceEncoder.from_preset("all_minilm_l6_v2")
    ours = encoder.encode(sentences)
    assert ours.shape == (4, 384)
    assert np.abs(ours - ref).max() <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)


# === Bad input ===
def test_checkpoint_shapes_not_matching_config(tmp_path, hf_pretraining_dir):
    bad = str(tmp_path / "bad")
    shutil.copytree(hf_pretraining_dir, bad)
    with open(os.path.join(bad, "config.json")) as f:
        config = json.load(f)
    config["intermediate_size"] = 48
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(checkpoints.CheckpointError, match=r"Shape mismatch for encoder\.layer\.0"
                       r"\.intermediate\.dense\.weight.*\(64, 32\).*\(32, 48\)"):
        kb.presets.convert(bad)


def test_missing_vocab_file(tmp_path, hf_pretraining_dir):
    bad = str(tmp_path / "novocab")
    shutil.copytree(hf_pretraining_dir, bad)
    os.remove(os.path.join(bad, "vocab.txt"))
    with pytest.raises(FileNotFoundError, match="has no vocab.txt"):
        kb.preprocessing.Tokenizer.from_preset(bad)
    ours = str(tmp_path / "ours")
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32)
    kb.presets.save_backbone(backbone, ours, tokenizer=kb.preprocessing.Tokenizer.from_preset(
        hf_pretraining_dir))
    for name in os.listdir(os.path.join(ours, "assets", "tokenizer")):
        os.remove(os.path.join(ours, "assets", "tokenizer", name))
    with pytest.raises(FileNotFoundError, match="no vocabulary file|vocabulary.txt. is missing"):
        kb.preprocessing.Tokenizer.from_preset(ours)


def test_preset_dir_of_another_family(tmp_path, hf_pretraining_dir):
    other = [spec for name, spec in kb.presets.FAMILIES.items() if name != "bert"]
    assert other, "another family is registered"
    backbone = kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32)
    backbone.save_to_preset(str(tmp_path))
    with pytest.raises(ValueError, match="is a 'bert' preset"):
        other[0].backbone_cls.from_preset(str(tmp_path))
    with pytest.raises(ValueError, match="is a 'bert' preset"):
        other[0].backbone_cls.from_preset(hf_pretraining_dir)


def test_corrupt_weights_files(tmp_path, hf_pretraining_dir):
    bad = str(tmp_path / "corrupt_hf")
    shutil.copytree(hf_pretraining_dir, bad)
    path = os.path.join(bad, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(checkpoints.CheckpointError, match="corrupt"):
        kb.presets.convert(bad)
    ours = str(tmp_path / "corrupt_ours")
    kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16,
                           intermediate_dim=32).save_to_preset(ours)
    with open(os.path.join(ours, "backbone.weights.h5"), "wb") as f:
        f.write(b"not an h5 file")
    with pytest.raises(checkpoints.CheckpointError, match="corrupt"):
        kb.models.BertBackbone.from_preset(ours)


# === HF directories saved by transformers 5 (tokenizer.json only) ===
TOKENIZER_TEXTS = ["Héllo, World! naïve café", "the quick brown fox jumps.", "  two  spaces"]


def _hf_ids(hf_tokenizer, texts):
    return [hf_tokenizer(t)["input_ids"] for t in texts]


def _our_ids(preprocessor, texts):
    """The packed ids the preprocessor gives, without padding."""
    out = preprocessor(texts)
    out = out[0] if isinstance(out, tuple) else out
    ids, mask = to_numpy(out["token_ids"]), to_numpy(out["padding_mask"]).astype(bool)
    return [row[keep].tolist() for row, keep in zip(ids, mask)]


@pytest.mark.parametrize("options", [dict(do_lower_case=True),
                                     dict(do_lower_case=False, strip_accents=True)])
def test_hf_bert_dir_with_only_tokenizer_json(tmp_path, hf_pretraining_dir, bert_vocab, options):
    """transformers 5's `save_pretrained` of a BERT tokenizer writes tokenizer.json and
    tokenizer_config.json, no vocab.txt: the vocabulary and normalization come from those."""
    import transformers

    path = str(tmp_path / "hf")
    shutil.copytree(hf_pretraining_dir, path)
    os.remove(os.path.join(path, "vocab.txt"))
    transformers.BertTokenizerFast(bert_vocab, **options).save_pretrained(path)
    assert "tokenizer.json" in os.listdir(path) and "vocab.txt" not in os.listdir(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    hf_ids = _hf_ids(hf_tok, TOKENIZER_TEXTS)
    assert tokenizer(TOKENIZER_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    task = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert _our_ids(task.preprocessor, TOKENIZER_TEXTS) == hf_ids
    # tokenizer_config.json's options win over tokenizer.json's normalizer, as in transformers 5
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.update(do_lower_case=not options["do_lower_case"], strip_accents=None)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    hf_ids = [i[1:-1] for i in _hf_ids(transformers.AutoTokenizer.from_pretrained(path),
                                       TOKENIZER_TEXTS)]
    assert kb.preprocessing.Tokenizer.from_preset(path)(TOKENIZER_TEXTS).to_list() == hf_ids
    hf = transformers.BertModel.from_pretrained(path).eval()
    x = _ids()
    ours = kb.models.BertBackbone.from_preset(path)(x)
    assert _max_diff_on_tokens(to_numpy(ours["sequence_output"]),
                               _hf_sequence(hf, x).last_hidden_state.numpy(),
                               x["padding_mask"]) <= 1e-4


@pytest.fixture(scope="module")
def byte_pair_files(tmp_path_factory):
    import random

    words = "the quick brown fox jumps over lazy dog while seven wizards box jugs".split()
    rng = random.Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(200)]
    root = tmp_path_factory.mktemp("bpe")
    kb.preprocessing.train_byte_pair_vocabulary(docs, 300, output_dir=str(root))
    return str(root / "vocab.json"), str(root / "merges.txt")


def _tiny_roberta_dir(path, **config):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(**dict(dict(
        vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=34), **config))
    hf = transformers.RobertaModel(cfg).eval()
    hf.save_pretrained(path)
    return hf


def _roberta_ids():
    x = _ids(length=9)
    x["token_ids"] = x["token_ids"] % 295 + 5
    x["token_ids"][:, 0] = 0
    x["token_ids"][x["padding_mask"] == 0] = 1
    return x


@pytest.mark.parametrize("add_prefix_space,merges_as", [(False, "pairs"), (True, "strings")])
def test_hf_roberta_dir_with_only_tokenizer_json(tmp_path, byte_pair_files, add_prefix_space,
                                                 merges_as):
    """A byte-level BPE tokenizer.json: `model.vocab` and `model.merges` (pairs [a, b] from
    tokenizers >= 0.20, "a b" strings before), add_prefix_space from tokenizer_config.json."""
    import torch
    import transformers

    path = str(tmp_path / "hf")
    hf = _tiny_roberta_dir(path, type_vocab_size=1)
    transformers.RobertaTokenizerFast(*byte_pair_files, add_prefix_space=add_prefix_space
                                      ).save_pretrained(path)
    assert not {"vocab.json", "merges.txt"} & set(os.listdir(path))
    if merges_as == "strings":
        with open(os.path.join(path, "tokenizer.json")) as f:
            spec = json.load(f)
        spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                   for m in spec["model"]["merges"]]
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            json.dump(spec, f)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    assert tokenizer.add_prefix_space == add_prefix_space
    hf_ids = _hf_ids(hf_tok, TOKENIZER_TEXTS)
    assert tokenizer(TOKENIZER_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    task = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert _our_ids(task.preprocessor, TOKENIZER_TEXTS) == hf_ids
    x = _roberta_ids()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x["token_ids"]).long(),
                 attention_mask=torch.tensor(x["padding_mask"]).long()).last_hidden_state
    ours = kb.models.RobertaBackbone.from_preset(path)(x)
    assert _max_diff_on_tokens(to_numpy(ours["sequence_output"]), ref.numpy(),
                               x["padding_mask"]) <= 1e-4


def test_hf_sentencepiece_dir_without_spiece_model_names_the_file(tmp_path):
    import transformers

    path = str(tmp_path / "hf")
    transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=100, embedding_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32)).save_pretrained(path)
    with pytest.raises(FileNotFoundError, match="spiece.model.*tokenizer.json"):
        kb.preprocessing.Tokenizer.from_preset(path)


# Texts with added tokens ("NewWord" by `add_tokens`, "<ENT>" by `add_special_tokens`): inside
# words, in other cases, next to each other, around spaces; no special token of a role typed
# in a text (README: read as pieces, unlike HF).
ADDED_TOKEN_TEXTS = TOKENIZER_TEXTS + [
    "the NewWord newword xNEWWORDy fox_x <ENT> box", "NewWord<ENT>fox_xfox_x", "  <ENT>  ",
    "<ent> Ñewword", "", "ZZQ zzq"]


def _wordpiece_vocab(path):
    """A WordPiece vocabulary whose special tokens are not BERT's names."""
    words = "the quick brown fox jumps hello world two spaces".split()
    vocab = (["<pad>", "<unk>", "<cls>", "<sep>", "<msk>", "[CLS]"]
             + list("abcdefghijklmnopqrstuvwxyz.,!_")
             + words + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"])
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    return path


def test_hf_bert_tokenizer_json_special_and_added_tokens(tmp_path):
    """tokenizer.json's special tokens by their own names, and its added tokens (beyond the
    vocabulary, never split, "NewWord" matched lowercased as HF normalizes it), were ignored:
    packing used [CLS]/[SEP] (here an ordinary token) and added tokens came out as pieces."""
    import transformers

    path = str(tmp_path / "hf")
    vocab = _wordpiece_vocab(str(tmp_path / "vocab.txt"))
    hf_tok = transformers.BertTokenizerFast(vocab, cls_token="<cls>", sep_token="<sep>",
                                            pad_token="<pad>", mask_token="<msk>",
                                            unk_token="<unk>")
    hf_tok.add_tokens(["NewWord", "fox_x"])
    hf_tok.add_special_tokens({"additional_special_tokens": ["zzq", "<ENT>"]})
    transformers.BertModel(transformers.BertConfig(**dict(TINY_HF, vocab_size=len(hf_tok)))
                           ).save_pretrained(path)
    hf_tok.save_pretrained(path)
    assert "vocab.txt" not in os.listdir(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    assert [getattr(tokenizer, f"{r}_token_id") for r in ("cls", "sep", "pad", "mask", "unk")] \
        == [2, 3, 0, 4, 1]
    assert tokenizer.vocabulary_size() == len(hf_tok)
    hf_ids = _hf_ids(hf_tok, ADDED_TOKEN_TEXTS)
    assert tokenizer(ADDED_TOKEN_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    task = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert _our_ids(task.preprocessor, ADDED_TOKEN_TEXTS) == hf_ids
    # the tokenizer's config rebuilds it (a saved preset's)
    again = kb.preprocessing.WordPieceTokenizer.from_config(tokenizer.get_config())
    again.set_vocabulary(tokenizer.get_vocabulary())
    assert again(ADDED_TOKEN_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    # what it cannot apply is refused, naming the token and the file
    with open(os.path.join(path, "tokenizer.json")) as f:
        spec = json.load(f)
    spec["added_tokens"][-1]["single_word"] = True
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with pytest.raises(ValueError, match="tokenizer.json.*'<ENT>'.*single_word"):
        kb.preprocessing.Tokenizer.from_preset(path)
    spec["added_tokens"][-1].update(single_word=False, id=80)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with pytest.raises(ValueError, match="tokenizer.json.*'<ENT>', 80"):
        kb.preprocessing.Tokenizer.from_preset(path)


def test_hf_roberta_tokenizer_json_added_tokens(tmp_path, byte_pair_files):
    import transformers

    path = str(tmp_path / "hf")
    _tiny_roberta_dir(path, vocab_size=304)
    hf_tok = transformers.RobertaTokenizerFast(*byte_pair_files, add_prefix_space=True)
    hf_tok.add_tokens(["NewWord", "fox_x"])
    hf_tok.add_special_tokens({"additional_special_tokens": ["<ENT>"]})
    hf_tok.save_pretrained(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    assert tokenizer.vocabulary_size() == len(hf_tok)
    hf_ids = _hf_ids(hf_tok, ADDED_TOKEN_TEXTS)
    assert tokenizer(ADDED_TOKEN_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    task = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert _our_ids(task.preprocessor, ADDED_TOKEN_TEXTS) == hf_ids
    hf_tok.add_tokens([transformers.AddedToken("Zq", lstrip=True)])
    hf_tok.save_pretrained(path)
    with pytest.raises(ValueError, match="tokenizer.json.*'Zq'.*lstrip"):
        kb.preprocessing.Tokenizer.from_preset(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    hf_tok.add_tokens([" spaced"])
    hf_tok.save_pretrained(path)
    with open(os.path.join(path, "tokenizer.json")) as f:
        spec = json.load(f)
    next(e for e in spec["added_tokens"] if e["content"] == "Zq")["lstrip"] = False
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with pytest.raises(ValueError, match="tokenizer.json.*' spaced'.*contain a space"):
        kb.preprocessing.Tokenizer.from_preset(path)
    with pytest.raises(ValueError, match="' spaced'"):
        kb.preprocessing.BytePairTokenizer(*byte_pair_files, added_tokens=[" spaced"])


@pytest.fixture(scope="module")
def albert_spiece(tmp_path_factory):
    import io
    import random

    import sentencepiece

    words = "the quick brown fox jumps over lazy dog while seven wizards box jugs café".split()
    rng = random.Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(200)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(docs), model_writer=model, vocab_size=120, hard_vocab_limit=False,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        minloglevel=2)
    path = tmp_path_factory.mktemp("albert_spm") / "spiece.model"
    path.write_bytes(model.getvalue())
    return str(path)


UNIGRAM_TEXTS = TOKENIZER_TEXTS + ["THE ``Quick'' brown FOX", "tabs\tand\nnew lines ",
                                   "naïve café ½ ﬁ Ⅻ", "x\u3000y\u00a0z ÀÉÎõü", ""]


@pytest.mark.parametrize("config", [{}, dict(do_lower_case=False, keep_accents=True)])
def test_hf_albert_dir_with_only_tokenizer_json(tmp_path, albert_spiece, config):
    """transformers 5 saves an ALBERT tokenizer as tokenizer.json (a Unigram model) without
    spiece.model, which was refused: it converts back to a SentencePiece model proto."""
    import torch
    import transformers

    spm_dir, path = str(tmp_path / "spm"), str(tmp_path / "hf")
    os.makedirs(spm_dir)
    shutil.copy(albert_spiece, spm_dir)
    torch.manual_seed(0)
    hf = transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=120, embedding_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, max_position_embeddings=34)).eval()
    hf.save_pretrained(path)
    transformers.AlbertTokenizer.from_pretrained(spm_dir).save_pretrained(path)
    assert "tokenizer.json" in os.listdir(path) and "spiece.model" not in os.listdir(path)
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_config, **config), f)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    assert isinstance(tokenizer, kb.preprocessing.SentencePieceTokenizer)
    hf_ids = _hf_ids(hf_tok, UNIGRAM_TEXTS)
    assert tokenizer(UNIGRAM_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    # the spiece.model it came from, with the same options, gives the same ids
    same = kb.preprocessing.SentencePieceTokenizer(
        albert_spiece, lowercase=config.get("do_lower_case", True),
        keep_accents=config.get("keep_accents", False))
    assert same(UNIGRAM_TEXTS).to_list() == [i[1:-1] for i in hf_ids]
    task = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert _our_ids(task.preprocessor, UNIGRAM_TEXTS) == hf_ids
    x = _ids()
    x["token_ids"] = x["token_ids"] % 115 + 5
    ours = kb.models.AlbertBackbone.from_preset(path)(x)
    assert _max_diff_on_tokens(to_numpy(ours["sequence_output"]),
                               _hf_sequence(hf, x).last_hidden_state.numpy(),
                               x["padding_mask"]) <= 1e-4


def test_hf_albert_tokenizer_json_special_tokens_added_by_the_user(tmp_path, albert_spiece):
    """`add_special_tokens({"additional_special_tokens": [...]})` of pieces of the model, saved
    by transformers 5 (tokenizer.json alone): HF reads each such token whole. Ours made every
    special added token without a role a control piece, never read from a text: other ids
    than HF's ("the fox" [▁the ▁fox] vs HF's pieces of "▁fox" spelt out), and than the same
    directory with spiece.model beside it gives. A special added token with a score of its own
    (a normal piece; SentencePiece gives control pieces 0) is read whole now; the model's
    control pieces ([CLS], ...) stay control pieces."""
    import sentencepiece
    import transformers

    spm_dir, path = tmp_path / "spm", tmp_path / "hf"
    spm_dir.mkdir()
    shutil.copy(albert_spiece, spm_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=albert_spiece)
    added = [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
             if p in ("▁fox", "▁lazy")]
    assert len(added) == 2
    hf_tok = transformers.AlbertTokenizer.from_pretrained(str(spm_dir))
    hf_tok.add_special_tokens({"additional_special_tokens": added})
    hf_tok.save_pretrained(str(path))
    assert "spiece.model" not in os.listdir(path)
    transformers.AlbertConfig(vocab_size=sp.get_piece_size(), embedding_size=8, hidden_size=16,
                              num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32).save_pretrained(str(path))
    texts = ["the quick fox", "afoxb fox,lazy", "foxlazy the lazy dog", "  fox  ", "FOX lazy.",
             "[CLS] the [MASK] fox", "", "café fox"]
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    hf_ids = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    ours = kb.preprocessing.Tokenizer.from_preset(str(path))
    # [CLS] and [MASK] written in a text: split into pieces (README; HF reads their ids)
    assert ours(texts[:5] + texts[6:]).to_list() == hf_ids[:5] + hf_ids[6:]
    shutil.copy(albert_spiece, path)  # the same directory with spiece.model: the same ids
    assert kb.preprocessing.Tokenizer.from_preset(str(path))(texts).to_list() == \
        ours(texts).to_list()


def test_hf_xlnet_dir_with_only_tokenizer_json(tmp_path):
    """XLNet's Unigram tokenizer.json (cased, no Lowercase step) converts too: its control pieces
    and its user-defined "<eop>" (a non-special added token) as in the spiece.model it came from,
    which gives the same ids; HF's on text without "<eop>"."""
    import transformers

    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    spm_dir, path = tmp_path / "spm", str(tmp_path / "hf")
    spm_dir.mkdir()
    lines = [f"The film number {i} was great and the plot was dull {i % 7}, café."
             for i in range(300)]
    train_xlnet_sentencepiece_model(lines * 3, 60, output_file=str(spm_dir / "spiece.model"))
    transformers.XLNetModel(transformers.XLNetConfig(vocab_size=60, d_model=16, n_layer=1,
                                                     n_head=2, d_inner=32)).save_pretrained(path)
    transformers.XLNetTokenizer.from_pretrained(str(spm_dir)).save_pretrained(path)
    assert "spiece.model" not in os.listdir(path)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(path)
    assert isinstance(tokenizer, kb.preprocessing.XLNetTokenizer) and not tokenizer.lowercase
    same = kb.preprocessing.XLNetTokenizer(str(spm_dir / "spiece.model"))
    texts = UNIGRAM_TEXTS + ["a <eop> b<eop>", "The FILM number 12 was"]
    assert tokenizer(texts).to_list() == same(texts).to_list()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    assert tokenizer(UNIGRAM_TEXTS).to_list() == [
        hf_tok(t, add_special_tokens=False)["input_ids"] for t in UNIGRAM_TEXTS]


@pytest.mark.parametrize("files", ["tokenizer.json", "spiece.model"])
def test_hf_xlnet_dir_with_keep_accents_gives_hfs_ids(tmp_path, files):
    """transformers 5's XLNetTokenizer (what AutoTokenizer and XLNetTokenizer.from_pretrained
    both return) builds NFKD + StripAccents whatever tokenizer_config.json's `keep_accents`
    (and over tokenizer.json's own normalizer); ours kept the accents such a directory asks to
    keep (as the original preprocess_text and transformers 4 did): other ids than HF's on
    accented text, silently. Now HF's, with a warning naming the ignored setting."""
    import shutil

    import transformers

    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    spm_dir, path = tmp_path / "spm", tmp_path / "hf"
    spm_dir.mkdir()
    lines = [f"The film number {i} was great, café naïve résumé {i % 7}." for i in range(300)]
    train_xlnet_sentencepiece_model(lines * 3, 60, output_file=str(spm_dir / "spiece.model"))
    transformers.XLNetConfig(vocab_size=60, d_model=16, n_layer=1, n_head=2,
                             d_inner=32).save_pretrained(path)
    transformers.XLNetTokenizer.from_pretrained(str(spm_dir)).save_pretrained(path)
    if files == "spiece.model":  # the original's files: no tokenizer.json
        os.remove(path / "tokenizer.json")
        shutil.copy(spm_dir / "spiece.model", path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(dict(config, keep_accents=True)))
    texts = ["café naïve résumé", "Crème brûlée à la ÀÉÎõü", "plain text"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path))
    hf_ids = [hf_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    with pytest.warns(UserWarning, match=r"keep_accents=True, which transformers 5's "
                                         r"XLNetTokenizer ignores: it strips accents"):
        tokenizer = kb.preprocessing.Tokenizer.from_preset(str(path))
    assert tokenizer(texts).to_list() == hf_ids
    assert not tokenizer.keep_accents
    if files == "spiece.model":  # the other way: a tokenizer keeping accents, exported
        kept = kb.preprocessing.XLNetTokenizer(str(spm_dir / "spiece.model"), keep_accents=True)
        assert kept(texts).to_list() != hf_ids
        with pytest.warns(UserWarning, match=r"keeps accents \(keep_accents=True\).*"
                                             r"transformers 5's XLNetTokenizer ignores it"):
            kb.presets.export_to_transformers(kb.models.XLNetBackbone(60, 1, 2, 16, 32),
                                              str(tmp_path / "out"), tokenizer=kept)
        exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
        assert [exported(t, add_special_tokens=False)["input_ids"] for t in texts] == hf_ids


def _hf_albert_dir(path, spiece):
    """A one-layer random HF ALBERT saved at `path` with the slow tokenizer of `spiece` (its save
    writes tokenizer.json beside spiece.model) -> that HF tokenizer."""
    import transformers

    spm_dir = path + "_spm"
    os.makedirs(spm_dir)
    shutil.copy(spiece, spm_dir)
    transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=121, embedding_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32)).save_pretrained(path)
    hf_tok = transformers.AlbertTokenizer.from_pretrained(spm_dir)
    hf_tok.save_pretrained(path)
    return hf_tok


def test_hf_unigram_tokenizer_json_that_does_not_convert_is_refused(tmp_path, albert_spiece):
    """What the SentencePiece tokenizer cannot do as HF's does is refused naming it and the
    file: another normalizer, byte fallback, a token added beyond the vocabulary."""
    path = str(tmp_path / "hf")
    hf_tok = _hf_albert_dir(path, albert_spiece)
    json_path = os.path.join(path, "tokenizer.json")
    with open(json_path) as f:
        spec = json.load(f)

    def refused(match, **changes):
        with open(json_path, "w") as f:
            json.dump(dict(spec, **changes), f)
        with pytest.raises(ValueError, match=match):
            kb.preprocessing.Tokenizer.from_preset(path)

    refused("tokenizer.json.*NFKC", normalizer={"type": "NFKC"})
    refused("tokenizer.json.*byte_fallback", model=dict(spec["model"], byte_fallback=True))
    refused("tokenizer.json.*Whitespace", pre_tokenizer={"type": "Whitespace"})
    hf_tok.add_tokens(["NewWord"])
    hf_tok.save_pretrained(path)
    with open(json_path) as f:
        spec = json.load(f)
    refused("tokenizer.json.*'NewWord'.*beyond")


def test_hf_added_tokens_the_tokenizer_does_not_read_are_refused(tmp_path, hf_pretraining_dir,
                                                                 byte_pair_files, albert_spiece):
    """A slow tokenizer's save (vocab.txt / vocab.json + merges.txt / spiece.model, no
    tokenizer.json) keeps added tokens in added_tokens.json or tokenizer_config.json's
    "added_tokens_decoder"; a SentencePiece directory's tokenizer.json is not read. They loaded
    silently without them: now refused, naming the file and the tokens."""
    bert = str(tmp_path / "bert")
    shutil.copytree(hf_pretraining_dir, bert)
    with open(os.path.join(bert, "added_tokens.json"), "w") as f:
        json.dump({"newword": 30522}, f)
    with pytest.raises(ValueError, match="added_tokens.json.*'newword'.*vocab.txt"):
        kb.preprocessing.Tokenizer.from_preset(bert)
    os.remove(os.path.join(bert, "added_tokens.json"))
    with open(os.path.join(bert, "tokenizer_config.json"), "w") as f:
        json.dump({"added_tokens_decoder": {
            "103": {"content": "[MASK]", "special": True},
            "30522": {"content": "<ENT>", "special": True}}}, f)
    with pytest.raises(ValueError, match="tokenizer_config.json.*'<ENT>'"):
        kb.preprocessing.Tokenizer.from_preset(bert)
    roberta = str(tmp_path / "roberta")
    _tiny_roberta_dir(roberta)
    for name in byte_pair_files:
        shutil.copy(name, roberta)
    with open(os.path.join(roberta, "added_tokens.json"), "w") as f:
        json.dump({"NewWord": 300}, f)
    with pytest.raises(ValueError, match="added_tokens.json.*'NewWord'.*vocab.json"):
        kb.preprocessing.Tokenizer.from_preset(roberta)
    albert = str(tmp_path / "albert")
    hf_tok = _hf_albert_dir(albert, albert_spiece)
    hf_tok.add_tokens(["NewWord"])
    hf_tok.save_pretrained(albert)
    shutil.copy(albert_spiece, albert)
    with pytest.raises(ValueError, match="tokenizer.json.*'NewWord'.*spiece.model"):
        kb.preprocessing.Tokenizer.from_preset(albert)


def test_hf_roberta_config_default_two_token_types(tmp_path):
    """HF's `RobertaConfig()` has type_vocab_size=2 (roberta-base: 1). RobertaModel adds row 0
    (token_type_ids default to zeros; RobertaTokenizer gives none), which is what ours reads."""
    import torch
    import transformers

    path = str(tmp_path / "hf")
    hf = _tiny_roberta_dir(path)
    assert hf.config.type_vocab_size == 2
    x = _roberta_ids()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x["token_ids"]).long(),
                 attention_mask=torch.tensor(x["padding_mask"]).long())
    backbone = kb.models.RobertaBackbone.from_preset(path)
    np.testing.assert_array_equal(to_numpy(backbone.embeddings.segment_embedding.embeddings),
                                  hf.embeddings.token_type_embeddings.weight[:1].detach().numpy())
    ours = backbone(x)
    assert _max_diff_on_tokens(to_numpy(ours["sequence_output"]), ref.last_hidden_state.numpy(),
                               x["padding_mask"]) <= 1e-4
    assert np.abs(to_numpy(ours["pooled_output"]) - ref.pooler_output.numpy()).max() <= 1e-4


def _tiny_classifier():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "film"]
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    backbone = kb.models.BertBackbone(len(vocab), 1, 2, 16, 32, max_sequence_length=16)
    return kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=(
        kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=8)))


def _logits_kernel(path):
    return to_numpy(kb.tasks.TextClassifier.from_preset(path).head.kernel)


_SAVE_STEPS = {"backbone_weights": (kb.models.BertBackbone, "save_weights"),
               "tokenizer": (kb.presets, "save_tokenizer"),
               "task_weights": (kb.tasks.TextClassifier, "save_weights"),
               "checksums": (kb.presets.integrity, "checksums"),
               "manifest": (json, "dump")}


@pytest.mark.parametrize("point", [*_SAVE_STEPS, "first rename", "second rename"])
def test_a_save_to_preset_stopped_midway_leaves_the_previous_preset(tmp_path, monkeypatch,
                                                                     point):
    """A rewrite that fails (or is interrupted) at any of its writes leaves the previous preset
    whole and loadable, and the files beside it that are not the preset's. It removed the old
    manifest first and left a directory no loader would take (since session 48 a preset is
    written beside the old one and renamed over it, `atomic.replace_dir`). Stopped between
    the two renames, the load names where the previous preset is."""
    task = _tiny_classifier()
    path = str(tmp_path / "preset")
    task.save_to_preset(path)
    (tmp_path / "preset" / "README.md").write_text("model card")
    before = _logits_kernel(path)
    task.head.kernel.assign(before + 1.0)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt(point)

    if point in _SAVE_STEPS:
        monkeypatch.setattr(*_SAVE_STEPS[point], stop)
    else:
        renames, rename = [], os.rename

        def counted(a, b):  # the first, or the second, rename of replace_dir does not happen
            renames.append(a)
            if len(renames) == {"first rename": 1, "second rename": 2}[point]:
                stop()
            rename(a, b)

        monkeypatch.setattr(kb.atomic.os, "rename", counted)
    with pytest.raises(KeyboardInterrupt):
        task.save_to_preset(path)
    monkeypatch.undo()
    if point == "second rename":  # the old one is renamed aside, the new one not yet in place
        (old,) = [str(p) for p in tmp_path.iterdir() if p.name.startswith("tmp-old-preset.")]
        with pytest.raises(FileNotFoundError, match=r"interrupted, and the previous preset is "
                                                    r"whole at '.*tmp-old-preset\.\d+'"):
            kb.tasks.TextClassifier.from_preset(path)
        os.rename(old, path)  # what the message says to do
    np.testing.assert_array_equal(_logits_kernel(path), before)
    assert (tmp_path / "preset" / "README.md").read_text() == "model card"
    task.save_to_preset(path)  # saving again replaces it, and keeps the other files
    np.testing.assert_array_equal(_logits_kernel(path), before + 1.0)
    assert (tmp_path / "preset" / "README.md").read_text() == "model card"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preset"], list(tmp_path.iterdir())


def test_a_first_save_to_preset_stopped_midway_leaves_no_directory(tmp_path, monkeypatch):
    """A first save stopped at its last write: nothing at the path (not a directory of files
    without a manifest), nothing beside it."""
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        _tiny_classifier().save_to_preset(str(tmp_path / "preset"))
    assert list(tmp_path.iterdir()) == []


def test_weights_without_a_manifest_are_named_as_an_unfinished_save(tmp_path):
    """A directory with our weights files but no manifest (copied by hand, or written by a
    version that saved in place): the load names the missing manifest."""
    path = str(tmp_path / "preset")
    _tiny_classifier().save_to_preset(path)
    os.remove(os.path.join(path, "keras_bertfam.json"))
    for load in (kb.models.BertBackbone.from_preset, kb.tasks.TextClassifier.from_preset,
                 kb.preprocessing.Tokenizer.from_preset):
        with pytest.raises(ValueError, match=r"holds backbone.weights.h5.* but no "
                                             r"keras_bertfam.json: a save_to_preset that did "
                                             r"not finish"):
            load(path)


def test_convert_and_save_to_preset_refuse_paths_by_name(tmp_path):
    """convert(None) was os.path's TypeError; a registered name or one of our preset
    directories "has no config.json"; save_to_preset onto a file os.makedirs' "[Errno 17]"."""
    ours = str(tmp_path / "ours")
    _tiny_classifier().backbone.save_to_preset(ours)
    (tmp_path / "notes.txt").write_text("keep")
    for path, error, message in [
            (None, TypeError, r"convert's path \(an HF-format model directory\) .* got None"),
            (3, TypeError, r"convert's path .* got 3"),
            (str(tmp_path / "missing"), FileNotFoundError,
             r"missing'\): no such directory; expected an HF-format model directory"),
            ("bert_tiny_en_uncased", FileNotFoundError,
             r"Load a registered name with its backbone's from_preset "
             r"\(kb.models.BertBackbone.from_preset\)"),
            (ours, ValueError, r"ours'\): a keras_bertfam preset directory; expected an "
                               r"HF-format model directory")]:
        with pytest.raises(error, match=message):
            kb.presets.convert(path)
    with pytest.raises(FileExistsError, match=r"notes.txt'\): that path is a file; expected a "
                                              r"directory"):
        _tiny_classifier().save_to_preset(str(tmp_path / "notes.txt"))
    assert (tmp_path / "notes.txt").read_text() == "keep"
