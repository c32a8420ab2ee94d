"""The `>>>` examples in the docstrings of layers/ and models/ run and print what they say, on
every backend (outputs are written backend-neutrally: tuples of shapes, not TensorShape reprs)."""
import doctest
import importlib

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.multibackend

MODULES = [
    "keras_bertfam.layers.attention",
    "keras_bertfam.layers.embeddings",
    "keras_bertfam.layers.encoder",
    "keras_bertfam.layers.heads",
    "keras_bertfam.layers.longformer_attention",
    "keras_bertfam.layers.relative_attention",
    "keras_bertfam.models.albert",
    "keras_bertfam.models.backbone",
    "keras_bertfam.models.bert",
    "keras_bertfam.models.distil_bert",
    "keras_bertfam.models.electra",
    "keras_bertfam.models.longformer",
    "keras_bertfam.models.roberta",
    "keras_bertfam.models.spanbert",
    "keras_bertfam.models.xlnet",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    extraglobs = {"keras": keras, "ops": keras.ops, "np": np}
    tests = doctest.DocTestFinder().find(module, name, extraglobs=extraglobs)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0, f"{name} has no >>> examples"
    assert results.failed == 0, "".join(report)
