"""RoBERTa: HF parity, parameter counts, byte-level BPE tokenizer parity, raw-text MLM fit()."""
import inspect
import os

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from keras_bertfam.models import backbone as backbone_module
from tests.conftest import default_corpus_documents, to_numpy, without_unused_imports

TINY = dict(vocabulary_size=120, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
            max_sequence_length=30)


def _inputs(vocab=120, batch=3, length=12, seed=0):
    """Right-padded RoBERTa inputs: <s>=0 first, <pad>=1 after the text."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, vocab, (batch, length)).astype("int32")
    ids[:, 0] = 0
    mask = np.ones_like(ids)
    mask[1, length // 2:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 1
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def _hf_config(**overrides):
    import transformers

    cfg = dict(vocab_size=120, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32, type_vocab_size=1,
               layer_norm_eps=1e-5, pad_token_id=1)
    cfg.update(overrides)
    return transformers.RobertaConfig(**cfg)


@pytest.mark.multibackend
def test_parity_with_random_hf_roberta(tmp_path):
    import torch
    import transformers

    transformers.RobertaModel(_hf_config()).save_pretrained(tmp_path)
    ours = kb.models.RobertaBackbone.from_preset(str(tmp_path))
    assert isinstance(ours, kb.models.RobertaBackbone)
    assert ours.max_sequence_length == 30 and ours.embeddings.position_embedding.input_dim == 32
    hf = transformers.RobertaModel.from_pretrained(tmp_path).eval()
    x = _inputs()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(x["padding_mask"]))
    got = ours(x)
    valid = x["padding_mask"].astype(bool)
    diff = np.abs(to_numpy(got["sequence_output"]) - ref.last_hidden_state.numpy())[valid].max()
    assert diff <= 1e-4, diff
    assert np.abs(to_numpy(got["pooled_output"]) - ref.pooler_output.numpy()).max() <= 1e-4
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


def test_hf_config_checks(tmp_path):
    import transformers

    # (two token types load their row 0: test_presets' test_hf_roberta_config_default_...)
    transformers.RobertaModel(_hf_config(hidden_act="relu")).save_pretrained(tmp_path)
    with pytest.raises(kb.presets.checkpoints.CheckpointError, match="is not RoBERTa's GELU"):
        kb.presets.convert(str(tmp_path))


def _hf_param_count(config):
    import torch
    import transformers

    with torch.device("meta"):
        hf = transformers.RobertaModel(transformers.RobertaConfig(
            vocab_size=config["vocabulary_size"], hidden_size=config["hidden_dim"],
            num_hidden_layers=config["num_layers"], num_attention_heads=config["num_heads"],
            intermediate_size=config["intermediate_dim"],
            max_position_embeddings=config["max_sequence_length"] + 2, type_vocab_size=1))
    return sum(p.numel() for p in hf.parameters())


# TensorFlow only: a count is weight shapes, the same on every backend (JAX built the 355M
# model in 7-8 s).
@pytest.mark.parametrize("name,paper", [("roberta_base_en", 125), ("roberta_large_en", 355)])
def test_preset_param_counts_equal_hf(name, paper, monkeypatch):
    # Zero initialization only makes building the 355M model fast; the count does not depend on it.
    monkeypatch.setattr(backbone_module, "bert_initializer",
                        lambda stddev=0.02: keras.initializers.Zeros())
    preset = kb.presets.get(name)
    backbone = kb.models.RobertaBackbone.from_preset(name, load_weights=False)
    assert backbone.num_params() == _hf_param_count(preset.config) == preset.params
    assert round(preset.params / 1e6) == paper
    assert backbone.embeddings.position_embedding.input_dim == 514


@pytest.mark.multibackend
def test_config_round_trip_and_saving(tmp_path):
    backbone = kb.models.RobertaBackbone(**TINY)
    config = backbone.get_config()
    params = set(inspect.signature(kb.models.RobertaBackbone.__init__).parameters) - {
        "self", "kwargs"}
    assert params <= set(config)
    again = kb.models.RobertaBackbone.from_config(config)
    assert again.get_config() == config
    x = _inputs()
    path = os.path.join(tmp_path, "b.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)
    backbone.save_to_preset(str(tmp_path / "preset"))
    restored = kb.models.RobertaBackbone.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(to_numpy(restored(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


# === Byte-level BPE ===


@pytest.fixture(scope="module")
def imdb():
    """The default corpus' first 21,060 documents (bytes), read once
    (`= list(default_corpus().take(21060).as_numpy_iterator())`, without its per-document
    pipeline: conftest's `default_corpus_documents`)."""
    return list(default_corpus_documents(0, 21060))


@pytest.fixture(scope="module")
def imdb_sentences(imdb):
    """The sentences of documents 20,000-20,249 (held out from the BPE training documents)."""
    from keras_bertfam.preprocessing import corpus

    docs = np.array(imdb[20000:20250])
    return [s.decode() for s in corpus.split_sentences(docs).flat_values.numpy()]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory, imdb):
    out = str(tmp_path_factory.mktemp("bpe"))
    kb.preprocessing.train_byte_pair_vocabulary(imdb[:1500], 3000, output_dir=out)
    return out


