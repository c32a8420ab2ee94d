"""Issue 13: weights that cannot load wrong, inputs that cannot pass silently; and the preset
mechanism's structure (issue 12: one loader per source, no models <-> presets import circle)."""
import json
import os
import pathlib
import re
import shutil
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from keras_bertfam.models import weights_files
from keras_bertfam.presets import checkpoints, integrity

VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz")
         + ["the", "film", "good", "bad", "##s", "##ing", "great", "dull", "is", "."])
SIZES = dict(num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=32)
TINY_HF = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32)


def _tokenizer(vocab=VOCAB):
    return kb.preprocessing.WordPieceTokenizer(vocabulary=list(vocab), lowercase=True)


def _backbone(**overrides):
    return kb.models.BertBackbone(vocabulary_size=len(VOCAB), **dict(SIZES, **overrides))


def _corrupt(path, fill=None, seed=0):
    """4 KB of random bytes (or `fill`) written into the middle of the file."""
    size = os.path.getsize(path)
    data = (fill * 4096)[:4096] if fill else np.random.default_rng(seed).bytes(4096)
    with open(path, "r+b") as f:
        f.seek(max(0, size // 2 - 2048))
        f.write(data[:max(1, min(4096, size - size // 2 + 2048))])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("hf_tiny_bert"))
    transformers.BertModel(transformers.BertConfig(**TINY_HF)).eval().save_pretrained(path)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return path


def _copy(src, tmp_path, name):
    dst = str(tmp_path / name)
    shutil.copytree(src, dst)
    return dst


# === Weights that load wrong ===


@pytest.mark.parametrize("saved, task, num_classes", [
    ("BertForSequenceClassification", kb.tasks.TokenClassifier, 3),
    ("BertForTokenClassification", kb.tasks.TextClassifier, 3),
    ("BertForSequenceClassification", kb.tasks.MultipleChoice, 1),
])
def test_another_fine_tuning_tasks_head_of_the_same_names_does_not_load(saved, task, num_classes,
                                                                        tmp_path):
    """BERT's sequence, token and multiple-choice heads are all `classifier.weight/bias` of the
    same shape for the same number of labels: only config.json's `architectures` tells them apart.
    A sequence classifier loaded as a token classifier (or a 1-label one as a multiple-choice
    scorer) used to load its head silently as the other task's; now `from_preset` warns and starts
    a new head, `convert_task` refuses, naming the checkpoint's architecture."""
    import torch
    import transformers

    torch.manual_seed(0)
    path = str(tmp_path / "hf")
    getattr(transformers, saved)(transformers.BertConfig(num_labels=num_classes, **TINY_HF)
                                 ).eval().save_pretrained(path)
    state = checkpoints.load_state_dict(path)
    kwargs = {} if task is kb.tasks.MultipleChoice else {"num_classes": num_classes}
    with pytest.warns(UserWarning, match=rf"is a {saved} checkpoint, \w+'s head: {task.__name__} "
                                         r"does not load it as its own; its head is new"):
        model = task.from_preset(path, preprocessor=None, **kwargs)
    head = model.head if hasattr(model, "head") else model.score
    assert not np.allclose(np.asarray(head.kernel).T, state["classifier.weight"])
    if task is not kb.tasks.MultipleChoice or "MultipleChoice" in (
            kb.presets.FAMILIES["bert"].hf_task_heads or {}):
        with pytest.raises(checkpoints.CheckpointError,
                           match=rf"is a {saved} checkpoint.*Tensors of the same names would "
                                 r"load as another task's head"):
            kb.presets.convert_task(path, task, preprocessor=None, **kwargs)


@pytest.mark.parametrize("saved, task, setting", [
    ("XLNetForSequenceClassification", kb.tasks.TextClassifier, {"summary_type": "mean"}),
    ("ElectraForMultipleChoice", kb.tasks.MultipleChoice, {"summary_activation": "relu"}),
])
def test_a_sequence_summary_configured_otherwise_does_not_load(saved, task, setting, tmp_path):
    """HF's XLNet and ELECTRA heads read `sequence_summary` settings from config.json; ours
    compute the defaults (XLNet: tanh at the last position; ELECTRA: GELU at the first). A
    checkpoint configured otherwise has the same tensors: it converted silently to a head that
    computes something else. Now `convert_task` refuses, naming the setting; `from_preset`
    warns and starts a new head."""
    import torch
    import transformers

    torch.manual_seed(0)
    if saved.startswith("XLNet"):
        cfg = transformers.XLNetConfig(vocab_size=len(VOCAB), d_model=16, n_layer=1, n_head=2,
                                       d_inner=32, num_labels=2, **setting)
    else:
        cfg = transformers.ElectraConfig(**dict(TINY_HF, embedding_size=16), **setting)
    path = str(tmp_path / "hf")
    getattr(transformers, saved)(cfg).eval().save_pretrained(path)
    kwargs = {"num_classes": 2} if task is kb.tasks.TextClassifier else {}
    key, value = next(iter(setting.items()))
    with pytest.raises(checkpoints.CheckpointError,
                       match=rf"its config.json sets \{{'{key}': '{value}'\}} for its "
                             r"sequence_summary head"):
        kb.presets.convert_task(path, task, preprocessor=None, **kwargs)
    with pytest.warns(UserWarning, match=rf"head was not loaded, the task's is new: .*'{key}'"):
        model = task.from_preset(path, preprocessor=None, **kwargs)
    state = checkpoints.load_state_dict(path)
    assert not np.allclose(np.asarray(model.hidden_dense.kernel).T,
                           state["sequence_summary.summary.weight"])
def test_preset_files_are_checksummed_and_corrupt_ones_refused(tmp_path):
    path = str(tmp_path / "preset")
    kb.presets.save_backbone(_backbone(), path, tokenizer=_tokenizer())
    manifest = kb.presets.read_manifest(path)
    assert set(manifest["files"]) == {"backbone.weights.h5", "assets/tokenizer/vocabulary.txt"}
    assert all(re.fullmatch("[0-9a-f]{64}", v) for v in manifest["files"].values())
    kb.models.BertBackbone.from_preset(path)  # intact: loads
    _corrupt(os.path.join(path, "backbone.weights.h5"))
    with pytest.raises(integrity.IntegrityError,
                       match=r"backbone\.weights\.h5' is corrupt: its sha256"):
        kb.models.BertBackbone.from_preset(path)
    kb.models.BertBackbone.from_preset(path, load_weights=False)  # the config alone still loads
    with open(os.path.join(path, "assets", "tokenizer", "vocabulary.txt"), "a") as f:
        f.write("extra\n")
    with pytest.raises(integrity.IntegrityError, match=r"vocabulary\.txt' is corrupt"):
        kb.preprocessing.Tokenizer.from_preset(path)


def test_task_preset_weights_are_checksummed(tmp_path):
    path = str(tmp_path / "task")
    pre = kb.preprocessing.TextClassifierPreprocessor(_tokenizer(), sequence_length=16)
    kb.tasks.TextClassifier(_backbone(), num_classes=2, preprocessor=pre).save_to_preset(path)
    assert "task.weights.h5" in kb.presets.read_manifest(path)["files"]
    _corrupt(os.path.join(path, "task.weights.h5"), seed=1)
    with pytest.raises(integrity.IntegrityError, match=r"task\.weights\.h5' is corrupt"):
        kb.tasks.TextClassifier.from_preset(path)


def _classifier(cls=kb.tasks.TextClassifier, num_classes=2, hidden_activation="auto", **sizes):
    return cls(_backbone(**sizes), num_classes=num_classes, preprocessor=None,
               **({} if hidden_activation == "auto" else {"hidden_activation": hidden_activation}))


def _albert(**overrides):
    return kb.models.AlbertBackbone(len(VOCAB), embedding_dim=8, **dict(SIZES, **overrides))


class _MyClassifier(kb.tasks.TextClassifier):
    """A user's subclass: a TextClassifier's file loads into it."""


def _refused_unchanged(model, path, error, match):
    """`model.load_weights(path)` raises `error` matching `match`, and no weight changed."""
    before = [np.asarray(v) for v in model.weights]
    with pytest.raises(error, match=match):
        model.load_weights(path)
    for value, variable in zip(before, model.weights):
        np.testing.assert_array_equal(value, np.asarray(variable))


@pytest.mark.multibackend
@pytest.mark.parametrize("source, target, error", [
    (_backbone, lambda: _backbone(num_layers=1),
     r"holds 8 layer\(s\) of weights the model has no place for: \['layers/transformer_stack/"
     r"blocks/transformer_block_1/"),
    (_backbone, lambda: kb.models.DistilBertBackbone(vocabulary_size=len(VOCAB), **SIZES),
     r"into DistilBertBackbone .* no place for: \['layers/dense', 'layers/text_embedding/"
     r"segment_embedding'\]"),
    (_backbone, lambda: kb.models.ElectraBackbone(vocabulary_size=len(VOCAB), **SIZES),
     r"no place for: \['layers/dense'\]"),
    (_backbone, lambda: _backbone(num_heads=4),
     r"attention/key_dense: 0 is \(16, 2, 8\) in the file, \(16, 4, 4\) in the model"),
    (_classifier, lambda: _classifier(num_layers=1), r"into TextClassifier .*transformer_block_1"),
    (_classifier, lambda: _classifier(num_classes=3), r"layers/dense: 0 is \(16, 2\) in the file"),
    (_backbone, _classifier, r"at 'layers/bert_backbone', e\.g\. a backbone's\): load it into "
                             r"that part \(`task\.backbone\.load_weights`\)"),
    (_classifier, _backbone, r"into BertBackbone .*at 'layers/bert_backbone', a TextClassifier\)"),
    (_classifier, lambda: _classifier(kb.tasks.TokenClassifier),
     r"holds a TextClassifier's weights, whose head is not a TokenClassifier's"),
    # The same layout, another function: the file records the settings that change it.
    (_backbone, lambda: _backbone(activation="relu"),
     r"saved from a model configured otherwise.*: activation is 'gelu' in the file, 'relu' in "
     r"the model"),
    (_backbone, lambda: _backbone(layer_norm_epsilon=1e-6),
     r"layer_norm_epsilon is 1e-12 in the file, 1e-06 in the model"),
    (_albert, lambda: _albert(num_layers=1), r"num_layers is 2 in the file, 1 in the model"),
    (lambda: _classifier(hidden_activation="gelu"), lambda: _classifier(hidden_activation="relu"),
     r"into TextClassifier .*: hidden_activation is 'gelu' in the file, 'relu' in the model"),
    (_classifier, lambda: _classifier(activation="relu", layer_norm_epsilon=1e-6),
     r"the backbone's activation is 'gelu' in the file, 'relu' in the model; the backbone's "
     r"layer_norm_epsilon is 1e-12"),
])
def test_a_weights_file_of_another_model_is_refused_before_anything_loads(source, target, error,
                                                                           tmp_path):
    """Keras' load_weights fills the model's layers from the file's entries at their paths and
    ignores the file's others: a 2-layer file in a 1-layer model, a BERT file in a DistilBERT or
    ELECTRA backbone (segment table, pooler left over), a TextClassifier's head in a
    TokenClassifier (the same paths and shapes) loaded silently; a missing or misshapen
    variable was an error only after the layers before it were overwritten."""
    path = str(tmp_path / "saved.weights.h5")
    source().save_weights(path)
    model = target()
    _refused_unchanged(model, path, ValueError,
                       re.escape(path) + ".*" + error + ".*Nothing was loaded")


@pytest.mark.multibackend
@pytest.mark.parametrize("source, target, error", [
    (_backbone, lambda: _backbone(activation="relu"),
     r"into BertBackbone .*configured otherwise.*: activation is 'gelu' in the file, 'relu' in "
     r"the model"),
    (_albert, lambda: _albert(num_layers=1), r"num_layers is 2 in the file, 1 in the model"),
    (lambda: _classifier(hidden_activation="gelu"),
     lambda: _classifier(hidden_activation="relu", activation="relu"),
     r"into TextClassifier .*: hidden_activation is 'gelu' in the file, 'relu' in the model; "
     r"the backbone's activation is 'gelu' in the file, 'relu' in the model"),
])
def test_a_keras_archive_of_a_model_configured_otherwise_is_refused(source, target, error,
                                                                    tmp_path):
    """`model.save("x.keras")` is Keras' writer: the archive held no record of the settings that
    change what its weights compute, and `load_weights` of it into a model with another
    activation (an ALBERT with other num_layers) loaded silently. Its config.json says them: a
    model configured otherwise is refused as for `.weights.h5`; the same config loads."""
    path = str(tmp_path / "saved.keras")
    saved = source()
    saved.save(path)
    model = target()
    _refused_unchanged(model, path, ValueError,
                       re.escape(path) + ".*" + error + ".*Nothing was loaded")
    same = source()
    same.load_weights(path)
    for a, b in zip(saved.weights, same.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_ONE = dict(SIZES, num_layers=1)


def _distiller(teacher=None, student=None):
    bert = kb.models.BertBackbone
    return kb.tasks.Distiller(
        kb.tasks.MaskedLM(bert(vocabulary_size=len(VOCAB), **dict(_ONE, **(teacher or {})))),
        bert(vocabulary_size=len(VOCAB), **dict(_ONE, **(student or {}))))


def _electra(generator=None, discriminator=None):
    electra = kb.models.ElectraBackbone
    return kb.tasks.ElectraPretrainer(
        generator=electra(len(VOCAB), embedding_dim=8, **dict(
            _ONE, hidden_dim=8, intermediate_dim=16, **(generator or {}))),
        discriminator=electra(len(VOCAB), embedding_dim=8, **dict(_ONE, **(discriminator or {}))))


@pytest.mark.multibackend
@pytest.mark.parametrize("make, role, setting, values", [
    (_distiller, "student", "activation", ("gelu", "relu")),
    (_distiller, "teacher", "layer_norm_epsilon", (1e-12, 1e-06)),
    (_electra, "generator", "layer_norm_epsilon", (1e-12, 1e-06)),
    (_electra, "discriminator", "activation", ("gelu", "relu")),
])
def test_each_backbone_of_a_model_with_several_is_compared_and_named_by_its_role(
        make, role, setting, values, tmp_path):
    """A Distiller (teacher + student) and ELECTRA's pretrainer (generator + discriminator) hold
    two backbones: a `.keras` archive of one compared only the task's own settings, so it
    loaded silently into a model whose student (generator, ...) had another activation or
    LayerNorm epsilon; a `.weights.h5` was refused, naming "the backbone 1's activation". Each
    backbone's settings are compared, named by the task's argument that holds it; the same
    configuration loads, and `keras.saving.load_model` (which builds the model from the
    archive's own config) gives the saved weights back."""
    saved = make()
    other = make(**{role: {setting: values[1]}})
    for name in ("saved.weights.h5", "saved.keras"):
        path = str(tmp_path / name)
        saved.save_weights(path) if name.endswith(".weights.h5") else saved.save(path)
        _refused_unchanged(other, path, ValueError, re.escape(path) + rf".*configured otherwise.*"
                           rf": the {role}'s {setting} is {values[0]!r} in the file, "
                           rf"{values[1]!r} in the model\. .*Nothing was loaded")
        same = make()
        same.load_weights(path)
        for a, b in zip(saved.weights, same.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    loaded = keras.saving.load_model(path)
    assert weights_files.function_settings(loaded) == weights_files.function_settings(saved)
    for a, b in zip(saved.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _frozen(block, compiled=True, cls=kb.tasks.TextClassifier, **kwargs):
    """A tiny classifier with transformer block `block` frozen (before compiling)."""
    task = cls(_backbone(), num_classes=2, preprocessor=None, **kwargs)
    task.backbone.transformer_layers[block].trainable = False
    if compiled:
        task.compile()
        task.optimizer.build(task.trainable_variables)
    return task


def _as_after_a_step(task):
    """The task's optimizer state as a training step leaves it, without the step (whose train
    function each new task traces, on JAX compiles): one iteration, and every slot a value of
    its own (0.01 times its position), unlike a fresh optimizer's zeros."""
    for i, variable in enumerate(task.optimizer.variables):
        if variable.path.endswith("/iteration"):
            variable.assign(1)
        elif not variable.path.endswith("/learning_rate"):
            variable.assign(np.full(variable.shape, 0.01 * i, variable.dtype))


def _slots(task):
    """{model variable path: (momentum, velocity)} of a task's AdamW."""
    optimizer = task.optimizer
    return {v.path: (np.asarray(optimizer._momentums[i]), np.asarray(optimizer._velocities[i]))
            for i, v in enumerate(optimizer._trainable_variables)}


_BLOCK_0 = (r"layers/bert_backbone/layers/transformer_stack/blocks/transformer_block/"
            r"attention/[a-z_/]+/vars/\d")


@pytest.fixture(scope="module")
def frozen_block_0(tmp_path_factory):
    """A classifier with block 0 frozen, its optimizer as after a step, saved both ways: ->
    (task, paths)."""
    task = _frozen(0)
    _as_after_a_step(task)
    where = tmp_path_factory.mktemp("frozen_block_0")
    paths = [str(where / "saved.weights.h5"), str(where / "saved.keras")]
    task.save_weights(paths[0])
    task.save(paths[1])
    return task, paths


@pytest.mark.multibackend
def test_optimizer_state_of_other_variables_is_refused_naming_them(frozen_block_0):
    """Keras loads an optimizer's state by position when the variable counts match: a task
    trained with transformer block 0 frozen, loaded into one compiled with block 1 frozen (the
    same number of optimizer variables), gave block 0's weights block 1's moments, silently,
    and training resumed from them. The file records whose state each position holds (the
    saved path of the model variable); another assignment is refused naming the variables,
    before anything (weights, optimizer) is loaded. The same freezing loads, moment by moment
    onto the same variables; a task compiled after loading starts from a fresh optimizer."""
    saved, paths = frozen_block_0
    for path in paths:
        other = _frozen(1)
        optimizer_before = [np.asarray(v) for v in other.optimizer.variables]
        _refused_unchanged(other, path, ValueError, re.escape(path) + r".* optimizer state .*"
                           + _BLOCK_0 + r" would get .*transformer_block_1/.*Nothing was loaded")
        for value, variable in zip(optimizer_before, other.optimizer.variables):
            np.testing.assert_array_equal(value, np.asarray(variable))
        same = _frozen(0)
        same.load_weights(path)
        assert int(same.optimizer.iterations) == 1
        expected, got = _slots(saved), _slots(same)
        assert sorted(expected) == sorted(got)
        for name, (momentum, velocity) in expected.items():
            np.testing.assert_array_equal(momentum, got[name][0])
            np.testing.assert_array_equal(velocity, got[name][1])
        fresh = _frozen(1, compiled=False)
        fresh.load_weights(path)  # no optimizer yet: the weights alone
        for a, b in zip(saved.weights, fresh.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.multibackend
def test_optimizer_state_of_the_other_backbone_of_the_same_names_is_refused(tmp_path):
    """ELECTRA's generator and discriminator of the same sizes: their variables have the same
    Keras paths, so their optimizer variables the same names. The state of a pretrainer whose
    generator's block was frozen, loaded into one whose discriminator's was, is told apart by
    where each variable is saved (its backbone's path), and refused."""
    def pretrainer(frozen):
        electra = kb.models.ElectraBackbone
        task = kb.tasks.ElectraPretrainer(
            generator=electra(len(VOCAB), embedding_dim=16, **_ONE),
            discriminator=electra(len(VOCAB), embedding_dim=16, **_ONE))
        getattr(task, frozen).transformer_layers[0].trainable = False
        task.compile()
        task.optimizer.build(task.trainable_variables)
        return task

    path = str(tmp_path / "saved.weights.h5")
    pretrainer("generator").save_weights(path)
    other = pretrainer("discriminator")
    assert ([v.name for v in other.optimizer.variables]
            == [v.name for v in pretrainer("generator").optimizer.variables])
    _refused_unchanged(other, path, ValueError, r"optimizer state .*layers/electra_backbone/"
                       r"layers/transformer_stack/blocks/transformer_block/.* would get "
                       r"layers/electra_backbone_1/layers/transformer_stack/")
    pretrainer("generator").load_weights(path)


@keras.saving.register_keras_serializable("test_reliability")
class FreezingClassifier(kb.tasks.TextClassifier):
    """A user's task that freezes one transformer block itself (before it is compiled)."""

    frozen = 0

    def __init__(self, backbone, **kwargs):
        super().__init__(backbone, **kwargs)
        self.backbone.transformer_layers[self.frozen].trainable = False


@pytest.mark.multibackend
def test_load_model_refuses_optimizer_state_of_other_variables(tmp_path, monkeypatch):
    """`keras.saving.load_model` compiles the task as saved and loads the optimizer's state by
    position too: a task class that now freezes another block of the same shapes got the other
    block's moments silently. It is refused naming the variables (Keras reports it once its
    walk of the archive ends: no model is returned); the class as saved loads."""
    saved = FreezingClassifier(_backbone(), num_classes=2, preprocessor=None)
    saved.compile()
    saved.optimizer.build(saved.trainable_variables)
    _as_after_a_step(saved)
    path = str(tmp_path / "saved.keras")
    saved.save(path)
    with monkeypatch.context() as changed:
        changed.setattr(FreezingClassifier, "frozen", 1)  # the class, changed since
        with pytest.raises(ValueError, match=r"into FreezingClassifier .*optimizer state .*"
                           + _BLOCK_0 + " would get .*transformer_block_1/"):
            keras.saving.load_model(path)
    loaded = keras.saving.load_model(path)
    assert int(loaded.optimizer.iterations) == 1
    expected, got = _slots(saved), _slots(loaded)
    for name, (momentum, _) in expected.items():
        np.testing.assert_array_equal(momentum, got[name][0])


def _compiled(optimizer):
    """A tiny 1-layer classifier compiled with `optimizer`, its state built."""
    task = _classifier(num_layers=1)
    task.compile(optimizer=optimizer)
    task.optimizer.build(task.trainable_variables)
    return task


@pytest.mark.multibackend
def test_optimizer_state_of_another_optimizer_class_is_refused_naming_both(tmp_path,
                                                                          monkeypatch):
    """Lion keeps one `momentum` slot per variable, and so does SGD with momentum: a task
    trained with Lion, loaded into one compiled with SGD (the same number of optimizer
    variables, the same variables), gave SGD Lion's moments as its velocities, silently. The
    file records the optimizer's class (and the classes it extends): another class is refused
    naming both, before anything is loaded. AdamW extends Adam (the same slots): their state
    loads either way. A file saved before the class was recorded loads as before."""
    saved = _compiled(keras.optimizers.Lion(1e-3))
    _as_after_a_step(saved)
    paths = [str(tmp_path / "lion.weights.h5"), str(tmp_path / "lion.keras")]
    saved.save_weights(paths[0])
    saved.save(paths[1])
    for path in paths:
        other = _compiled(keras.optimizers.SGD(1e-3, momentum=0.9))
        assert len(other.optimizer.variables) == len(saved.optimizer.variables)
        optimizer_before = [np.asarray(v) for v in other.optimizer.variables]
        _refused_unchanged(other, path, ValueError, re.escape(path) + r".*: its optimizer state "
                           r"is a Lion's, the model's optimizer is a SGD.* Compile with a Lion "
                           r".*or load the weights before `compile`.*Nothing was loaded\.")
        for value, variable in zip(optimizer_before, other.optimizer.variables):
            np.testing.assert_array_equal(value, np.asarray(variable))
    adamw = _compiled(keras.optimizers.AdamW(1e-3))
    _as_after_a_step(adamw)
    path = str(tmp_path / "adamw.weights.h5")
    adamw.save_weights(path)
    adam = _compiled(keras.optimizers.Adam(1e-3))
    adam.load_weights(path)
    for a, b in zip(adamw.optimizer.variables, adam.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    real = weights_files.optimizer_record
    old = str(tmp_path / "old.weights.h5")
    with monkeypatch.context() as before:  # the record as it was: no optimizer class
        before.setattr(weights_files, "optimizer_record", lambda *a, **k: {
            key: value for key, value in real(*a, **k).items() if key != "classes"})
        saved.save_weights(old)
    assert "classes" not in weights_files.read_layout(old).optimizer[""]
    sgd = _compiled(keras.optimizers.SGD(1e-3, momentum=0.9))
    sgd.load_weights(old)
    assert int(sgd.optimizer.iterations) == 1


@pytest.mark.multibackend
def test_a_nested_tasks_optimizer_state_of_other_variables_is_refused_before_loading(tmp_path):
    """A Distiller whose teacher is itself a compiled task saves the teacher's optimizer state
    and record at the teacher's path. A teacher compiled with another block frozen was compared
    only when Keras' walk reached it, after the Distiller's own layers had loaded; and Keras,
    visiting the teacher again by another path, dropped the refusal: the file loaded silently,
    the teacher's moments on other variables. The teacher's record is compared with the rest,
    before anything is assigned, and the refusal names it."""
    def distiller(frozen):
        teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(vocabulary_size=len(VOCAB), **SIZES))
        teacher.backbone.transformer_layers[frozen].trainable = False
        teacher.compile()
        teacher.optimizer.build(teacher.trainable_variables)
        task = kb.tasks.Distiller(
            teacher, kb.models.BertBackbone(vocabulary_size=len(VOCAB), **_ONE))
        task.compile()
        task.optimizer.build(task.trainable_variables)
        return task

    path = str(tmp_path / "distiller.weights.h5")
    saved = distiller(0)
    for variable in saved.teacher.optimizer.variables[2:]:  # moments unlike a fresh one's
        variable.assign(np.full(variable.shape, 0.5, variable.dtype))
    saved.save_weights(path)
    other = distiller(1)
    teacher_before = [np.asarray(v) for v in other.teacher.optimizer.variables]
    _refused_unchanged(other, path, ValueError, re.escape(path) + r".* into Distiller .*: its "
                       r"MaskedLM 'masked_lm.*' \(at 'layers/.*teacher'\): its optimizer state "
                       r"is other variables'.*" + _BLOCK_0 + r" would get .*transformer_block_1/"
                       r".*Nothing was loaded")
    for value, variable in zip(teacher_before, other.teacher.optimizer.variables):
        np.testing.assert_array_equal(value, np.asarray(variable))
    with pytest.raises(ValueError, match=r"into Distiller .*: its MaskedLM .*optimizer state "
                       r"is other variables'"):  # Keras' own walk (as `load_model`'s) too
        keras.Model.load_weights(distiller(1), path)
    same = distiller(0)
    same.load_weights(path)
    for a, b in zip(saved.teacher.optimizer.variables, same.teacher.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.multibackend
@pytest.mark.parametrize("saved_compiled, loaded_compiled", [(True, False), (False, True)])
def test_a_nested_tasks_optimizer_state_of_another_count_loads_as_a_top_level_tasks(
        saved_compiled, loaded_compiled, tmp_path):
    """A Distiller saved while its teacher was a compiled task holds the teacher's optimizer
    state at the teacher's path: loaded into a Distiller whose teacher was not compiled (or the
    other way round) it was refused as "saved from another model or configuration" naming
    '.../teacher/optimizer', though only an optimizer's state differs. It loads as a top-level
    task's file does: the weights, with Keras' warning where it skips the optimizer state."""
    def distiller(compiled):
        teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(vocabulary_size=len(VOCAB), **_ONE))
        if compiled:
            teacher.compile()
            teacher.optimizer.build(teacher.trainable_variables)
        return kb.tasks.Distiller(
            teacher, kb.models.BertBackbone(vocabulary_size=len(VOCAB), **_ONE))

    saved = distiller(saved_compiled)
    for name in ("saved.weights.h5", "saved.keras"):
        path = str(tmp_path / name)
        saved.save_weights(path) if name.endswith(".weights.h5") else saved.save(path)
        loaded = distiller(loaded_compiled)
        if loaded_compiled:  # Keras' own warning: its optimizer state is skipped
            with pytest.warns(UserWarning, match=r"Skipping variable loading for optimizer .* "
                              r"the saved optimizer has 0 variables"):
                loaded.load_weights(path)
        else:
            loaded.load_weights(path)
        for a, b in zip(saved.weights, loaded.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_cli_reports_a_checkpoints_optimizer_refusal_whole(frozen_block_0, tmp_path):
    """The CLI's resume cut a checkpoint's load error to its first 200 characters: a refusal of
    its optimizer state lost the variables past the first and what to do. The library's
    refusals of a weights file reach the user whole (Keras' own errors: their first line)."""
    from keras_bertfam import cli

    shutil.copy(frozen_block_0[1][0], tmp_path / cli.WEIGHTS)
    with pytest.raises(cli.CommandError) as caught:
        cli._restore(_frozen(1), str(tmp_path), 1, {})
    assert re.search(re.escape(str(tmp_path / cli.WEIGHTS)) + r" does not load into this model "
                     r"\(WeightsMismatch: Cannot load .*" + _BLOCK_0 + r" would get .* and \d+ "
                     r"more\. Freeze the same layers as in the saved model before `compile`, or "
                     r"load the weights before `compile` \(a fresh optimizer\)\. Nothing was "
                     r"loaded\.\)\. Delete ", str(caught.value)), caught.value


def test_a_plain_keras_archive_loads_as_before(tmp_path):
    """A `.keras` archive of a model not of this library records nothing: loaded as Keras does."""
    def plain(activation):
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(3, activation=activation)(inputs))

    path = str(tmp_path / "plain.keras")
    saved = plain("gelu")
    saved.save(path)
    assert weights_files.read_layout(path).record is None
    other = plain("relu")
    other.load_weights(path)
    np.testing.assert_array_equal(np.asarray(saved.weights[0]), np.asarray(other.weights[0]))


def test_a_weights_file_of_the_same_model_loads_and_one_that_is_not_one_is_named(tmp_path):
    trained = _classifier()
    trained.compile()
    trained.optimizer.build(trained.trainable_variables)
    _as_after_a_step(trained)
    path = str(tmp_path / "clf.weights.h5")
    trained.save_weights(path)  # with the optimizer's state, loaded or not
    for model in (_classifier(), _MyClassifier(_backbone(), num_classes=2, preprocessor=None)):
        model.load_weights(path)
        for a, b in zip(trained.weights, model.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    trained.save(str(tmp_path / "clf.keras"))  # a `.keras` file's weights are checked alike
    _classifier().load_weights(str(tmp_path / "clf.keras"))
    with pytest.raises(ValueError, match=r"clf\.keras' into TokenClassifier .*holds a "
                                         r"TextClassifier's weights"):
        _classifier(kb.tasks.TokenClassifier).load_weights(str(tmp_path / "clf.keras"))
    backbone = _backbone()
    trained.backbone.save_weights(str(tmp_path / "backbone.weights.h5"))
    backbone.load_weights(str(tmp_path / "backbone.weights.h5"))
    np.testing.assert_array_equal(np.asarray(backbone.weights[0]),
                                  np.asarray(trained.backbone.weights[0]))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(OSError, match=re.escape(path) + r"' \(\d+ bytes\): it is truncated, "
                       r"damaged or not a Keras weights file \(OSError: .*truncated file"):
        _classifier().load_weights(path)
    # A preset's backbone built smaller than its weights: refused, as HF's and keras-hub's are.
    preset = str(tmp_path / "preset")
    kb.presets.save_backbone(_backbone(), preset, tokenizer=_tokenizer())
    with pytest.raises(checkpoints.CheckpointError, match=r"backbone\.weights\.h5' into "
                       r"BertBackbone .*no place for: \['layers/transformer_stack/blocks/"
                       r"transformer_block_1/"):
        kb.models.BertBackbone.from_preset(preset, num_layers=1)


def _flip_a_byte(path, dataset):
    """Flips one byte inside the data of `dataset` (an h5 path) of the file `path`."""
    import h5py

    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(offset + 5)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.multibackend
def test_a_flipped_byte_in_a_weights_file_is_refused_naming_the_tensor(tmp_path, monkeypatch):
    """A plain `save_weights` file has no manifest: a byte changed inside a tensor loaded
    silently (a weight a little off, or NaN). The file records a digest of each tensor and
    `load_weights` checks them before anything is assigned, naming the file and the tensor; a
    preset's load, whose manifest already checks the whole file's sha256, does not hash twice."""
    from keras_bertfam.models import weights_files

    path = str(tmp_path / "clf.weights.h5")
    _classifier().save_weights(path)
    _classifier().load_weights(path)  # intact: loads
    tensor = "layers/bert_backbone/layers/transformer_stack/blocks/transformer_block_1/attention/" \
             "attention/key_dense/vars/0"
    _flip_a_byte(path, tensor)
    model = _classifier()
    _refused_unchanged(model, path, OSError, re.escape(
        f"The weights file {path!r} is damaged: the bytes of 1 tensor(s) changed after it was "
        f"saved: ['{tensor}']") + r".*Nothing was loaded")
    with monkeypatch.context() as m:  # a file system without mmap: the tensors read by h5py
        m.setattr(weights_files.mmap, "mmap", lambda *a, **k: (_ for _ in ()).throw(OSError()))
        with pytest.raises(OSError, match=re.escape(f"['{tensor}']")):
            model.load_weights(path)
    # A file without the digests (Keras' own save_weights, ours before) loads as before.
    keras_path = str(tmp_path / "keras.weights.h5")
    keras.Model.save_weights(_backbone(), keras_path)
    _flip_a_byte(keras_path, "layers/dense/vars/0")
    _backbone().load_weights(keras_path)
    # A preset's weights are hashed once: by the manifest's sha256, not by the digests too.
    preset = str(tmp_path / "preset")
    _backbone().save_to_preset(preset)
    calls = []
    real = weights_files.verify_digests
    monkeypatch.setattr(weights_files, "verify_digests",
                        lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    kb.models.BertBackbone.from_preset(preset)
    assert calls == []
    _backbone().load_weights(os.path.join(preset, "backbone.weights.h5"))
    assert calls == [os.path.join(preset, "backbone.weights.h5")]


def _seek_as_python_3_12(monkeypatch):
    """CPython 3.12+ seeks forward in a stored zip member without reading what it skips and
    turns the member's CRC-32 check off ("disable CRC checking after first seeking"); 3.11 (this
    venv's) reads through and checks it at the end. h5py reading a `.keras` archive's weights
    on the fly (Keras' `load_weights` of a `.keras`, `load_model`'s fallback) seeks."""
    import zipfile

    real = zipfile.ZipExtFile.seek

    def seek(self, offset, whence=0):
        if self._compress_type == zipfile.ZIP_STORED and self._decrypter is None:
            step = {0: offset, 1: self.tell() + offset,
                    2: self._orig_file_size + offset}[whence] - self.tell()
            if step > 0 and step + self._offset >= len(self._readbuffer):
                self._expected_crc = None
        return real(self, offset, whence)

    monkeypatch.setattr(zipfile.ZipExtFile, "seek", seek)


def _flip_in_archive(path, compression):
    """Rewrites the `.keras` archive `path` with its members `compression` (Keras writes them
    stored) and flips one byte of its weights member: of a tensor's data in the middle of the
    member where stored, in the middle of the compressed stream where deflated."""
    import io
    import struct
    import zipfile

    import h5py

    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members:
            archive.writestr(name, data, compress_type=compression)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model.weights.h5")
        with h5py.File(io.BytesIO(archive.read(info)), "r") as h5:
            offsets = []
            h5.visititems(lambda name, obj: offsets.append(obj.id.get_offset() + obj.nbytes // 2)
                          if isinstance(obj, h5py.Dataset) and obj.nbytes > 64 else None)
    at = (min(offsets, key=lambda o: abs(o - info.file_size // 2))
          if compression == zipfile.ZIP_STORED else info.compress_size // 2)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_size, extra_size = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_size + extra_size + at)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.multibackend
@pytest.mark.parametrize("python", ["this", "3.12+"])
@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_a_changed_byte_in_a_keras_archive_is_refused_naming_the_file(compression, python,
                                                                      tmp_path, monkeypatch):
    """A `.keras` archive has no tensor digests; zipfile checks a member's CRC-32 at the end of
    a read from its start. On Python 3.11 a changed byte in the weights was refused, but as
    zipfile's "Bad CRC-32 for file 'model.weights.h5'" (the archive not named; `load_weights`
    wrapped it as "truncated, damaged or not a Keras weights file"); on 3.12+ the seeks of
    h5py's reads turn the check of a stored member (Keras writes them stored) off, and
    `load_weights` and `keras.saving.load_model` loaded the changed weight silently. The
    weights member is read through once, its CRC-32 checked on every version: an `OSError`
    naming the file, before anything is assigned (`load_model`: Keras' error carries it)."""
    import zipfile
    import zlib

    if python == "3.12+":
        _seek_as_python_3_12(monkeypatch)
    for make in (_classifier, _backbone):
        path = str(tmp_path / f"{make.__name__.strip('_')}.keras")
        make().save(path)
        _flip_in_archive(path, getattr(zipfile, f"ZIP_{compression.upper()}"))
        damaged = re.escape(f"The weights file {path!r} is damaged: its 'model.weights.h5' "
                            f"does not hold the bytes the archive recorded (")
        _refused_unchanged(make(), path, OSError, damaged + r".*\)\. Restore the file or save "
                                                            r"it again\. Nothing was loaded\.")
        with pytest.raises(Exception) as caught:
            keras.saving.load_model(path)
        if compression == "stored" and (python == "3.12+" or sys.version_info >= (3, 12)):
            # Keras reads the member whole, fails, and falls back to reading it on the fly
            assert isinstance(caught.value, ValueError)
            assert re.search(damaged, str(caught.value)), caught.value
        else:  # zipfile's own error, raised in Keras' load_model before any of ours runs
            assert isinstance(caught.value, (zipfile.BadZipFile, zlib.error)), caught.value


@pytest.mark.multibackend
def test_record_and_check_open_the_weights_file_once(tmp_path, monkeypatch):
    """`record` (our `save_weights`) opened its `.weights.h5` file with h5py three times and
    `check_weights_file` (`load_weights`) twice; once each now. What they write and check is the
    same: the task class, the settings and the digest of every tensor (the task class's too,
    written in the same opening), recorded again in place on a second `record`."""
    import h5py

    from keras_bertfam.models import weights_files

    model = _classifier()
    path = str(tmp_path / "clf.weights.h5")
    keras.Model.save_weights(model, path)  # Keras' file: no record yet
    opened = []
    real = h5py.File
    monkeypatch.setattr(h5py, "File", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    for _ in range(2):
        weights_files.record(path, model, task_class="TextClassifier")
        assert opened == [path]
        opened.clear()
        weights_files.check_weights_file(model, path, task_class="TextClassifier")
        assert opened == [path]
        opened.clear()
    monkeypatch.undo()
    saved = weights_files.read_layout(path)
    assert saved.task == "TextClassifier"
    assert saved.record["settings"] == weights_files.function_settings(model)
    with h5py.File(path, "r") as h5:
        names = [f"{p}/vars/{k}" if p else f"vars/{k}" for p, keys in
                 weights_files._tensors(h5)[0].items() for k in keys]
        assert f"{weights_files.TASK_CLASS_PATH}/vars/0" in names
        assert saved.record["digests"] == {
            n: weights_files.tensor_digest(np.ascontiguousarray(h5[n][()]).tobytes())
            for n in names}
        assert [k for k in h5 if k.startswith("keras_bertfam")] == [
            weights_files.RECORD_PATH, weights_files.TASK_CLASS_PATH]


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_a_keras_archive_is_checked_reading_its_weights_once(compression, tmp_path,
                                                             monkeypatch):
    """`check_weights_file` of a `.keras` archive (run first by `load_weights`) opened the
    weights member with h5py through zipfile's file object, which rewinds to the member's start
    and re-reads it on every backward seek (3.3 s of a 45 MB archive's check, 73 s of a 438 MB
    one: BUILD.md), after reading it once for its CRC-32. Now it reads the member at most once
    through zipfile: none of it where stored (a memory map of the archive), once where
    deflated."""
    import zipfile

    path = str(tmp_path / "clf.keras")
    _classifier().save(path)
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members:
            archive.writestr(name, data, compress_type=getattr(zipfile,
                                                               f"ZIP_{compression.upper()}"))
    weights = dict(members)["model.weights.h5"]
    read = []
    real_read = zipfile.ZipExtFile.read

    def counted(self, n=-1):
        data = real_read(self, n)
        if self.name == "model.weights.h5":
            read.append(len(data))
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counted)
    model = _classifier()
    weights_files.check_weights_file(model, path, model._task_class_name())
    assert sum(read) == (0 if compression == "stored" else len(weights))
    # `load_weights` verified the archive's CRC-32 twice: in its check, then again while Keras
    # read it (`check_archive_store`); once now. Keras' read alone still verifies it.
    verified = []
    real_member = weights_files.archive_member
    monkeypatch.setattr(weights_files, "archive_member",
                        lambda *a, **k: verified.append(a[1]) or real_member(*a, **k))
    model.load_weights(path)
    assert verified == [path]
    verified.clear()
    keras.Model.load_weights(_classifier(), path)
    assert verified == [path]


def test_hf_safetensors_with_nan_bytes_is_refused_naming_the_tensor(hf_dir, tmp_path):
    bad = _copy(hf_dir, tmp_path, "nan")
    _corrupt(os.path.join(bad, "model.safetensors"), fill=b"\xff")  # 0xffffffff: NaN
    with pytest.raises(integrity.IntegrityError,
                       match=r"model\.safetensors': tensor '[\w.]+' \(.*non-finite"):
        kb.presets.convert(bad)


def test_check_finite_finds_any_nan_or_inf_and_passes_huge_finite_values():
    """`check_finite` clears a tensor by its sum, and checks element by element only when the
    sum is not finite: NaN and infinities of either sign (also +inf and -inf together, whose
    sum is NaN) are found anywhere; finite values whose sum overflows pass."""
    for dtype in ("float16", "float32", "float64"):
        ok = np.random.default_rng(0).standard_normal(1001).astype(dtype)
        integrity.check_finite("w", ok, "f")
        for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):
            value = ok.copy()
            value[[500, 1000][:len(bad)]] = bad
            with pytest.raises(integrity.IntegrityError, match=r"'w' \(1001,\) holds "
                                                               rf"{len(bad)} non-finite"):
                integrity.check_finite("w", value, "f")
    integrity.check_finite("w", np.full(8, np.finfo("float64").max), "f")  # the sum is inf
    integrity.check_finite("ids", np.arange(5), "f")  # integers are not checked


def test_keras_hub_weights_with_nan_are_refused_naming_the_tensor(tmp_path):
    import keras_hub

    kh = keras_hub.models.BertBackbone(vocabulary_size=len(VOCAB), num_layers=1, num_heads=2,
                                       hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    kernel = kh.get_layer("pooled_dense").kernel
    kernel.assign(np.full(kernel.shape, np.inf, "float32"))
    kh.save_to_preset(str(tmp_path / "kh"))
    with pytest.raises(integrity.IntegrityError,
                       match=r"model\.weights\.h5': tensor 'pooled_dense/kernel'.*non-finite"):
        kb.models.BertBackbone.from_preset(str(tmp_path / "kh"))


def test_every_hf_tensor_is_used_in_both_directions(hf_dir, tmp_path):
    fewer = _copy(hf_dir, tmp_path, "fewer")
    config = json.load(open(os.path.join(fewer, "config.json")))
    json.dump(dict(config, num_hidden_layers=1), open(os.path.join(fewer, "config.json"), "w"))
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"has no place for.*encoder\.layer\.1\..*fewer layers"):
        kb.presets.convert(fewer)
    more = _copy(hf_dir, tmp_path, "more")
    json.dump(dict(config, num_hidden_layers=3), open(os.path.join(more, "config.json"), "w"))
    with pytest.raises(checkpoints.CheckpointError, match=r"lacks .*encoder\.layer\.2\."):
        kb.presets.convert(more)
    kb.presets.convert(hf_dir)  # the matching config loads


@pytest.mark.multibackend
def test_tokenizer_larger_than_the_embedding_table_is_refused_when_built():
    small = kb.models.BertBackbone(vocabulary_size=20, **SIZES)
    pre = kb.preprocessing.TextClassifierPreprocessor(_tokenizer(), sequence_length=16)
    with pytest.raises(ValueError, match=rf"vocabulary has {len(VOCAB)} tokens but BertBackbone"
                                         r"'s embedding table has vocabulary_size=20"):
        kb.tasks.TextClassifier(small, num_classes=2, preprocessor=pre)
    mlm = kb.preprocessing.MaskedLMPreprocessor(_tokenizer(), sequence_length=16)
    with pytest.raises(ValueError, match="vocabulary_size=20"):
        kb.tasks.MaskedLM(small, preprocessor=mlm)


@pytest.mark.multibackend
def test_sequence_length_beyond_the_position_table_is_refused_when_built(tmp_path):
    pre = kb.preprocessing.TextClassifierPreprocessor(_tokenizer(), sequence_length=64)
    with pytest.raises(ValueError, match="sequence_length=64 is longer than BertBackbone's "
                                         "max_sequence_length=32"):
        kb.tasks.TextClassifier(_backbone(), num_classes=2, preprocessor=pre)
    path = str(tmp_path / "p")
    kb.presets.save_backbone(_backbone(), path, tokenizer=_tokenizer())
    with pytest.raises(ValueError, match="sequence_length=33 is longer"):
        kb.tasks.MaskedLM.from_preset(path, sequence_length=33)


# Every family with a position table, at 32 positions (XLNet's relative positions have none).
POSITION_TABLE_BACKBONES = {
    "bert": lambda: _backbone(num_layers=1),
    "roberta": lambda: kb.models.RobertaBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=32),
    "albert": lambda: kb.models.AlbertBackbone(len(VOCAB), 1, 2, 8, 16, 32,
                                               max_sequence_length=32),
    "distil_bert": lambda: kb.models.DistilBertBackbone(len(VOCAB), 1, 2, 16, 32,
                                                        max_sequence_length=32),
    "electra": lambda: kb.models.ElectraBackbone(len(VOCAB), 1, 2, 16, 8, 32,
                                                 max_sequence_length=32),
    "spanbert": lambda: kb.models.SpanBertBackbone(len(VOCAB), 1, 2, 16, 32,
                                                   max_sequence_length=32),
    "longformer": lambda: kb.models.LongformerBackbone(len(VOCAB), 1, 2, 16, 32,
                                                       attention_window=8, max_sequence_length=32),
}
FINETUNING_TASKS = {"TextClassifier": dict(num_classes=2), "TokenClassifier": dict(num_classes=2),
                    "QuestionAnswerer": {}, "MultipleChoice": {}, "SentenceEncoder": {},
                    "MaskedLM": {}}
PRETRAINERS = {"bert": "BertPretrainer", "albert": "AlbertPretrainer",
               "spanbert": "SpanBertPretrainer", "electra": "ElectraPretrainer"}


def test_every_task_of_every_family_refuses_a_sequence_length_past_the_position_table():
    """Issue 13 (keras-hub user sweep): each task with its default preprocessor (128 positions;
    QA 384, SentenceEncoder 256) on a 32-position backbone of each family is refused when built,
    naming the length, the backbone and its table, as MaskedLM is; and an attached
    preprocessor's `sequence_length` set past the table is refused when set."""
    tok = _tokenizer()
    for family, make in POSITION_TABLE_BACKBONES.items():
        names = list(FINETUNING_TASKS) + ([PRETRAINERS[family]] if family in PRETRAINERS else [])
        backbone = make()  # one a family: a backbone takes any number of tasks
        for name in names:
            cls = getattr(kb.tasks, name)
            pre = cls.default_preprocessor(tok, backbone)
            length = pre.sequence_length
            with pytest.raises(ValueError, match=rf"sequence_length={length} is longer than "
                                                 rf"{type(backbone).__name__}'s max_sequence_"
                                                 r"length=32 \(its position table\): expected "
                                                 r"sequence_length <= 32"):
                if name in FINETUNING_TASKS:
                    cls(backbone, preprocessor=pre, **FINETUNING_TASKS[name])
                else:
                    cls.pretraining_task(backbone, pre)
    # the Distiller's teacher reads the same rows as its student
    teacher = kb.tasks.MaskedLM(_backbone(num_layers=1))
    student = kb.models.DistilBertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=64)
    with pytest.raises(ValueError, match="sequence_length=48 is longer than BertBackbone's "
                                         "max_sequence_length=32"):
        kb.tasks.Distiller(teacher, student, preprocessor=kb.preprocessing.MaskedLMPreprocessor(
            tok, sequence_length=48))
    # set after the task is built: refused at once, the length unchanged (it was refused only
    # at the next predict / fit)
    pre = kb.preprocessing.TextClassifierPreprocessor(tok, sequence_length=16)
    kb.tasks.TextClassifier(_backbone(num_layers=1), num_classes=2, preprocessor=pre)
    pre.sequence_length = 32
    with pytest.raises(ValueError, match="sequence_length=33 is longer than BertBackbone's "
                                         "max_sequence_length=32"):
        pre.sequence_length = 33
    assert pre.sequence_length == 32 and pre.packer.sequence_length == 32
    # a preprocessor on its own has no table to fit
    alone = kb.preprocessing.TextClassifierPreprocessor(tok, sequence_length=16)
    alone.sequence_length = 600


def test_from_preset_sequence_length_override_past_the_position_table(tmp_path):
    """`from_preset(..., sequence_length=n)` of every task past the preset's 32 positions."""
    path = str(tmp_path / "p")
    kb.presets.save_backbone(_backbone(num_layers=1), path, tokenizer=_tokenizer())
    for name, kwargs in dict(FINETUNING_TASKS, BertPretrainer={}, SpanBertPretrainer={}).items():
        with pytest.raises(ValueError, match="sequence_length=100 is longer than BertBackbone's "
                                             "max_sequence_length=32"):
            getattr(kb.tasks, name).from_preset(path, sequence_length=100, **kwargs)
    clf = kb.tasks.TextClassifier.from_preset(path, num_classes=2, sequence_length=32)
    assert clf.preprocessor.sequence_length == 32


def test_a_preset_preprocessor_s_sequence_length_must_fit_the_preset_s_position_table(
        hf_dir, tmp_path):
    """A standalone preprocessor's `from_preset(..., sequence_length=n)` past the preset's
    backbone's position table was accepted, and refused only once attached to a task (or, fed
    to a model, failed in a Slice of the position embedding): now at construction, from each
    kind of preset (ours, an HF directory, a keras-hub directory, a registered name), read from
    its config alone. A length set later is checked against the same table."""
    import keras_hub

    ours = str(tmp_path / "ours")
    kb.presets.save_backbone(_backbone(num_layers=1), ours, tokenizer=_tokenizer())
    keras_hub_dir = str(tmp_path / "kh")
    keras_hub.models.BertBackbone(vocabulary_size=len(VOCAB), num_layers=1, num_heads=2,
                                  hidden_dim=8, intermediate_dim=16,
                                  max_sequence_length=16).save_to_preset(keras_hub_dir)
    keras_hub.models.BertTokenizer(vocabulary=VOCAB).save_to_preset(keras_hub_dir)
    for preset, limit in ((ours, 32), (hf_dir, 32), (keras_hub_dir, 16),
                          ("bert_tiny_en_uncased", 512)):
        for cls in (kb.preprocessing.TextClassifierPreprocessor,
                    kb.preprocessing.MaskedLMPreprocessor):
            with pytest.raises(ValueError, match=rf"sequence_length={limit + 1} is longer than "
                                                 rf"BertBackbone's max_sequence_length={limit} "
                                                 rf"\(its position table\)"):
                cls.from_preset(preset, sequence_length=limit + 1)
        fits = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset,
                                                                       sequence_length=limit)
        with pytest.raises(ValueError, match=rf"max_sequence_length={limit} "):
            fits.sequence_length = limit + 1
        assert fits.sequence_length == limit
    # the default length (128) past a 32-position preset: refused as a task's from_preset is
    with pytest.raises(ValueError, match=r"sequence_length=128 is longer than BertBackbone's "
                                         r"max_sequence_length=32"):
        kb.preprocessing.TextClassifierPreprocessor.from_preset(ours)
    # no table to fit: a tokenizer-only preset, XLNet's relative positions
    tokenizer_only = str(tmp_path / "tokenizer_only")
    keras_hub.models.BertTokenizer(vocabulary=VOCAB).save_to_preset(tokenizer_only)
    assert kb.preprocessing.TextClassifierPreprocessor.from_preset(
        tokenizer_only, sequence_length=600).sequence_length == 600
    assert kb.presets.position_table("xlnet_base_en") == (None, None)


def test_a_preset_preprocessor_resolves_its_preset_once(hf_dir, tmp_path, monkeypatch):
    """A preprocessor's `from_preset` read its tokenizer and its position table each through
    its own resolution of the preset (a directory's manifest read twice, a hub id's snapshot
    looked up twice): now one loader serves both. Counted as the loaders built."""
    from keras_bertfam.presets.loaders import PresetLoader

    ours = str(tmp_path / "ours")
    kb.presets.save_backbone(_backbone(num_layers=1), ours, tokenizer=_tokenizer())
    built = []
    init = PresetLoader.__init__

    def counted(self, preset, where):
        built.append(type(self).__name__)
        init(self, preset, where)

    monkeypatch.setattr(PresetLoader, "__init__", counted)
    for preset, kind in ((ours, "OursLoader"), (hf_dir, "HFDirLoader"),
                         ("bert_tiny_en_uncased", "HubCacheLoader")):
        for cls in (kb.preprocessing.TextClassifierPreprocessor,
                    kb.preprocessing.MaskedLMPreprocessor):
            built.clear()
            cls.from_preset(preset, sequence_length=16)
            assert built == [kind], (cls.__name__, preset, built)


def test_wrong_family_pretrainer_from_preset(tmp_path):
    path = str(tmp_path / "bert")
    kb.presets.save_backbone(_backbone(), path, tokenizer=_tokenizer())
    for cls, family in ((kb.tasks.AlbertPretrainer, "albert"),
                        (kb.tasks.XLNetPretrainer, "xlnet")):
        with pytest.raises(ValueError, match=rf"'bert' preset; {cls.__name__} needs a backbone "
                                             rf"of the '{family}' family"):
            cls.from_preset(path, load_weights=False)
    with pytest.raises(ValueError, match="AlbertPretrainer trains a 'albert' backbone"):
        kb.tasks.AlbertPretrainer(_backbone())


def test_registered_preset_without_offline_weights_says_which_files_go_where(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as info:
        kb.models.BertBackbone.from_preset("bert_tiny_en_uncased")
    message = str(info.value)
    cache = os.path.join(str(tmp_path / "hub"), "models--google--bert_uncased_L-2_H-128_A-2")
    for part in ("config.json", "model.safetensors", f"{cache}/snapshots/<revision>/",
                 f"{cache}/refs/main", "load_weights=False"):
        assert part in message


def test_models_tasks_and_preprocessing_do_not_import_presets():
    root = pathlib.Path(kb.__file__).parent
    for sub in ("layers", "models", "tasks", "preprocessing"):
        for path in (root / sub).glob("*.py"):
            text = path.read_text()
            assert "import presets" not in text and "keras_bertfam.presets" not in text, path
    loaders = kb.presets.loaders
    assert {c.__name__ for c in loaders.PresetLoader.__subclasses__()} >= {
        "OursLoader", "KerasHubLoader", "HFDirLoader"}
    assert issubclass(loaders.HubCacheLoader, loaders.PresetLoader)


def test_word_piece_vocabulary_warns_with_the_size_reached():
    with pytest.warns(UserWarning, match=r"gave \d+ tokens, fewer than vocabulary_size=30522"):
        vocabulary = kb.preprocessing.tokenizers.train_word_piece_vocabulary(
            ["a small corpus of words", "and a few more"], 30522)
    assert len(vocabulary) < 30522


# === Inputs that pass silently ===
# One task of each kind per module that the hostile inputs are fed to (a refused input leaves it
# as it was); one-layer backbones: a refusal does not depend on the depth.
def _one_layer_task(cls, preprocessor_cls, sequence_length, **kwargs):
    preprocessor = preprocessor_cls(_tokenizer(), sequence_length=sequence_length)
    return cls(_backbone(num_layers=1), preprocessor=preprocessor, **kwargs)


@pytest.fixture(scope="module")
def classifier():
    return _one_layer_task(kb.tasks.TextClassifier, kb.preprocessing.TextClassifierPreprocessor,
                           16, num_classes=2)


@pytest.fixture(scope="module")
def regressor():
    return _one_layer_task(kb.tasks.TextClassifier, kb.preprocessing.TextClassifierPreprocessor,
                           16, num_classes=1)


@pytest.fixture(scope="module")
def tagger():
    return _one_layer_task(kb.tasks.TokenClassifier,
                           kb.preprocessing.TokenClassifierPreprocessor, 8, num_classes=3)


@pytest.fixture(scope="module")
def chooser():
    return _one_layer_task(kb.tasks.MultipleChoice, kb.preprocessing.MultipleChoicePreprocessor,
                           16)


def test_float_class_labels_are_refused_in_python_and_in_tf_data(classifier):
    from keras_bertfam.tasks.classifier import check_label_values

    texts = ["good film", "bad film"]
    with pytest.raises(ValueError) as python_error:
        classifier.fit(texts, np.array([1.0, 1.7]), epochs=1)
    message = str(python_error.value)
    assert message.startswith("Invalid label 1.7: expected an integer class id")
    check_label_values(np.array([1.0, 0.0]), 2)  # whole floats pass
    ds = tf.data.Dataset.from_tensor_slices((texts, np.array([1.0, 1.7]))).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError) as graph_error:
        list(classifier.preprocessor.prepare(ds))
    assert message in str(graph_error.value)
    ok = tf.data.Dataset.from_tensor_slices((texts, np.array([1.0, 0.0]))).batch(2)
    assert list(next(iter(classifier.preprocessor.prepare(ok)))[1].numpy()) == [1, 0]


def test_non_finite_regression_targets_are_refused(regressor):
    pre = regressor.preprocessor
    with pytest.raises(ValueError, match=r"Invalid regression target nan: expected a finite"):
        regressor.fit(["good", "bad"], [0.5, float("nan")])
    with pytest.raises(ValueError, match=r"Invalid regression target inf"):
        regressor.evaluate(["good", "bad"], [np.inf, 0.5])
    ds = tf.data.Dataset.from_tensor_slices((["good", "bad"], [0.5, np.inf])).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid regression target inf"):
        list(pre.prepare(ds))


def test_string_regression_targets_in_a_dataset_are_refused(regressor):
    """A regression TextClassifier (num_classes=1) fed a dataset of (texts, b"3.5") read it as
    a text pair without targets: fit and evaluate said the dataset held "raw examples alone",
    its validation data "None values not supported"; with sample weights, or a pair's targets,
    TensorFlow's "Cast string to float is not supported". Refused naming the targets' dtype and
    that numbers are expected, as string targets in memory are."""
    texts, targets = ["good film", "bad film"], [b"3.5", b"1.0"]
    message = (r"TextClassifier got regression targets of dtype string( as the last of a "
               r"dataset's [23] string tensors \(.*\))?: expected a number \(num_classes=1: "
               r"regression\), not text; e\.g\. "
               r"ds\.map\(lambda x, y: \(x, tf\.strings\.to_number\(y\)\)\)")

    def data(*parts):
        return tf.data.Dataset.from_tensor_slices(parts).batch(2)

    good = data(texts, [3.5, 1.0])
    for call in (lambda: regressor.fit(data(texts, targets), verbose=0),
                 lambda: regressor.evaluate(data(texts, targets), verbose=0),
                 lambda: regressor.fit(good, validation_data=data(texts, targets), verbose=0),
                 lambda: regressor.fit(data((texts, texts), targets), verbose=0),  # a pair's
                 lambda: regressor.fit(data(texts, targets, [1.0, 1.0]), verbose=0),
                 lambda: regressor.fit(data(texts, texts, targets), verbose=0)):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match=r"Invalid regression target b'3.5' \(flat index 0\): "
                                         r"expected a number \(num_classes=1: regression\), not "
                                         r"text"):  # in memory, as it was
        regressor.fit(texts, np.array(targets), verbose=0)
    # a text pair without targets is still predicted as one
    assert regressor.predict(data(texts, texts), verbose=0).shape == (2, 1)


def test_string_class_labels_in_a_dataset_are_refused(classifier, tagger, chooser):
    """Issue #13: a TextClassifier (num_classes=2) fed a dataset of (texts, b"1") said the
    dataset held "raw examples alone"; with sample weights, or a pair's labels, TensorFlow's
    "Cast string to int32 is not supported". TokenClassifier and MultipleChoice likewise. Refused
    naming the labels' dtype, the class ids expected and a conversion."""
    texts, labels = ["good film", "bad film"], [b"1", b"0"]
    message = (r"TextClassifier got labels of dtype string( as the last of a dataset's [23] "
               r"string tensors \(.*\))?: expected integer class ids from 0 to 1 "
               r"\(num_classes=2\), not text; e\.g\. "
               r"ds\.map\(lambda x, y: \(x, tf\.strings\.to_number\(y, tf\.int32\)\)\), "
               r"or for class names a lookup, keras\.layers\.StringLookup")

    def data(*parts):
        return tf.data.Dataset.from_tensor_slices(parts).batch(2)

    for call in (lambda: classifier.fit(data(texts, labels), verbose=0),
                 lambda: classifier.evaluate(data(texts, labels), verbose=0),
                 lambda: classifier.fit(data(texts, [1, 0]), validation_data=data(texts, labels),
                                 verbose=0),
                 lambda: classifier.fit(data((texts, texts), labels), verbose=0),  # a pair's
                 lambda: classifier.fit(data(texts, labels, [1.0, 1.0]), verbose=0),
                 lambda: classifier.fit(data(texts, texts, labels), verbose=0)):
        with pytest.raises(ValueError, match=message):
            call()
    words = tf.ragged.constant([["good", "film"], ["bad", "film"]])
    tags = tf.ragged.constant([[b"1", b"0"], [b"2", b"0"]])
    for element in ((words, tags), (words, tags, [1.0, 1.0])):
        with pytest.raises(ValueError, match=r"TokenClassifier got (token )?labels of dtype "
                                             r"string.*: expected integer class ids from 0 to 2 "
                                             r"\(num_classes=3\), not text"):
            tagger.fit(tf.data.Dataset.from_tensor_slices(element).batch(2), verbose=0)
    choices = [["good", "bad"], ["bad", "good"]]
    for parts in ((texts, choices, labels), ((texts, choices), labels)):
        with pytest.raises(ValueError, match=r"MultipleChoice got choice labels of dtype "
                                             r"string.*: expected integer indices from 0 to the "
                                             r"number of choices minus 1, not text"):
            chooser.fit(data(*parts), verbose=0)
    # a text pair without labels is still predicted as one
    assert classifier.predict(data(texts, texts), verbose=0).shape == (2, 2)


@pytest.mark.multibackend
def test_predict_and_fit_inputs_that_cannot_be_a_batch(classifier):
    with pytest.raises(ValueError, match=r"empty input \(0 examples, list\)"):
        classifier.predict([])
    with pytest.raises(ValueError, match=r"empty input \(0 examples, ndarray\)"):
        classifier.predict(np.array([], object))
    with pytest.raises(ValueError, match="got a single string 'a single string': pass a list"):
        classifier.predict("a single string")
    with pytest.raises(ValueError, match="takes raw text; got an array of float64"):
        classifier.predict(np.zeros(3))
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match=rf"batch_size must be a positive int.*{bad!r}"):
            classifier.fit(["good"], [1], batch_size=bad)
    # Keras trained nothing, silently, for epochs=0 or -1
    for name, bad in (("epochs", 0), ("epochs", -1), ("epochs", 2.5), ("epochs", True),
                      ("steps_per_epoch", 0), ("initial_epoch", -1)):
        with pytest.raises(ValueError, match=rf"{name} must be an int >= [01], got {bad!r}"):
            classifier.fit(["good"], [1], **{name: bad})
    assert classifier.predict(["good film"], batch_size=np.int64(1)).shape == (1, 2)
    classifier.fit(["good film"], [1], batch_size=np.int64(1), verbose=0)  # torch refused int64


def test_a_first_script_s_wrong_inputs_are_named(classifier):
    """What a user's first script gets wrong, each answered with its value and the fix (these
    were "None values not supported", "Dimensions 3 and 2 are not compatible", an IndexError, a
    SegmentPacker rank error, "Can't convert Python sequence with mixed types" and a graph
    error in SparseSoftmaxCrossEntropyWithLogits)."""
    texts = ["good film", "bad film"]
    cases = [
        (lambda: classifier.fit(texts, ["pos", "neg"]),
         r"Invalid label 'pos' \(flat index 0 of the labels\): expected an integer class id "
         r"from 0 to 1 \(num_classes=2\). Map text labels to ids first"),
        (lambda: classifier.fit(texts + ["fine"], [0, 1]),
         "TextClassifier got 3 examples in x but 2 in y: y needs one entry per example"),
        (lambda: classifier.fit(texts, [0, 1], sample_weight=[1.0]),
         "TextClassifier got 2 examples in x but 1 in sample_weight"),
        (lambda: classifier.fit((texts, ["a"]), [0, 1]),
         "columns of different lengths: column 0 has 2 examples, column 1 has 1"),
        (lambda: classifier.predict(("good film", "bad film")),
         r"reads a tuple as columns .*got a tuple of strings \('good film', 'bad film'\)"),
        (lambda: classifier.predict([["good film", "bad film"]]),
         r"TextClassifier takes a batch of texts \(.*\), or a tuple of two such batches for "
         r"text pairs; got a list whose item 0 is a list \['good film', 'bad film'\]"),
        (lambda: classifier.predict(["good film", None]),
         r"list of texts whose item 1 is None \(NoneType\): expected a string"),
        (lambda: classifier.predict(["good film", 3]),
         r"list of texts whose item 1 is 3 \(int\): expected a string"),
        (lambda: classifier.fit(texts, [[1, 0], [0, 1]]),
         r"one class id per example.*got labels of shape \(2, 2\), one-hot.*np.argmax"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # the forms that stay valid: pairs as a tuple of lists, labels of shape (N, 1)
    classifier.fit((texts, texts), np.array([[0], [1]]), epochs=1, verbose=0)


def test_a_text_pair_s_two_batches_hold_as_many_texts(classifier):
    """A tuple is segments, as keras-hub reads it: one batch, or a text pair of two batches
    (keras-hub packs more, whose third segment id its BERT has no row for; ours refuses them).
    Columns of different lengths were named only when both were lists or arrays: a string
    tensor of another length reached the packer ("Shapes of all inputs must
    match", "Dimensions 2 and 1 are not compatible"), a tuple of tuples gave an IndexError,
    the preprocessor called directly a packer error, a dataset of such pairs a graph error."""
    texts = ["good film", "bad film"]
    lengths = "columns of different lengths: column 0 has 2 examples, column 1 has 1"
    for pair in ((texts, tf.constant(["a"])), (tf.constant(texts), tf.constant(["a"])),
                 (np.array(texts), ["a"])):
        for call in (lambda: classifier.predict(pair, verbose=0),
                     lambda: classifier.predict_on_batch(pair),
                     lambda: classifier.fit(pair, [0, 1], verbose=0)):
            with pytest.raises(ValueError, match="TextClassifier got " + lengths):
                call()
        with pytest.raises(ValueError, match="TextClassifierPreprocessor got " + lengths):
            classifier.preprocessor(pair)
    with pytest.raises(ValueError, match=r"TextClassifier reads a tuple as columns, each a "
                                         r"batch; got column 0 as a tuple \('good film', "):
        classifier.predict((tuple(texts), tuple(texts)), verbose=0)
    uneven = tf.data.Dataset.zip((tf.data.Dataset.from_tensors(tf.constant(texts)),
                                  tf.data.Dataset.from_tensors(tf.constant(["a"]))))
    unknown = tf.data.Dataset.from_generator(  # batch sizes known only in the graph
        lambda: iter([(texts, ["a"])]), output_signature=(tf.TensorSpec([None], tf.string),) * 2)
    for data in (uneven, unknown):
        with pytest.raises(ValueError, match=r"segments of different batch sizes: segment 0 has "
                                             r"2 examples, segment 1 has 1"):
            classifier.predict(data, verbose=0)
    with pytest.raises(ValueError, match="TextClassifier takes one or two segments, got 3"):
        classifier.predict((texts, texts, texts), verbose=0)
    # real pairs, and a tuple of one batch (one segment)
    pair = classifier.predict((texts, texts), verbose=0)
    for same in ((tf.constant(texts), tf.constant(texts)), (np.array(texts), texts),
                 tf.data.Dataset.from_tensor_slices((texts, texts)).batch(2)):
        np.testing.assert_allclose(classifier.predict(same, verbose=0), pair, atol=1e-5)
    np.testing.assert_allclose(classifier.predict((texts,), verbose=0),
                               classifier.predict(texts, verbose=0), atol=1e-6)


def test_fit_and_evaluate_without_labels_say_so(classifier):
    """Keras' message was "None values not supported"."""
    for call, method in ((classifier.fit, "fit"), (classifier.evaluate, "evaluate")):
        with pytest.raises(ValueError, match=rf"TextClassifier.{method} needs labels: got x \(2 "
                                             r"examples\) and y=None"):
            call(["good film", "bad film"])


def test_sample_weights_must_be_finite_non_negative_numbers(classifier):
    """A NaN weight made every model weight NaN silently; weights summing to 0 gave a loss of
    -4e7; strings a graph error at a Cast."""
    texts, labels = ["good film", "bad film"], [1, 0]
    for weights, message in (([1.0, np.nan], r"Invalid sample_weight nan \(flat index 1\): "
                                             r"expected finite, non-negative"),
                             (np.array([1.0, -1.0]), r"Invalid sample_weight -1.0 \(flat index 1"),
                             ([1.0, np.inf], r"Invalid sample_weight inf"),
                             (["x", "y"], r"got sample_weight 'x' \(str\): expected numbers")):
        for call in (classifier.fit, classifier.evaluate):
            with pytest.raises(ValueError, match=message):
                call(texts, labels, sample_weight=weights)
    classifier.evaluate(texts, labels, sample_weight=[0.0, 2], verbose=0)  # zero is a weight


def test_on_batch_methods_take_raw_text_as_keras_hub_s_do(classifier):
    """keras-hub's `predict_on_batch` / `test_on_batch` / `train_on_batch` run the task's
    preprocessor; ours gave Keras' input error for a list of strings."""
    texts, labels = ["good film", "a bad and long film"], np.array([1, 0])
    np.testing.assert_allclose(classifier.predict_on_batch(texts),
                               classifier.predict(texts, verbose=0), atol=1e-5)
    tested = classifier.test_on_batch(texts, labels, return_dict=True)
    evaluated = classifier.evaluate(texts, labels, return_dict=True, verbose=0)
    assert tested["loss"] == pytest.approx(evaluated["loss"], rel=1e-5)
    steps = int(classifier.optimizer.iterations)
    assert np.isfinite(classifier.train_on_batch(texts, labels, return_dict=True)["loss"])
    assert int(classifier.optimizer.iterations) == steps + 1
    with pytest.raises(ValueError, match=r"Invalid label 2 \(flat index 1 of the labels\)"):
        classifier.train_on_batch(texts, [0, 2])


def test_validation_split_holds_out_the_last_examples_as_keras_does(classifier):
    """keras-hub's tasks split in-memory arrays; ours got Keras' "only supported for tensors or
    NumPy arrays ... _RepeatDataset". The last 25% (before shuffling) is the validation data,
    the rest trains (6 examples: one step of 6)."""
    texts = np.array(["good film", "bad film", "fine acting", "dull plot"] * 2, dtype=object)
    labels = np.array([1, 0, 1, 0, 1, 1, 0, 0])
    weights = classifier.get_weights()
    # (the module's classifier: compiled by an earlier test's fit, or not yet: fit compiles it)
    optimizer = getattr(classifier, "optimizer", None)
    steps = int(optimizer.iterations) if optimizer is not None and optimizer.built else 0
    split = classifier.fit(texts, labels, validation_split=0.25, epochs=1, batch_size=6,
                           verbose=0).history
    assert int(classifier.optimizer.iterations) == steps + 1
    held_out = classifier.evaluate(texts[6:], labels[6:], return_dict=True, verbose=0)
    assert split["val_loss"] == pytest.approx([held_out["loss"]], rel=1e-6)
    assert split["val_accuracy"] == pytest.approx([held_out["accuracy"]])
    pairs = classifier.fit((list(texts), list(texts)), labels, validation_split=0.5, epochs=1,
                           verbose=0).history  # a tuple of columns is split column by column
    assert "val_accuracy" in pairs
    classifier.set_weights(weights)
    for bad, message in ((1.5, r"validation_split must be a float between 0 and 1.*1.5"),
                         (True, r"validation_split must be a float between 0 and 1.*True"),
                         (0.99, r"validation_split=0.99 of 8 examples leaves no training")):
        with pytest.raises(ValueError, match=message):
            classifier.fit(texts, labels, validation_split=bad)
    ds = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(4)
    with pytest.raises(ValueError, match=r"validation_split only for in-memory examples.*"
                                         r"pass validation_data"):
        classifier.fit(ds, validation_split=0.25)


@pytest.mark.multibackend
def test_text_for_a_task_without_a_preprocessor_says_what_to_build():
    """keras-hub's `TextClassifier(backbone, num_classes, preprocessor=None)` then `fit` on
    strings: Keras' own error was "Invalid dtype: str384"."""
    task = kb.tasks.TextClassifier(_backbone(num_layers=1), num_classes=2)
    texts = ["good film", "bad film"]
    expected = r"TextClassifier has no preprocessor, so it takes token ids .*got text \({}\)"
    for x, what in ((texts, "a list of 2 strings"),
                    (np.array(texts), r"ndarray of strings with shape \(2,\)"),
                    (np.array(texts, object), r"ndarray of strings with shape \(2,\)"),
                    ({"token_ids": tf.constant(texts)},
                     r"EagerTensor of strings with shape \(2,\)"),
                    (tf.data.Dataset.from_tensor_slices((texts, [0, 1])).batch(2),
                     r"TensorSpec of strings with shape \(None,\)")):
        for call in (lambda: task.fit(x, [0, 1] if not isinstance(x, tf.data.Dataset) else None,
                                      verbose=0),
                     lambda: task.predict(x, verbose=0)):
            with pytest.raises(ValueError, match=expected.format(what)) as error:
                call()
            assert "default_preprocessor(tokenizer, backbone)" in str(error.value)
    ids = {"token_ids": np.array([[2, 31, 3, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
           "padding_mask": np.array([[1, 1, 1, 0]])}
    assert task.predict(ids, verbose=0).shape == (1, 2)  # token ids still pass


def test_mask_selection_rate_types_and_zero_are_consistent():
    from keras_bertfam.preprocessing import (
        NgramMasker,
        SpanMasker,
        TokenMasker,
        WholeWordMasker,
    )

    common = dict(vocabulary=list(VOCAB), mask_selection_length=4, seed=1,
                  unselectable_token_ids=[0, 2, 3])
    TokenMasker(mask_selection_rate=np.float32(0.15), **common)
    TokenMasker(mask_selection_rate=np.float64(0.5), **common)
    for bad in (True, np.bool_(True), "0.15", None):
        with pytest.raises(ValueError, match="mask_selection_rate must be a number in"):
            TokenMasker(mask_selection_rate=bad, **common)
    ids = tf.constant([[2, 31, 32, 33, 34, 35, 3, 0]])
    for cls in (TokenMasker, WholeWordMasker, NgramMasker, SpanMasker):
        masker = cls(mask_selection_rate=0.0, **common)
        assert float(tf.reduce_sum(masker(ids)["mask_weights"])) == 0.0, cls.__name__
        assert float(tf.reduce_sum(
            cls(mask_selection_rate=0.5, **common)(ids)["mask_weights"])) > 0, cls.__name__


# === Corpora ===
def test_a_long_single_line_streams_in_bounded_pieces(tmp_path):
    from keras_bertfam.preprocessing import corpus

    words = [f"w{i}." for i in range(60_000)]  # ~400 KB on one line
    path = tmp_path / "one_line.txt"
    path.write_text(" ".join(words))
    docs = corpus.read_corpus(str(path), document_format="line", max_document_bytes=10_000)
    pieces = [d.decode() for d in docs.as_numpy_iterator()]
    assert len(pieces) >= 40 and max(len(p) for p in pieces) <= 10_000 + 1000
    assert " ".join(pieces).split() == words  # cut at whitespace: nothing lost or split
    # The pretraining pipeline's first batch needs only the first pieces.
    pre = kb.preprocessing.MaskedLMPreprocessor(_tokenizer(), sequence_length=16,
                                                packing="full_sentences", batch_size=4)
    first = next(iter(pre.prepare(docs.take(2))))
    assert first[0]["token_ids"].shape == (4, 16)
    cut = corpus.split_long_document(tf.constant("x" * 40 + "é" * 30), 16)
    assert b"".join(cut.numpy()).decode() == "x" * 40 + "é" * 30  # valid UTF-8
    # Long and short documents mixed, empty ones too: every piece of each in the documents'
    # order, the short ones whole (the later stages see at most about max_document_bytes).
    lines = ["a" * 30, "one two three four five six seven eight nine", "", "é" * 25, "short"]
    path.write_text("\n".join(lines))
    pieces = [d.decode() for d in corpus.read_corpus(
        str(path), document_format="line", max_document_bytes=16).as_numpy_iterator()]
    assert pieces == ["a" * 16, "a" * 14, "one two three four", "five six seven", "eight nine",
                      "é" * 8, "é" * 8, "é" * 8, "é", "short"]
    for bad in (8, 10.5, "1000", True):
        with pytest.raises(ValueError, match=f"max_document_bytes must be an int >= 16.*{bad!r}"):
            corpus.read_corpus(str(path), max_document_bytes=bad)


def test_binary_files_in_a_corpus_are_skipped_with_a_warning(tmp_path):
    from keras_bertfam.preprocessing import corpus

    (tmp_path / "a.txt").write_text("A real document. With two sentences.")
    (tmp_path / "b.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.warns(UserWarning, match=r"Skipping '.*b\.bin'.*looks like a binary file"):
        docs = list(corpus.read_corpus(str(tmp_path)).as_numpy_iterator())
    assert docs == [b"A real document. With two sentences."]


def test_pretraining_on_a_corpus_without_documents_says_so():
    empty = tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
    filtered = tf.data.Dataset.from_tensor_slices(["", ""]).filter(
        lambda t: tf.strings.length(t) > 0)
    for pre in (kb.preprocessing.MaskedLMPreprocessor(_tokenizer(), sequence_length=16),
                kb.preprocessing.SentencePairPreprocessor(_tokenizer(), sequence_length=16)):
        for ds in (empty, filtered, []):
            with pytest.raises(ValueError, match="corpus with no documents"):
                pre.prepare(ds)


def test_pretraining_texts_in_another_shape_are_named():
    """A keras-hub user's first pretraining script passes what a fine-tuning task takes: a
    dict or DataFrame of columns (was "'dict' object has no attribute 'dtype'"), documents as
    lists of sentences (TensorFlow's "non-rectangular Python sequence"), a tuple of columns or
    a 2-D array (a graph error in the epoch's pipeline). Refused by name, by the task's fit and
    by the preprocessor alike, before any pipeline is built."""
    texts = ["the cat sat on the mat", "a dog ran in the park"] * 4
    pre = kb.preprocessing.MaskedLMPreprocessor(_tokenizer(), sequence_length=16, batch_size=4)
    task = kb.tasks.MaskedLM(_backbone(num_layers=1), preprocessor=pre)
    cases = [({"text": texts}, r"got a dict of columns \['text'\].*x\['text'\]"),
             ([["the cat sat", "on the mat"], ["a dog"]],
              r"takes raw text: .*; got a list whose item 0 is a list \['the cat sat', "),
             (texts[:3] + [None], "item 3 is None|None at index 3"),
             ((texts, texts), "a tuple of 2 columns: pretraining is self-supervised"),
             (np.array([texts, texts]), r"got a NumPy array of rank 2 \(shape \(2, 8\)\)")]
    for x, message in cases:
        with pytest.raises(ValueError, match=message):
            task.fit(x, epochs=1, verbose=0)
        if not isinstance(x, tuple):  # the preprocessor's own message for a tuple: no labels
            with pytest.raises(ValueError, match=message):
                pre.prepare(x)
    assert int(np.asarray(task.optimizer.iterations)) == 0


def test_fit_that_gets_no_batch_says_so_instead_of_an_empty_history():
    """A first ALBERT script fits AlbertPretrainer on one-sentence strings: sentence-order
    prediction makes no example of a one-sentence document, the data gave no batch, and fit
    returned an empty history, silently, having trained nothing. Now an error naming the
    reason; the same for a dataset filtered to nothing."""
    texts = ["the film is good.", "the film is dull."] * 2
    albert = _albert(num_layers=1)
    pretrainer = kb.tasks.AlbertPretrainer(albert, preprocessor=kb.preprocessing.
                                           SentencePairPreprocessor(_tokenizer(), 16, pairer=kb.
                                                                    preprocessing.
                                                                    SentenceOrderPairer(16)))
    with pytest.raises(ValueError, match=r"AlbertPretrainer.fit ran no training step.*"
                                         r"SentenceOrderPairer makes no example of a document "
                                         r"of one sentence.*pairer=SentenceOrderPairer\(16, "
                                         r"single_sentence='random_document'\)"):
        pretrainer.fit(texts, batch_size=2, verbose=0)
    assert int(pretrainer.optimizer.iterations) == 0
    two = ["the film is good. the film is great.", "the film is bad. the film is dull."]
    assert np.isfinite(pretrainer.fit(two, batch_size=2, verbose=0).history["loss"][0])

    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    xlnet = kb.tasks.XLNetPretrainer(
        kb.models.XLNetBackbone(len(VOCAB), 1, 2, 16, 32),
        preprocessor=XLNetPreprocessor(_tokenizer(), 16, batch_size=2, use_eod=False))
    with pytest.raises(ValueError, match=r"XLNetPretrainer.fit ran no training step.*windows "
                                         r"of batch_size \* row_len = 2 \* \d+ = \d+ tokens"):
        xlnet.fit(texts, verbose=0)

    classifier = kb.tasks.TextClassifier(_backbone(num_layers=1), num_classes=2)
    x = {"token_ids": np.full((4, 8), 5, "int32"), "padding_mask": np.ones((4, 8), "int32")}
    nothing = tf.data.Dataset.from_tensor_slices((x, [0, 1, 0, 1])).filter(
        lambda *_: False).batch(2)
    with pytest.raises(ValueError, match=r"TextClassifier.fit ran no training step.*dataset "
                                         r"is not empty"):
        classifier.fit(nothing, verbose=0)


def test_a_diverged_model_is_not_saved_as_a_preset(tmp_path):
    backbone = _backbone()
    kernel = backbone.pooler_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(ValueError, match=r"variable '.*pooler.*kernel' holds NaN or inf"):
        backbone.save_to_preset(str(tmp_path / "nan"))
    assert not os.path.exists(str(tmp_path / "nan" / kb.presets.MANIFEST))


def test_an_epoch_of_unknown_length_takes_one_optimizer_step_per_batch():
    """Keras' TF trainer reads one batch past the end of a dataset of unknown length (our
    preprocessors' datasets are); that step's data-independent ops (the iteration count,
    AdamW's weight decay) must not run: the same weights as on the same data of known length.
    Such an epoch is one pass by design: no "Your input ran out of data" warning (Keras' own,
    kept for a `steps_per_epoch` the data cannot fill)."""
    import warnings

    import keras

    texts = tf.data.Dataset.from_tensor_slices(
        (["good film", "bad film", "a film", "good"] * 2, [0, 1] * 4)).batch(4)
    runs = []
    for data in (texts, texts.filter(lambda x, y: True)):
        assert data.cardinality().numpy() in (2, tf.data.UNKNOWN_CARDINALITY)
        keras.utils.set_random_seed(0)
        clf = kb.tasks.TextClassifier(_backbone(num_layers=1), num_classes=2, preprocessor=(
            kb.preprocessing.TextClassifierPreprocessor(_tokenizer(), sequence_length=8)))
        clf.compile(learning_rate=1e-3, warmup_steps=1, total_steps=100)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            clf.fit(data, epochs=2, verbose=0)
        assert not [w for w in caught if "ran out of data" in str(w.message)]
        runs.append((int(clf.optimizer.iterations.numpy()), clf.get_weights()))
    assert runs[0][0] == runs[1][0] == 4
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    with pytest.warns(UserWarning, match="ran out of data"):
        clf.fit(data, steps_per_epoch=3, epochs=1, verbose=0)


@pytest.mark.multibackend
def test_a_failed_fit_evaluate_or_predict_loses_nothing():
    """A data error at the first batch of `fit`, or at any batch of `evaluate` / `predict`,
    leaves the weights as they were and the model usable (Keras' JAX loops had emptied every
    variable). The failed fit trained nothing, so it does not size `compile()`'s auto schedule
    either: the next fit sizes it from its own length and traces its step anew, giving the
    weights of a task that never met the failures."""
    import keras

    def task():
        keras.utils.set_random_seed(0)
        # no dropout anywhere (the head's too): on torch a failed step's forward pass has
        # drawn dropout seeds, which a fresh task has not, and this test compares weights
        clf = kb.tasks.TextClassifier(_backbone(num_layers=1, dropout=0.0), num_classes=2,
                                      dropout=0.0,
                                      preprocessor=kb.preprocessing.TextClassifierPreprocessor(
                                          _tokenizer(), sequence_length=8))
        clf.compile(learning_rate=1e-2)
        return clf

    texts = ["good film", "bad film", "a film", "good"] * 2
    failed = task()
    before = failed.get_weights()

    def unchanged():
        for a, b in zip(before, failed.get_weights()):
            np.testing.assert_array_equal(a, b)

    bad = tf.data.Dataset.from_tensor_slices((texts * 4, [7, 0] * 16)).batch(4)  # 8 batches
    with pytest.raises(Exception, match="Invalid label"):
        failed.fit(bad, epochs=2, verbose=0)
    unchanged()
    assert int(keras.ops.convert_to_numpy(failed.optimizer.iterations)) == 0
    with pytest.raises(Exception, match="Invalid label"):  # the second batch
        failed.evaluate(tf.data.Dataset.from_tensor_slices((texts[:4], [0, 1, 7, 0])).batch(2),
                        verbose=0)
    unchanged()

    def batches():
        yield np.array([b"good film", b"bad film"])
        raise ValueError("the second batch is unreadable")

    with pytest.raises(Exception, match="the second batch is unreadable"):
        failed.predict(tf.data.Dataset.from_generator(
            batches, output_signature=tf.TensorSpec([None], tf.string)), verbose=0)
    unchanged()

    good = tf.data.Dataset.from_tensor_slices((texts, [0, 1] * 4)).batch(4)  # 2 batches
    failed.fit(good, epochs=2, verbose=0)
    fresh = task()
    fresh.fit(good, epochs=2, verbose=0)
    for clf in (failed, fresh):
        assert clf.optimizer._learning_rate.total_steps == 4  # not the failed fit's 16
        assert clf.optimizer._learning_rate.warmup_steps == 0  # 10% of 4
    for a, b in zip(failed.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert failed.predict(texts[:4], verbose=0).shape == (4, 2)


# === TensorFlow errors under JAX and PyTorch ===
@pytest.mark.multibackend
def test_a_tensorflow_error_in_a_preprocessing_layer_keeps_its_message_on_every_backend():
    """A preprocessing layer runs TensorFlow ops on every backend. Under JAX and PyTorch, Keras'
    layer call re-raised their errors (a failed input check) as a RuntimeError with an empty
    message: Keras reads a message from `args`, which TensorFlow's errors leave empty. Now the
    same error on every backend: TensorFlow's InvalidArgumentError, also a ValueError, with
    TensorFlow's message and Keras' context (the layer and its arguments)."""
    from keras_bertfam.preprocessing.errors import InvalidInputError

    tokens = kb.preprocessing.TokenClassifierPreprocessor(_tokenizer(), sequence_length=8,
                                                          num_classes=3)
    qa = kb.preprocessing.QuestionAnswererPreprocessor(_tokenizer(), sequence_length=32,
                                                       max_question_length=8)
    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "a": 4, "Ġ": 5, "Ġa": 6}
    bpe = kb.preprocessing.TextClassifierPreprocessor(kb.preprocessing.BytePairTokenizer(
        vocabulary=vocabulary, merges=["Ġ a"]), sequence_length=8)
    cases = [  # a label out of range, an answer that is not where answer_start says
        (lambda: tokens(tf.ragged.constant([["good", "film"]]), tf.ragged.constant([[1, 9]])),
         r"TokenClassifierPreprocessor.call\(\)(.|\n)*Invalid token label 9: the valid range is "
         r"0 to 2 \(num_classes=3\)\."),
        (lambda: tokens(tf.ragged.constant([["good", "film"]]), tf.ragged.constant([[1]])),
         r"TokenClassifierPreprocessor.call\(\)(.|\n)*Each word needs one label: example 0 has 2 "
         r"word\(s\) but 1 label\(s\)\."),
        (lambda: qa((["the film"], ["good film"]), ([0], ["bad"])),
         r"QuestionAnswererPreprocessor(.|\n)*The answer is not in its context at answer_start: "
         r"example 0 has answer_text \"bad\", but its context has \"goo\" there\."),
        # a nested layer's error (the preprocessor's byte-pair tokenizer, whose vocabulary has
        # neither "b" nor an unknown token): carried once, not wrapped again
        (lambda: bpe(["a b"]), r"BytePairTokenizer.call\(\)(.|\n)*BytePairTokenizer: the piece "
                               r"\"b\" .GPT-2's byte symbols. is not in the vocabulary"),
    ]
    for call, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message) as error:
            call()
        assert isinstance(error.value, InvalidInputError)
        assert isinstance(error.value, ValueError)
        assert str(error.value).count("Exception encountered when calling") == 1
        # TensorFlow's assertion formats, not the message: "Summarized data", b'...', \"
        message = str(error.value).split("Arguments received")[0]  # not Keras' argument list
        assert not re.search(r"Summarized data|assertion failed|b'|\\[\"']", message)


def test_tensorflow_errors_are_carried_by_class_without_a_traced_op_s_stack():
    """`carry_tf_error` unit: an InvalidArgumentError leaves a layer's `call` as an
    `InvalidInputError` (also a ValueError) that Keras can rebuild from its message alone (what
    it does under JAX and PyTorch); another TensorFlow error keeps its class, its message in
    `args` (what Keras reads there); a traced op's defining stack and an assertion's C-escaped
    quotes are TensorFlow's noise; anything else is left alone."""
    from keras_bertfam.preprocessing.errors import InvalidInputError, carry_tf_error

    graph = ('Graph execution error:\n\nDetected at node Assert/Assert defined at (most recent '
             'call last):\n  File "a.py", line 1, in <module>\n\n  File "b.py", line 2, in f\n'
             '\nassertion failed: [the piece \\"T\\" is not in it]\n\t [[{{node Assert}}]]')
    carried = carry_tf_error(tf.errors.InvalidArgumentError(None, None, graph))
    assert type(carried) is InvalidInputError and isinstance(carried, ValueError)
    text = carried.args[0]
    assert text == str(carried) and text == 'the piece "T" is not in it'
    # an eager assertion's data: one item a line, strings as bytes literals, C-escaped
    with pytest.raises(tf.errors.InvalidArgumentError, match="Summarized data") as eager:
        tf.debugging.Assert(False, ["Invalid label:", 9,
                                    tf.strings.format("{}", tf.constant('it\'s "x"'))])
    assert carry_tf_error(eager.value).args[0] == 'Invalid label: 9 "it\'s "x""'
    # raised in a tf.data pipeline (a task's fit): said so, TensorFlow's node names dropped
    pipeline = ("{{function_node __wrapped__IteratorGetNext}} Error in user-defined function "
                "passed to ParallelMapDatasetV2:3 transformation with iterator: Iterator::Root: "
                "assertion failed: [the piece \\\"T\\\" is not in it]\n\t [[{{node Assert}}]] "
                "[Op:IteratorGetNext] name: ")
    assert carry_tf_error(tf.errors.InvalidArgumentError(None, None, pipeline)).args[0] == (
        'the piece "T" is not in it (in the tf.data input pipeline)')
    rebuilt = InvalidInputError("in context: " + text)  # Keras' rebuild under JAX / PyTorch
    assert str(rebuilt) == "in context: " + text and carry_tf_error(rebuilt) is None
    assert InvalidInputError(None, None, "m", 3).message == "m"  # Keras' rebuild under TF
    other = carry_tf_error(tf.errors.NotFoundError(None, None, "no such file"))
    assert type(other) is tf.errors.NotFoundError and other.args == ("no such file",)
    assert carry_tf_error(RuntimeError("ours")) is None
    assert carry_tf_error(ValueError("ours")) is None


def test_every_preprocessing_layer_keeps_tensorflow_errors():
    """Every Keras layer of `kb.preprocessing` runs TensorFlow ops on every backend, so each
    has `KeepsTFErrors` (a new layer cannot miss it)."""
    import inspect

    import keras

    from keras_bertfam.preprocessing.errors import KeepsTFErrors

    layers = [cls for _, cls in inspect.getmembers(kb.preprocessing, inspect.isclass)
              if issubclass(cls, keras.layers.Layer)]
    assert len(layers) >= 15
    assert [cls.__name__ for cls in layers if not issubclass(cls, KeepsTFErrors)] == []
    assert [cls.__name__ for cls in layers if not hasattr(cls.call, "__wrapped__")] == []


@pytest.mark.multibackend
def test_labels_as_a_dict_for_a_task_with_one_output_are_named(classifier, tagger):
    """`fit(x, y={"labels": ...})` gave Keras' "Expected any non-tensor type, but got a tensor
    instead" (no preprocessor) or "Could not build a TypeSpec for {'labels': ...}" (raw text).
    keras-hub's tasks take no dict for their one output either (its TextClassifier: "Expected
    float32, but got labels of type 'str'"): our error names the keys and the fix, on every
    route."""
    texts, labels = ["good film", "bad film"], np.array([1, 0])
    expected = (r"TextClassifier takes its labels as one array \(one entry per example\), got "
                r"{} with keys \['labels'\]: the task has one output; {}")
    in_memory = expected.format("y as a dict", r"pass the array itself, e.g. y=y\['labels'\]")
    ids = {"token_ids": np.array([[2, 31, 3, 0]] * 2), "segment_ids": np.zeros((2, 4), "int32"),
           "padding_mask": np.array([[1, 1, 1, 0]] * 2)}
    bare = kb.tasks.TextClassifier(_backbone(num_layers=1), num_classes=2)
    for call in (lambda: classifier.fit(texts, {"labels": labels}, verbose=0),
                 lambda: classifier.evaluate(texts, {"labels": labels}, verbose=0),
                 lambda: classifier.train_on_batch(texts, {"labels": labels}),
                 lambda: bare.fit(ids, {"labels": labels}, verbose=0),
                 lambda: bare.test_on_batch(ids, {"labels": labels})):
        with pytest.raises(ValueError, match=in_memory):
            call()
    ds = tf.data.Dataset.from_tensor_slices((texts, {"labels": labels})).batch(2)
    with pytest.raises(ValueError, match=expected.format(
            "a dataset whose labels are a dict",
            r"map it to \(x, labels\), e.g. ds.map\(lambda x, y: \(x, y\['labels'\]\)\)")):
        classifier.fit(ds, verbose=0)
    with pytest.raises(ValueError, match=r"TextClassifierPreprocessor takes the labels "
                                         r"themselves, not a dict: got labels with keys "
                                         r"\['labels'\]"):
        classifier.preprocessor.prepare(ds)  # the preprocessor alone
    assert tagger.labels_are_one_array and kb.tasks.MultipleChoice.labels_are_one_array
    # a dict stays the format of the tasks whose labels are one (a pretrainer's mask_ids and
    # mask_weights, a QuestionAnswerer's positions)
    assert not kb.tasks.MaskedLM.labels_are_one_array
    assert not kb.tasks.QuestionAnswerer.labels_are_one_array


@pytest.mark.multibackend
def test_a_hostile_script_s_inputs_are_named(classifier, regressor):
    """A list of numbers as texts (the tokenizer's "takes strings, got a tensor of int32"), a
    generator or a set as x or y (TensorFlow's "Attempt to convert a value (<generator ...>)"),
    a missing label (our own TypeError: "'NoneType' object is not iterable") or regression
    target: each named, with what was expected, before any step."""
    texts = ["good film", "bad film"]
    cases = [
        (lambda: classifier.predict([1, 2], verbose=0),
         r"TextClassifier got a list of texts whose item 0 is 1 \(int\): expected a string"),
        (lambda: classifier.fit((t for t in texts), [1, 0], verbose=0),
         r"TextClassifier got x as a generator: expected a list or an array \(one entry per "
         r"example\), or a tf.data.Dataset. Pass list\(...\), or for a stream "
         r"tf.data.Dataset.from_generator"),
        (lambda: classifier.predict(set(texts), verbose=0),
         r"TextClassifier got x as a set: .*A set has no order"),
        (lambda: classifier.evaluate(texts, iter([1, 0]), verbose=0),
         r"TextClassifier got y as a list_iterator: expected a list or an array"),
        (lambda: classifier.fit(texts, [1, None], verbose=0),
         r"Invalid label None \(flat index 1 of the labels\): expected an integer class id "
         r"from 0 to 1 \(num_classes=2\). Drop or fill missing labels first."),
    ]
    cases.append((lambda: regressor.fit(texts, [0.5, None], verbose=0),
                  r"Invalid regression target None \(flat index 1\): expected a finite number"))
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.multibackend
def test_a_hostile_script_s_inputs_to_a_token_classifier_and_a_tokenizer(tagger):
    """A token classifier given a table (a pandas DataFrame, a dict: "KeyError: 0") or labels
    as an array of rows (a pandas Series of lists, an object array: "'EagerTensor' object has
    no attribute 'ragged_rank'"), and a tokenizer given a generator, a set, a dict or None
    (TensorFlow's "Attempt to convert a value"): named, or taken as lists are."""
    task = tagger

    class Frame:  # what the task reads of a pandas DataFrame (the tests run without pandas)
        columns = ["words", "tags"]

    for x, what in ((Frame(), r"a Frame of columns \['words', 'tags'\]: pass one column, "
                              r"e.g. x\['words'\]"),
                    ({"words": [["good"]]}, r"a dict of columns \['words'\]")):
        with pytest.raises(ValueError, match=r"TokenClassifier takes sentences \(a list of "
                                             r"strings\) or their words .*got " + what):
            task.predict(x, verbose=0)
    rows = np.empty(2, object)
    rows[:] = [[1, 0], [2]]  # a pandas Series of lists is such an array of rows
    history = task.fit([["good", "film"], ["bad"]], rows, verbose=0).history
    assert np.isfinite(history["loss"][0])
    tokenizer = _tokenizer()
    for bad, kind in (((t for t in ["a"]), "generator"), ({"a"}, "set"), ({"text": "a"}, "dict"),
                      (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"WordPieceTokenizer takes texts \(a string, a list "
                                            rf"or array of strings, a string tensor\), got a "
                                            rf"{kind}"):
            tokenizer(bad)


@pytest.mark.multibackend
def test_raw_text_in_another_shape_is_named_by_every_preprocessor_and_task(classifier):
    """A preprocessor called directly on a table (a pandas DataFrame) or on lists of lists of
    strings failed deep inside (SegmentPacker's "must be a rank-2 RaggedTensor", a mixed-type
    conversion error), as did a task's fit on a one-column DataFrame; a dict of raw-text
    columns gave a fine-tuning task's fit TensorFlow's "Could not build a TypeSpec" (keras-hub's
    tasks take a dict of preprocessed features, raw text as a batch or a tuple of segments).
    Each is named now, with its columns, type or shape and what is taken, by the task and by
    its preprocessor alike (`check_text_batch`)."""

    class Frame:  # what is read of a pandas DataFrame (the tests run without pandas)
        columns = ["text", "label"]

    pre = classifier.preprocessor
    takes = (r"TextClassifierPreprocessor takes a batch of texts \(a list, 1-D array or pandas "
             r"Series of strings, a string tensor \[B\]\), or a tuple of two such batches for "
             r"text pairs; got ")
    task_takes = takes.replace("TextClassifierPreprocessor", "TextClassifier")
    texts = ["good film", "bad film"]
    cases = [
        (lambda: pre(Frame()), takes + r"a Frame of columns \['text', 'label'\]: pass one column, "
                                       r"e.g. x\['text'\]"),
        (lambda: pre([texts, ["a", "b"]]),
         takes + r"a list whose item 0 is a list \['good film', 'bad film'\]"),
        (lambda: pre(np.array([texts])), takes + r"a NumPy array of rank 2 \(shape \(1, 2\)\)"),
        (lambda: pre(tf.ragged.constant([["a"], ["b", "c"]])),
         takes + r"a RaggedTensor of rank 2 \(shape \(2, None\)\)"),
        (lambda: pre.prepare(tf.data.Dataset.from_tensor_slices(np.array([texts])).batch(1)),
         takes + r"a tf.Tensor of rank 2 \(shape \(None, 2\)\)"),
        (lambda: classifier.fit(Frame(), [1, 0], verbose=0),
         task_takes + r"a Frame of columns \['text', 'label'\]"),
        (lambda: classifier.fit({"text": texts}, [1, 0], verbose=0),
         task_takes + r"a dict of columns \['text'\]: pass one column, e.g. x\['text'\]"),
        (lambda: classifier.predict({"text": texts}, verbose=0),
         task_takes + r"a dict of columns \['text'\]"),
        (lambda: classifier.predict({"token_ids": np.zeros((1, 4), "int32")}, verbose=0),
         task_takes + r"a dict of columns \['token_ids'\]: model inputs. A task with a "
                      r"preprocessor takes raw text; build it with preprocessor=None"),
        (lambda: classifier.predict(np.array("good film"), verbose=0),
         r"TextClassifier takes a batch of examples, got a 0-d ndarray"),
    ]
    tokens = kb.preprocessing.TokenClassifierPreprocessor(_tokenizer(), sequence_length=8)
    cases.append((lambda: tokens([[["good"]]]),
                  r"TokenClassifierPreprocessor takes sentences \(a list of strings\) or their "
                  r"words \(a list of word lists, a RaggedTensor\); got a list whose item 0 is a "
                  r"list \[\['good'\]\] \(lists nested deeper than words\)"))
    qa = kb.preprocessing.QuestionAnswererPreprocessor(_tokenizer(), sequence_length=32,
                                                       max_question_length=8)
    cases.append((lambda: qa(texts), r"QuestionAnswererPreprocessor takes a tuple \(questions, "
                                     r"contexts\): two batches of strings \[B\]; got a list of 2 "
                                     r"items"))
    choices = kb.preprocessing.MultipleChoicePreprocessor(_tokenizer(), sequence_length=16)
    cases.append((lambda: choices({"context": texts}),
                  r"MultipleChoicePreprocessor takes a tuple \(contexts, choices\).*; got a dict"))
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # what is clear works: a pandas Series (1-D), labels given as Python lists to a direct call
    # (was "'list' object has no attribute 'dtype'"), word lists of different lengths
    assert pre(np.array(texts, object), [1, 0])[0]["token_ids"].shape == (2, 16)
    x, y, w = tokens([["good", "film"], ["bad"]], [[1, 0], [2]])
    assert y.shape == w.shape == (2, 8)
    with pytest.raises(ValueError, match=r"Invalid label 5: the valid range is 0 to 1 "
                                         r"\(num_classes=2\)\."):
        pre(texts, [1, 5])


@pytest.mark.multibackend
def test_class_labels_as_rows_of_different_lengths_are_named(classifier):
    """TensorFlow's "Can't convert non-rectangular Python sequence to Tensor" before."""
    texts = ["good film", "bad film"]
    for labels, rows in (([[0], [1, 0]], r"row 0 has 1 value\(s\) \(\[0\]\), row 1 has 2 "
                                         r"value\(s\) \(\[1, 0\]\)"),
                         ([0, [1]], r"row 0 has a scalar \(0\), row 1 has 1 value\(s\)")):
        with pytest.raises(ValueError, match=r"TextClassifier takes one class id per example "
                                             r"\(labels of shape \(N,\) or \(N, 1\)\); got "
                                             r"labels as rows of different lengths: " + rows):
            classifier.fit(texts, labels, verbose=0)


@pytest.mark.multibackend
def test_a_pipeline_s_error_reads_as_a_direct_call_s_on_every_backend():
    """A check failing in a task's data pipeline (fit) or in its in-memory preprocessing
    (predict) surfaced as TensorFlow's message: C-escaped (the piece \\"b\\", GPT-2\\'s), between
    TensorFlow's node names and "Summarized data" or "assertion failed" formats; now the text of
    the preprocessor's own error, on every backend, saying when it came from the pipeline."""
    from keras_bertfam.preprocessing.errors import InvalidInputError

    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "a": 4, "Ġ": 5, "Ġa": 6}
    tokenizer = kb.preprocessing.BytePairTokenizer(vocabulary=vocabulary, merges=["Ġ a"])
    task = kb.tasks.TextClassifier(
        kb.models.RobertaBackbone(vocabulary_size=7, num_layers=1, num_heads=2, hidden_dim=8,
                                  intermediate_dim=16, max_sequence_length=16),
        num_classes=2, preprocessor=kb.preprocessing.TextClassifierPreprocessor(
            tokenizer, sequence_length=8))
    refusal = (r"^BytePairTokenizer: the piece \"b\" \(GPT-2's byte symbols\) is not in the "
               r"vocabulary, .* or one with an unknown token\.")
    ds = tf.data.Dataset.from_tensor_slices((["a b"], [0])).batch(1)
    for call, where in ((lambda: task.fit(["a b", "a"], [0, 1], verbose=0), " (in the tf.data "
                                                                            "input pipeline)"),
                        (lambda: task.fit(ds, verbose=0), " (in the tf.data input pipeline)"),
                        (lambda: task.predict(["a b"], verbose=0), "")):
        with pytest.raises(InvalidInputError, match=refusal + re.escape(where) + "$"):
            call()
    labels = tf.data.Dataset.from_tensor_slices((["a", "a"], [0, 7])).batch(2)
    with pytest.raises(ValueError, match=r"^Invalid label 7: the valid range is 0 to 1 "
                                         r"\(num_classes=2\)\. \(in the tf.data input pipeline\)$"):
        task.fit(labels, verbose=0)


def test_a_pair_s_shape_is_checked_once_on_each_path(chooser, monkeypatch):
    """A task with a pair preprocessor checked x's shape (`check_pair`) twice on its in-memory
    path: itself, to name the task, then the preprocessor's `call` again. Now once where x
    enters: the task's `_prepare` (in memory), the preprocessor's `__call__` (a direct call),
    its `prepare` (a dataset's element spec); `call` no more."""
    choices, pre = chooser, chooser.preprocessor
    checked = []
    check_pair = type(pre).check_pair
    monkeypatch.setattr(type(pre), "check_pair",
                        lambda self, x, who=None: checked.append(who) or check_pair(self, x, who))
    x = (["the film", "a film"], [["is good", "is bad"], ["is dull", "is great"]])
    for call, who in ((lambda: choices.predict(x, verbose=0), "MultipleChoice"),
                      (lambda: pre(x), None),
                      (lambda: choices.predict(tf.data.Dataset.from_tensors(x), verbose=0),
                       None)):
        checked.clear()
        call()
        assert checked == [who]
    with pytest.raises(ValueError, match=r"MultipleChoicePreprocessor takes a tuple \(contexts, "
                                         r"choices\).*; got a tuple of 1 items: \(TensorSpec"):
        choices.predict(tf.data.Dataset.from_tensors(x[0]), verbose=0)


@pytest.mark.multibackend
def test_a_sweep_of_hostile_inputs_to_every_fine_tuning_task(classifier, tagger, chooser):
    """Each was a Python or TensorFlow error about something else: an object array of mixed
    types (a pandas column with a number: "Unsupported object type int"), an empty tuple
    (IndexError), labels as a 0-d array ("len() of unsized object"), a dataset without labels
    ("None values not supported"), of dicts ("Could not build a TypeSpec") or of single
    examples (Keras' "Invalid input shape ... padding_mask"), token labels one per sentence
    ("The rank of a RaggedTensor must be greater than 1"), a list as a QA / multiple-choice x
    ("tuple index out of range"), QA labels as class ids ("'int' object is not iterable"),
    choice labels as rows of different lengths (TensorFlow's "non-rectangular")."""
    texts = ["good film", "bad film"]
    mixed = np.array(["good", 3], object)
    tokens, choices = tagger, chooser
    qa = kb.tasks.QuestionAnswerer(_backbone(num_layers=1), preprocessor=(
        kb.preprocessing.QuestionAnswererPreprocessor(_tokenizer(), sequence_length=32,
                                                      max_question_length=8)))
    batches = tf.data.Dataset.from_tensor_slices
    cases = [
        (lambda: classifier.predict(mixed, verbose=0),
         r"TextClassifier got a list of texts whose item 1 is 3 \(int\): expected a string"),
        (lambda: tokens.fit(mixed, [[0], [1]], verbose=0), r"item 1 is 3 \(int\)"),
        (lambda: classifier.predict((), verbose=0),
         r"TextClassifier got an empty tuple: it takes a batch of texts"),
        (lambda: classifier.fit(texts, np.array(1), verbose=0),
         r"TextClassifier got y as a 0-d array \(array\(1\)\): y needs one entry per example "
         r"\(2 here\)"),
        (lambda: classifier.fit(batches(texts).batch(2), verbose=0),
         r"TextClassifier.fit needs labels: got a dataset whose elements are raw examples alone"),
        (lambda: classifier.evaluate(batches((texts, texts)).batch(2), verbose=0),
         r"TextClassifier got labels of dtype string as the last of a dataset's 2 string "
         r"tensors \(fit and evaluate take labels: a text pair alone has none, its labels go as "
         r"\(\(first, second\), labels\)\)"),  # (or a text pair's labels as strings)
        (lambda: classifier.fit(batches(({"text": texts}, [0, 1])).batch(2), verbose=0),
         r"TextClassifierPreprocessor takes a batch of texts .*; got a dict of columns "
         r"\['text'\]"),
        (lambda: classifier.fit(batches((texts, [0, 1])), verbose=0),
         r"TextClassifierPreprocessor takes a dataset of batches: its elements are single "
         r"examples .*Batch it first, e.g. ds.batch\(32\)"),
        (lambda: tokens.fit(batches((texts, [0, 1])).batch(2), verbose=0),
         r"TokenClassifierPreprocessor takes one label per word: labels \[B, \(W\)\] .*got "
         r"labels of shape \(None,\), one per sentence"),
        (lambda: qa.predict(texts, verbose=0),
         r"QuestionAnswerer takes a tuple \(questions, contexts\): two batches of strings \[B\]; "
         r"got a list of 2 items"),
        (lambda: choices.predict(texts, verbose=0),
         r"MultipleChoice takes a tuple \(contexts, choices\)"),
        (lambda: qa.fit((texts, texts), [0, 1], verbose=0),
         r"QuestionAnswerer takes labels y = \(answer_starts, answer_texts\): two lists"),
        (lambda: choices.fit((texts, [["a", "b"], ["c", "d"]]), [[0], [1, 0]], verbose=0),
         r"MultipleChoice takes one choice label per example .*rows of different lengths"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # what stays valid: bytes as texts, a text pair without labels to predict from a dataset
    assert classifier.predict([b"good film"], verbose=0).shape == (1, 2)
    assert classifier.predict(batches((texts, texts)).batch(2), verbose=0).shape == (2, 2)
