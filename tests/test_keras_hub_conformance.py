"""keras-hub conformance: keras-hub 0.32's own docstring examples and keras.io guide snippets for
every task, preprocessor, tokenizer and preprocessing layer that has a counterpart here, changed
only in class names (keras-hub's `BertTextClassifier` is our `TextClassifier` on a
`BertBackbone`, ...), preset names (the offline `bert_tiny_en_uncased` for `bert_base_en_uncased`),
`load_weights=False` and tiny configs where a docstring builds a big model.

Where we deliberately differ (README, "Differences from keras-hub"), the test asserts our
documented behaviour and says so. The second half holds the regressions of issue 12: each failed
on a keras-hub user's ordinary pattern.
"""
import io
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
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
# keras-hub's docstrings build 4 x 256 backbones; the same calls on a tiny one.
TINY = dict(num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
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


def test_bert_tokenizer_docstring():
    tokenizer = kb.preprocessing.Tokenizer.from_preset(PRESET)
    single = tokenizer("The quick brown fox jumped.")
    batch = tokenizer(["The quick brown fox jumped.", "The fox slept."])
    # Difference: TF tensors (a RaggedTensor for a batch), not Python lists.
    assert isinstance(single, tf.Tensor) and single.shape.rank == 1
    assert isinstance(batch, tf.RaggedTensor) and batch.shape[0] == 2
    assert to_numpy(single).tolist() == batch[0].numpy().tolist()
    text = tokenizer.detokenize(tokenizer("The quick brown fox jumped."))
    assert "quick brown fox" in (text.numpy().decode() if hasattr(text, "numpy") else text)
    custom = kb.preprocessing.WordPieceTokenizer(vocabulary=WORDPIECE_VOCAB)
    assert to_numpy(custom("The quick brown fox jumped.")).tolist() == [5, 6, 7, 8, 9, 10]


def test_roberta_tokenizer_docstring_vocabulary_without_unk():
    # keras-hub's custom RoBERTa vocabulary has no <unk>: byte-level BPE never needs it.
    tokenizer = kb.preprocessing.BytePairTokenizer(vocabulary=BPE_VOCAB, merges=BPE_MERGES)
    assert tokenizer(["a quick fox", "a fox quick"]).to_list() == [[4, 5, 6], [4, 6, 5]]
    assert tokenizer.unk_token_id is None and tokenizer.mask_token_id == 3


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
    for out in (dense, ragged):  # keras-hub's dtypes in tf.data
        assert out["token_ids"].dtype == tf.int32
        assert out["mask_positions"].dtype == tf.int64
        assert out["mask_ids"].dtype == tf.int32
        assert out["mask_weights"].dtype == tf.float32
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