def test_trained_bpe_vocabulary(bpe_dir):
    import json

    with open(os.path.join(bpe_dir, "vocab.json")) as f:
        vocab = json.load(f)
    assert len(vocab) == 3000
    assert [vocab[t] for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] == [0, 1, 2, 3, 4]
    tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe_dir, "vocab.json"),
                                             os.path.join(bpe_dir, "merges.txt"))
    assert (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id,
            tok.unk_token_id) == (0, 2, 1, 4, 3)
    # Without RoBERTa's special tokens (keras-hub's BytePairTokenizer example): it tokenizes,
    # packing names the missing ones; a token named explicitly must be in the vocabulary.
    bare = kb.preprocessing.BytePairTokenizer({"a": 0, "b": 1, "ab": 2}, ["a b"])
    assert to_numpy(bare("ab")).tolist() == [2] and bare.cls_token_id is None
    with pytest.raises(ValueError, match="needs a cls token and a sep token and a pad token"):
        kb.preprocessing.TextClassifierPreprocessor(bare)(["ab"])
    with pytest.raises(ValueError, match="lacks the special token"):
        kb.preprocessing.BytePairTokenizer({"a": 0, "b": 1}, ["a b"], pad_token="[PAD]")


def test_bpe_ids_equal_hf_roberta_tokenizer(bpe_dir, imdb_sentences):
    import transformers

    sentences = imdb_sentences + ["Hello  world", " leading space", "tabs\tand\nnewlines ", "café naïve 😀",
                  "it's we'll I'd", "1,000,000.5", "<s> special </s> <mask>"]
    assert len(sentences) > 2000
    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    hf = transformers.RobertaTokenizer(vocab, merges)
    ours = kb.preprocessing.BytePairTokenizer(vocab, merges)(sentences).to_list()
    expected = [hf(s, add_special_tokens=False)["input_ids"] for s in sentences]
    mismatches = [s for s, a, b in zip(sentences, ours, expected) if a != b]
    assert not mismatches, mismatches[:3]


