"""Preset loading builds its model without drawing the initial values of the weights it loads
(`keras_bertfam.presets.deferred`): every weight the checkpoint sets has the checkpoint's
values, every other (a pooler the checkpoint lacks, a new task head, a weight a loader skips)
the values a model built with `load_weights=False` under the same seed has, and no variable
is left without a value. Sources: our preset dir, HF dirs (safetensors and pytorch_model.bin),
a keras-hub dir, HF task heads; and `LongformerBackbone.from_bert`, which copies a loaded
BERT into a new model."""
import os

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import to_numpy
from keras_bertfam.layers import utils
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.deferred import deferred_initialization

pytestmark = pytest.mark.multibackend

TINY = dict(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=16)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Our preset dir of a backbone; HF dirs of a MaskedLM (no pooler: HF's BertForMaskedLM
    has none) as safetensors and as pytorch_model.bin; and the source model's values."""
    root = tmp_path_factory.mktemp("deferred")
    keras.utils.set_random_seed(99)
    backbone = kb.models.BertBackbone(**TINY)
    task = kb.tasks.MaskedLM(backbone, preprocessor=None)
    for w in task.weights:  # no value left at its initialization (LayerNorm ones, zero biases)
        w.assign(np.random.default_rng(len(w.path)).normal(0, 1, w.shape).astype("float32"))
    out = {"ours": str(root / "ours"), "hf": str(root / "hf"), "bin": str(root / "bin")}
    kb.presets.save_backbone(backbone, out["ours"])
    kb.presets.export_to_transformers(task, out["hf"])
    os.makedirs(out["bin"])
    for name in os.listdir(out["hf"]):
        if name != "model.safetensors":
            os.link(os.path.join(out["hf"], name), os.path.join(out["bin"], name))
    import torch

    state = checkpoints.load_state_dict(out["hf"])
    torch.save({k: torch.from_numpy(v.copy()) for k, v in state.items()},
               os.path.join(out["bin"], "pytorch_model.bin"))
    out["backbone"] = [to_numpy(w) for w in backbone.weights]
    out["head"] = [to_numpy(w) for w in task.weights[len(backbone.weights):]]
    return out


def _load(load, seed=5):
    keras.utils.set_random_seed(seed)
    return load()


def _check(model, fresh, expected):
    """`model`'s values are `expected[i]` where given, else `fresh`'s; all are set."""
    assert len(model.weights) == len(fresh.weights) == len(expected)
    unset = [w.path for w in model.weights if getattr(w, "_value", 0) is None]
    assert not unset, f"variables left without a value: {unset}"
    if keras.backend.backend() == "torch":  # a copy, as an assignment's: not a transposed view
        assert all(w.value.is_contiguous() for w in model.weights)
    for w, f, want in zip(model.weights, fresh.weights, expected):
        want = to_numpy(f) if want is None else want
        np.testing.assert_array_equal(to_numpy(w), want, err_msg=w.path)


def _pooler_paths(backbone):
    return {id(w) for w in backbone.pooler_dense.weights}


@pytest.mark.parametrize("source", ["ours", "hf", "bin"])
def test_backbone_has_the_checkpoints_values_and_its_own_initial_ones(dirs, source):
    load = lambda **kw: kb.models.BertBackbone.from_preset(dirs[source], **kw)  # noqa: E731
    model = _load(load)
    fresh = _load(lambda: load(load_weights=False))
    pooler = _pooler_paths(model)
    expected = [None if source != "ours" and id(w) in pooler else v
                for w, v in zip(model.weights, dirs["backbone"])]
    _check(model, fresh, expected)


@pytest.mark.parametrize("source", ["ours", "hf"])
def test_a_new_task_head_has_the_values_it_has_without_loading(dirs, source):
    load = lambda **kw: kb.tasks.TextClassifier.from_preset(  # noqa: E731
        dirs[source], num_classes=3, preprocessor=None, **kw)
    model = _load(load)
    fresh = _load(lambda: load(load_weights=False))
    backbone = [None if source != "ours" and id(w) in _pooler_paths(model.backbone) else v
                for w, v in zip(model.backbone.weights, dirs["backbone"])]
    head = [None] * (len(model.weights) - len(backbone))
    _check(model, fresh, backbone + head)