def test_bpe_tokenize_merges_each_distinct_word_once_in_a_small_graph(bpe_dir, monkeypatch):
    """The cached `tokenize` (tf.data's path): only a batch's distinct unseen words go through
    keras-hub's merge loop (keras-hub merged every occurrence), the cache serves them after, and
    its graph is small (keras-hub's pre-split alone built 2,081 ops). The ids are HF's
    (test_bpe_ids_equal_hf_roberta_tokenizer)."""
    import tensorflow as tf

    tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe_dir, "vocab.json"),
                                             os.path.join(bpe_dir, "merges.txt"))
    merged = tf.Variable(0)
    original = kb.preprocessing.BytePairTokenizer._bpe_merge_and_update_cache_tf

    def counting(self, words):
        merged.assign_add(tf.size(words))
        return original(self, words)

    monkeypatch.setattr(kb.preprocessing.BytePairTokenizer, "_bpe_merge_and_update_cache_tf",
                        counting)
    tokenize = tf.function(tok.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    graph = tokenize.get_concrete_function().graph
    assert len(graph.get_operations()) < 600, len(graph.get_operations())
    texts = ["the the the cat <mask>", "the cat", ""]
    words = [w for w in tok.split_and_merge(texts)[0].flat_values.numpy().tolist()
             if w != b"<mask>"]
    assert len(words) == 7 and len(set(words)) == 4  # "the", " the", " cat", " "
    ids = tokenize(tf.constant(texts)).to_list()
    assert int(merged.numpy()) == 4
    assert tokenize(tf.constant(texts)).to_list() == ids and int(merged.numpy()) == 4  # cached
    assert ids[1] == ids[0][:1] + ids[0][3:4] and ids[0][-1] == tok.mask_token_id and not ids[2]


def test_bpe_tokenizer_from_hf_dir_and_preset(bpe_dir, tmp_path):
    import shutil

    import transformers

    model_dir = str(tmp_path / "hf")
    transformers.RobertaModel(_hf_config(vocab_size=3000)).save_pretrained(model_dir)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(bpe_dir, name), model_dir)
    tok = kb.preprocessing.Tokenizer.from_preset(model_dir)
    assert isinstance(tok, kb.preprocessing.BytePairTokenizer)
    task = kb.tasks.MaskedLM.from_preset(model_dir, sequence_length=16)
    task.save_to_preset(str(tmp_path / "ours"))
    again = kb.preprocessing.Tokenizer.from_preset(str(tmp_path / "ours"))
    text = ["A byte-level BPE round trip."]
    assert again(text).to_list() == tok(text).to_list()


def test_roberta_masked_lm_fit_on_raw_text(bpe_dir, imdb):
    tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe_dir, "vocab.json"),
                                             os.path.join(bpe_dir, "merges.txt"))
    backbone = kb.models.RobertaBackbone(tok.vocabulary_size(), 1, 2, 32, 64,  # one layer
                                         max_sequence_length=64)
    preprocessor = kb.preprocessing.MaskedLMPreprocessor(tok, 64, packing="full_sentences",
                                                         batch_size=16, seed=1)
    mlm = kb.tasks.MaskedLM(backbone, preprocessor=preprocessor)
    mlm.compile(learning_rate=2e-3)
    texts = [t.decode() for t in imdb[:16]]
    x, y, w = next(iter(preprocessor.prepare(texts)))
    assert x["token_ids"].shape[1] == 64 and int(x["token_ids"][0, 0]) == tok.cls_token_id
    history = mlm.fit(texts, epochs=4, verbose=0)
    losses = history.history["mlm_loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


# === Export (byte-level BPE in the serving graph) ===
BPE_TEXTS = ["Café naïve résumé, Zoë façade déjà-vu", "東京大学 日本語のテキスト 中文", "emoji 😀🎉 👍🏽 ok",
             "", "  spaces\tand\nnewlines ", "<s> the </s> <mask> kept whole"]


def test_bpe_serving_tokenize_equals_hf_roberta_tokenizer(bpe_dir, imdb):
    """The export's stateless BPE (no MutableHashTable cache) gives HF's ids."""
    import tensorflow as tf
    import transformers

    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    tok = kb.preprocessing.BytePairTokenizer(vocab, merges)
    words = " ".join(t.decode() for t in imdb[21000:21060]).split()[:5000]
    assert len(words) == 5000
    texts = BPE_TEXTS + [" ".join(words)]
    serve = tf.function(tok.serving_tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    ours = serve(tf.constant(texts)).to_list()
    hf = transformers.RobertaTokenizer(vocab, merges)
    expected = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    for text, got, want in zip(texts, ours, expected):
        assert got == want, text[:60]
    assert ours[3] == [] and len(ours[-1]) > 5000
    assert ours == tok(texts).to_list()  # and keras-hub's cached path's


# A serving client's process (TensorFlow + tf-text only), started without the packages it does
# not use (conftest.without_unused_imports)
FRESH_BPE = without_unused_imports("jax") + r'''
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # registers the tf-text ops
jobs = json.load(open(sys.argv[1]))
for job in jobs:
    model = tf.saved_model.load(job["dir"])
    out = model.signatures["serving_default"](**{k: tf.constant(v) for k, v in job["inputs"].items()})
    np.savez(job["out"], **{k: v.numpy() for k, v in out.items()})
assert "keras_bertfam" not in sys.modules and "keras_hub" not in sys.modules
print("ok")
'''


def test_every_roberta_task_exports_with_bpe(bpe_dir, tmp_path, serving_process):
    """MaskedLM, TextClassifier, TokenClassifier and the bare backbone with its
    preprocessor (`keras-bertfam pretrain --family roberta`'s export) save, pass the strict
    TF 2.12.1 + tf-text 2.12.1 audit, and load in a fresh process (TensorFlow + tf-text only)
    with the in-process outputs."""
    import json

    import tensorflow as tf

    from keras_bertfam.preprocessing import finetuning as ft

    seq = 16
    tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe_dir, "vocab.json"),
                                             os.path.join(bpe_dir, "merges.txt"))
    special = {r: getattr(tok, f"{r}_token_id") for r in ("cls", "sep", "pad", "mask")}
    packer = kb.preprocessing.SegmentPacker(seq, start_value=special["cls"],
                                            end_value=special["sep"], pad_value=special["pad"])

    def packed(*segments):
        ids, segs, mask = packer(tuple(tok(s) for s in segments))
        return {"token_ids": tf.cast(ids, tf.int32), "segment_ids": tf.cast(segs, tf.int32),
                "padding_mask": tf.cast(mask, tf.int32)}

    def reference(task, features):
        inputs = task.serving_features(features, special)
        return {k: keras.ops.convert_to_numpy(v)
                for k, v in task.serving_outputs(inputs, task.serving_call(inputs)).items()}

    def roberta():  # one layer: the BPE tokenizer's graph is the point (test_export's reason)
        return kb.models.RobertaBackbone(tok.vocabulary_size(), 1, 2, 16, 32,
                                         max_sequence_length=32)

    texts = BPE_TEXTS[:4]
    masked = ["The <mask> was great", "東京 <mask>", "<mask>", ""]
    mlm_pre = kb.preprocessing.MaskedLMPreprocessor(tok, seq)
    mlm = kb.tasks.MaskedLM(roberta(), preprocessor=mlm_pre)
    # "<mask>" in the text is the mask token (kept whole by the tokenizer)
    clf = kb.tasks.TextClassifier(roberta(), num_classes=3,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, seq))
    tagger = kb.tasks.TokenClassifier(roberta(), num_classes=4,
                                      preprocessor=ft.TokenClassifierPreprocessor(tok, seq))
    bb = roberta()
    text_features, masked_features = packed(texts), packed(masked)  # tokenized once (eager BPE)
    bb_ref = {k: keras.ops.convert_to_numpy(v) for k, v in bb(text_features).items()}
    bb_ref["padding_mask"] = text_features["padding_mask"].numpy()
    mlm_ref = reference(mlm, masked_features)
    cases = [
        ("masked_lm", mlm, None, {"text": masked}, mlm_ref),
        ("text_classifier", clf, None, {"text": texts},
         {"logits": clf.predict(texts, verbose=0)}),
        # predict's own path (word by word, as TokenClassifierPreprocessor): the served
        # tagger once tokenized whole sentences, pieces that predict never sees
        ("token_classifier", tagger, None, {"text": texts},
         {"logits": tagger.predict(texts, verbose=0),
          "padding_mask": tagger.preprocessor(texts)["padding_mask"].numpy()}),
        ("backbone", bb, mlm_pre, {"text": texts}, bb_ref),
    ]
    assert mlm_ref["mask_weights"].sum(1).tolist() == [1, 1, 1, 0]
    jobs = []
    for name, model, preprocessor, inputs, ref in cases:
        path = str(tmp_path / name / "1")
        kb.export.export_saved_model(model, path, preprocessor=preprocessor)
        report = kb.export.audit_ops(path, tf_text="2.12.1")  # strict: ops and attrs
        assert "MutableHashTableV2" not in report["ops"] and "HashTableV2" in report["ops"]
        jobs.append({"dir": path, "inputs": inputs, "out": str(tmp_path / f"{name}.npz")})
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    proc = serving_process(FRESH_BPE, spec)  # a fresh process (conftest)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    for (name, _, _, _, ref), job in zip(cases, jobs):
        got = np.load(job["out"])
        for key, expected in ref.items():
            value = got[key]
            # dynamic padding: per-position outputs cover the batch's longest row
            expected = expected[tuple(slice(0, n) for n in value.shape)]
            np.testing.assert_allclose(value, expected, atol=1e-5, err_msg=f"{name}:{key}")