def test_hf_task_heads_load_and_convert_task(dirs):
    for load in (lambda **kw: kb.tasks.MaskedLM.from_preset(dirs["hf"], preprocessor=None, **kw),
                 lambda **kw: kb.presets.convert_task(dirs["hf"], kb.tasks.MaskedLM,
                                                      preprocessor=None, **kw)):
        model = _load(load)
        fresh = _load(lambda: load(load_weights=False))
        pooler = _pooler_paths(model.backbone)
        expected = [None if id(w) in pooler else v
                    for w, v in zip(model.backbone.weights, dirs["backbone"])]
        _check(model, fresh, expected + dirs["head"])


def test_keras_hub_roberta_keeps_its_initial_pooler(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    kh = keras_hub.models.RobertaBackbone(vocabulary_size=60, num_layers=2, num_heads=2,
                                          hidden_dim=8, intermediate_dim=16,
                                          max_sequence_length=16)
    kh.save_to_preset(str(tmp_path))
    load = lambda **kw: kb.models.RobertaBackbone.from_preset(str(tmp_path), **kw)  # noqa: E731
    model = _load(load)
    fresh = _load(lambda: load(load_weights=False))
    loaded = {id(w) for w in model.weights} - _pooler_paths(model)
    # the pooler as without loading; the rest from keras-hub (checked against keras-hub's
    # outputs in test_keras_hub_presets): not the fresh model's values
    _check(model, fresh, [None if id(w) not in loaded else to_numpy(w) for w in model.weights])
    assert any(not np.array_equal(to_numpy(w), to_numpy(f))
               for w, f in zip(model.weights, fresh.weights) if id(w) in loaded)


def test_a_weight_a_loader_skips_has_its_initial_values(dirs, monkeypatch):
    """A loader that forgets a weight leaves it as initialized, never unset or zeros."""
    real = checkpoints.assign
    skipped = []

    def assign_all_but_one(mapping, state_dict, *args, **kwargs):
        key = "encoder.layer.1.intermediate.dense.weight"
        skipped.extend(m[0].path for m in mapping if m[1] == key)
        return real([m for m in mapping if m[1] != key], state_dict, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "assign", assign_all_but_one)
    load = lambda **kw: kb.models.BertBackbone.from_preset(dirs["hf"], **kw)  # noqa: E731
    model = _load(load)
    fresh = _load(lambda: load(load_weights=False))
    pooler = _pooler_paths(model)
    expected = [None if id(w) in pooler or w.path == skipped[0] else v
                for w, v in zip(model.weights, dirs["backbone"])]
    _check(model, fresh, expected)
    value = to_numpy(next(w for w in model.weights if w.path == skipped[0]))
    assert np.isfinite(value).all() and value.std() > 0


def test_only_the_weights_the_checkpoint_lacks_are_drawn(dirs, monkeypatch):
    """The point of it all: `from_preset` draws the initializers of the pooler (absent from an
    HF MaskedLM checkpoint) and of a new head only; `load_weights=False` draws all."""
    draws = []
    real = utils.TruncatedNormal.__call__

    def counted(self, shape, dtype=None):
        draws.append(tuple(shape))
        return real(self, shape, dtype)

    monkeypatch.setattr(utils.TruncatedNormal, "__call__", counted)
    kb.models.BertBackbone.from_preset(dirs["ours"])
    assert draws == []
    kb.models.BertBackbone.from_preset(dirs["hf"])
    assert draws == [(8, 8)]
    del draws[:]
    kb.tasks.TextClassifier.from_preset(dirs["hf"], num_classes=3, preprocessor=None)
    assert sorted(draws) == [(8, 3), (8, 8)]
    del draws[:]
    kb.models.BertBackbone.from_preset(dirs["ours"], load_weights=False)
    assert len(draws) == 3 + 2 * 6 + 1  # tables; q, k, v, o, ffn in, ffn out per layer; pooler


def test_longformer_from_bert_draws_nothing_it_copies(dirs, monkeypatch):
    """`LongformerBackbone.from_bert` (and `from_roberta`) copies every weight of the source
    into a new model built in the same scope: nothing is drawn, and the copy is the one a
    model built outside it gets."""
    bert = kb.models.BertBackbone.from_preset(dirs["ours"])
    make = lambda: kb.models.LongformerBackbone.from_bert(  # noqa: E731
        bert, max_sequence_length=32, attention_window=4)
    expected = [to_numpy(w) for w in make().weights]
    draws = []
    real = utils.TruncatedNormal.__call__
    monkeypatch.setattr(utils.TruncatedNormal, "__call__",
                        lambda self, shape, dtype=None: draws.append(shape) or real(
                            self, shape, dtype))
    model = make()
    assert draws == []
    for w, want in zip(model.weights, expected):
        np.testing.assert_array_equal(to_numpy(w), want, err_msg=w.path)


def test_prune_heads_draws_nothing_it_copies(dirs, monkeypatch):
    """`kb.analysis.prune_heads` builds the pruned model in the same scope: every weight is a
    copy (sliced by head in the attention), so nothing is drawn, and all are set."""
    clf = kb.tasks.TextClassifier(kb.models.BertBackbone.from_preset(dirs["ours"]),
                                  num_classes=3, preprocessor=None)
    draws = []
    real = utils.TruncatedNormal.__call__
    monkeypatch.setattr(utils.TruncatedNormal, "__call__",
                        lambda self, shape, dtype=None: draws.append(shape) or real(
                            self, shape, dtype))
    pruned = kb.analysis.prune_heads(clf, {0: [1]})
    assert draws == []
    assert not [w.path for w in pruned.weights if getattr(w, "_value", 0) is None]
    old = clf.backbone.encoder.layer_block(0).attention.attention
    new = pruned.backbone.encoder.layer_block(0).attention.attention
    np.testing.assert_array_equal(to_numpy(new.query_dense.kernel),
                                  to_numpy(old.query_dense.kernel)[:, [0], :])
    head = lambda m: [to_numpy(w) for w in m.weights[len(m.backbone.weights):]]  # noqa: E731
    for got, want in zip(head(pruned), head(clf)):
        np.testing.assert_array_equal(got, want)


def test_a_failed_load_leaves_nothing_behind(dirs, tmp_path):
    """A checkpoint error inside the scope still raises it, and the next load is whole."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(dirs["hf"]):
        os.link(os.path.join(dirs["hf"], name), bad / name)
    (bad / "model.safetensors").unlink()
    state = checkpoints.load_state_dict(dirs["hf"])
    from safetensors.numpy import save_file

    save_file({k: v for k, v in state.items() if "intermediate" not in k},
              str(bad / "model.safetensors"))
    with pytest.raises(checkpoints.CheckpointError, match="lacks 4 weight"):
        kb.models.BertBackbone.from_preset(str(bad))
    test_backbone_has_the_checkpoints_values_and_its_own_initial_ones(dirs, "hf")


def test_the_scope_assigns_variables_made_before_it():
    made_before = keras.Variable(np.zeros(3, "float32"))
    with deferred_initialization():
        made_in = keras.Variable(keras.initializers.Ones(), shape=(2,))
        made_before.assign(np.arange(3, dtype="float32"))
        with deferred_initialization():  # nested: the outer scope initializes
            made_in.assign(np.full(2, 7.0, "float32"))
    np.testing.assert_array_equal(to_numpy(made_before), [0, 1, 2])
    np.testing.assert_array_equal(to_numpy(made_in), [7, 7])
    made_in.assign_add(np.ones(2, "float32"))  # a variable like any other
    np.testing.assert_array_equal(to_numpy(made_in), [8, 8])