def test_token_classifier_words_are_hf_split_words(bpe_dir):
    """A TokenClassifier's words are tokenized one by one as HF's RoBERTa tokenizer does with
    `is_split_into_words=True` (which needs `add_prefix_space=True`): each word starts with `Ġ`,
    the first one too. Before, each word was tokenized as a text of its own, without `Ġ`: pieces
    a pretrained RoBERTa sees only inside words ("film" as "f", "ilm")."""
    import tensorflow as tf
    import transformers

    from keras_bertfam.preprocessing import finetuning as ft

    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    hf = transformers.RobertaTokenizerFast(vocab, merges, add_prefix_space=True)
    words = [["The", "film", "was", "great!"], ["Café", "naïve", "東京", "<mask>", "😀"], ["x"]]
    for prefix in (False, True):
        tok = kb.preprocessing.BytePairTokenizer(vocab, merges, add_prefix_space=prefix)
        rows = words
        got = ft.TokenClassifierPreprocessor(tok, 32)(tf.ragged.constant(rows))["token_ids"]
        for row, w in zip(got.numpy().tolist(), rows):
            expected = hf(w, is_split_into_words=True)["input_ids"]
            assert row == expected + [tok.pad_token_id] * (32 - len(expected)), (prefix, w)
    # sentences split on whitespace: the same as their words
    sentences = tf.constant([" ".join(w) for w in rows])
    assert (ft.TokenClassifierPreprocessor(tok, 32)(sentences)["token_ids"].numpy().tolist()
            == got.numpy().tolist())


def test_pairs_pack_as_hf_roberta_and_longformer_puts_global_attention_on_the_question(bpe_dir):
    """RoBERTa's pairs are `<s> A </s></s> B </s>` (HF's RobertaTokenizer): the fine-tuning
    preprocessors pack them so, and Longformer's QA global attention is HF's (every token before
    the first `</s>`)."""
    import torch
    import transformers
    from transformers.models.longformer import modeling_longformer

    from keras_bertfam.models.longformer import global_attention_for_task
    from keras_bertfam.preprocessing import finetuning as ft

    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    hf = transformers.RobertaTokenizer(vocab, merges)
    tok = kb.preprocessing.BytePairTokenizer(vocab, merges)
    questions = ["Who wrote the film?", "Was it good?"]
    contexts = ["The film was written by Ada, and it was good.", "It was not very good at all."]
    features = ft.TextClassifierPreprocessor(tok, 32)((questions, contexts))
    for row, q, c in zip(features["token_ids"].numpy(), questions, contexts):
        expected = hf(q, c)["input_ids"]
        assert row.tolist() == expected + [tok.pad_token_id] * (32 - len(expected))

    ours = global_attention_for_task(features, "QuestionAnswerer")
    theirs = modeling_longformer._compute_global_attention_mask(
        torch.tensor(features["token_ids"].numpy()), tok.sep_token_id).numpy()
    np.testing.assert_array_equal(np.asarray(ours), theirs.astype("int32"))


# === Question answering on byte-level BPE: character offsets, fit, answer, export ===
ODD_BPE_TEXTS = ["Hello  world", " leading space", "tabs\tand\nnewlines ", "x \t y", "x   ",
                 "  ", "\n\n\nx\r\n", "a <mask> b", "a<mask>b", "a  <mask>", "<s>x</s>",
                 "it's we'll I'd", "1,000,000.5", "👍🏽 ok", "e\u0301x Zoë", "a\u00a0b \u3000c",
                 "x \u2009 y", "東京大学"]


def test_bpe_offsets_equal_hf_roberta_fast_tokenizer(bpe_dir, imdb_sentences):
    """`tokenize_with_offsets` on byte-level BPE: the tokenizer's ids, and HF
    `RobertaTokenizerFast(trim_offsets=True)`'s offset mapping (what HF's QA pipelines read) on
    real sentences and odd text: a leading space is not in a token's span, a token of spaces is
    empty at its end, the byte pieces of one character (emoji, CJK, accents) span it whole,
    special tokens written in the text are spans of their own."""
    import tensorflow as tf
    import transformers

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    sentences = imdb_sentences
    texts = BPE_TEXTS + ODD_BPE_TEXTS + sentences
    assert len(sentences) > 3000
    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    tok = kb.preprocessing.BytePairTokenizer(vocab, merges)
    hf = transformers.RobertaTokenizerFast(vocab, merges, trim_offsets=True)
    ids, starts, ends = (t.to_list() for t in tokenize_with_offsets(tok, tf.constant(texts)))
    assert ids == tok(texts).to_list()
    for text, got_ids, got_starts, got_ends in zip(texts, ids, starts, ends):
        want = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert got_ids == want["input_ids"], text
        assert list(zip(got_starts, got_ends)) == [tuple(s) for s in want["offset_mapping"]], text
    # add_prefix_space: the added space is not in the text (texts where HF adds it too)
    tok = kb.preprocessing.BytePairTokenizer(vocab, merges, add_prefix_space=True)
    hf = transformers.RobertaTokenizerFast(vocab, merges, trim_offsets=True, add_prefix_space=True)
    texts = ["hello world", "😀 x", "Zoë"]
    ids, starts, ends = (t.to_list() for t in tokenize_with_offsets(tok, tf.constant(texts)))
    for text, got_ids, got_starts, got_ends in zip(texts, ids, starts, ends):
        want = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert got_ids == want["input_ids"]
        assert list(zip(got_starts, got_ends)) == [tuple(s) for s in want["offset_mapping"]], text


_FILLER = " ".join(f"Zoë met Ada {j} times in Zürich, café {j}." for j in range(3))
QA_BPE_CONTEXTS = [f"{_FILLER} The key is in 東京{i}, naïve 😀." for i in range(4)] + [
    f"Ada found the key in Zürich ({_FILLER}).", f"The key? In the box.\tThat's all. {_FILLER}"]
QA_BPE_ANSWERS = [f"東京{i}" for i in range(4)] + ["Zürich", "the box"]
QA_BPE_QUESTIONS = ["Where is the key?"] * len(QA_BPE_CONTEXTS)


@pytest.fixture(scope="module")
def roberta_qa(bpe_dir):
    """A tiny RobertaBackbone QuestionAnswerer on the trained BPE, fit 2 steps on raw text
    (contexts of 9-10 windows: 58 windows, two batches of 32)."""
    from keras_bertfam.preprocessing import finetuning as ft

    keras.utils.set_random_seed(0)
    tok = kb.preprocessing.BytePairTokenizer(os.path.join(bpe_dir, "vocab.json"),
                                             os.path.join(bpe_dir, "merges.txt"))
    qa = kb.tasks.QuestionAnswerer(
        kb.models.RobertaBackbone(tok.vocabulary_size(), 1, 2, 16, 32, max_sequence_length=64),
        preprocessor=ft.QuestionAnswererPreprocessor(tok, 32, stride=8, max_question_length=8))
    qa.compile()
    starts = [c.index(a) for c, a in zip(QA_BPE_CONTEXTS, QA_BPE_ANSWERS)]
    losses = []
    qa.fit((QA_BPE_QUESTIONS, QA_BPE_CONTEXTS), (starts, QA_BPE_ANSWERS), epochs=1, verbose=0,
           callbacks=[keras.callbacks.LambdaCallback(
               on_train_batch_end=lambda batch, logs: losses.append(logs["loss"]))])
    return qa, losses


def test_roberta_question_answerer_fits_and_answers_from_text(roberta_qa):
    """RoBERTa QA on raw strings: windows of `<s> q </s></s> window </s>` whose labels are the
    answer's tokens (decoding to the answer, at its character offsets) in the window holding it
    and `<s>` elsewhere; `fit` runs; `answer()`'s text is the context at its offsets."""
    import tensorflow as tf

    qa, losses = roberta_qa
    tok = qa.preprocessor.tokenizer
    assert len(losses) == 2 and np.isfinite(losses).all()
    starts = [c.index(a) for c, a in zip(QA_BPE_CONTEXTS, QA_BPE_ANSWERS)]
    x, y = qa.preprocessor((tf.constant(QA_BPE_QUESTIONS), tf.constant(QA_BPE_CONTEXTS)),
                           (tf.constant(starts), tf.constant(QA_BPE_ANSWERS)))
    _, meta = qa.preprocessor.windows(tf.constant(QA_BPE_QUESTIONS),
                                      tf.constant(QA_BPE_CONTEXTS))
    example = meta["example_index"].numpy()
    ids = x["token_ids"].numpy()
    s, e = y["start_positions"].numpy(), y["end_positions"].numpy()
    assert len(example) == 58 and (ids[:, 0] == tok.cls_token_id).all()
    labeled = np.flatnonzero(s > 0)
    # each answer is inside some window (overlapping windows may hold it more than once)
    assert sorted(set(example[labeled])) == list(range(len(QA_BPE_CONTEXTS)))
    for w in labeled:
        b = example[w]
        # labels as HF run_qa.py's: a CJK answer starts at the last byte-level piece of its
        # first character (every piece of a character spans all of it)
        assert QA_BPE_ANSWERS[b].endswith(tok.detokenize(ids[w, s[w]:e[w] + 1]).strip())
        assert meta["token_start"][w, s[w]] == starts[b]
        assert meta["token_end"][w, e[w]] == starts[b] + len(QA_BPE_ANSWERS[b])
    first_window = np.searchsorted(example, example[labeled])
    assert (labeled > first_window).sum() >= 4  # answers past each context's first window
    assert (e[s == 0] == 0).all()
    answers = qa.answer(QA_BPE_QUESTIONS, QA_BPE_CONTEXTS)
    for context, a in zip(QA_BPE_CONTEXTS, answers):
        assert 0 <= a["start"] < a["end"] and context[a["start"]:a["end"]] == a["text"]


def test_roberta_question_answerer_exports_with_answers(roberta_qa, tmp_path):
    """The SavedModel's string signature gives `answer()`'s answers (text and character
    offsets, over all windows), passes the TF 2.12.1 + tf-text 2.12.1 audit with no mutable
    table; its `token_ids` signature finds the context after the separators (RoBERTa's inputs
    have no segment ids)."""
    import tensorflow as tf

    from tests.test_export import served_and_answered

    qa, _ = roberta_qa
    tok = qa.preprocessor.tokenizer
    contexts = QA_BPE_CONTEXTS + ["", "Short 東京 😀."]
    questions = QA_BPE_QUESTIONS + ["Where?", "What is short?"]
    path = str(tmp_path / "qa" / "1")
    _, want = served_and_answered(qa, path, questions, contexts)
    report = kb.export.audit_ops(path, tf_text="2.12.1")
    assert not report["unsupported"] and "MutableHashTableV2" not in report["ops"]
    assert want[-2]["start"] == -1 and want[-1]["start"] >= 0
    features, meta = qa.preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    special = {"sep": tok.sep_token_id, "cls": tok.cls_token_id}
    served = qa.serving_features(features, special)
    np.testing.assert_array_equal(served["in_context"], meta["token_start"].numpy() >= 0)
    # each window's null score is read at its <s>, the first position
    np.testing.assert_array_equal(np.argmax(served["is_cls"], axis=1), 0)
    assert np.asarray(served["is_cls"]).sum(axis=1).tolist() == [1] * int(features["token_ids"].shape[0])
