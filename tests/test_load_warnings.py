"""The warnings of `Task.from_preset` / `Backbone.from_preset` of an HF checkpoint (its directory;
an HF hub id or a registered name through the local cache: the same warnings, last section).

A load warns exactly when something the loaded model uses keeps its random initialization (a
head the checkpoint does not have; a pooler a TextClassifier reads), naming the tensors and what
to do; never for a part the model does not use (the pooler of a MaskedLM, TokenClassifier or
QuestionAnswerer). A backbone loaded alone drops the checkpoint's heads: its pretraining heads
(MLM, NSP, ...: what a backbone is taken from) silently, a fine-tuned head (the checkpoint's
trained answer) with a warning naming its tensors (HF's "Some weights ... were not used").

HF models are random-initialized from tiny configs and saved to tmp once (nothing downloads).
"""
import shutil
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = transformers
_SMALL = dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=32, max_position_embeddings=66)
_CONFIGS = {
    "Bert": lambda: T.BertConfig(**_SMALL),
    "Roberta": lambda: T.RobertaConfig(**_SMALL, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "Albert": lambda: T.AlbertConfig(**_SMALL, embedding_size=8),
    "Electra": lambda: T.ElectraConfig(**_SMALL, embedding_size=8),
}
_SAVED = ["BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForTokenClassification",
          "BertForSequenceClassification", "BertForQuestionAnswering",
          "RobertaForTokenClassification", "RobertaForSequenceClassification", "RobertaModel",
          "AlbertForMaskedLM", "ElectraForPreTraining", "ElectraForMaskedLM",
          "ElectraModel"]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{HF class name: its saved directory} for the tiny models of `_SAVED`."""
    root = tmp_path_factory.mktemp("hf_load_warnings")
    dirs = {}
    for name in _SAVED:
        family = next(f for f in _CONFIGS if name.startswith(f))
        torch.manual_seed(0)
        getattr(T, name)(_CONFIGS[family]()).save_pretrained(str(root / name))
        dirs[name] = str(root / name)
    return dirs


def _load(cls, path, **kwargs):
    """`cls.from_preset(path)` -> the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if issubclass(cls, kb.tasks.Task):
            kwargs["preprocessor"] = None
        cls.from_preset(path, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def _about(messages, *words):
    return [m for m in messages if all(w in m for w in words)]


# === Parts the task does not use: no warning ===
@pytest.mark.parametrize("saved,task,kwargs", [
    ("BertForMaskedLM", kb.tasks.MaskedLM, {}),
    ("AlbertForMaskedLM", kb.tasks.MaskedLM, {}),
    ("BertForQuestionAnswering", kb.tasks.QuestionAnswerer, {}),
    ("RobertaForTokenClassification", kb.tasks.TokenClassifier, {"num_classes": 2}),
])
def test_task_that_reads_no_pooler_does_not_warn_of_it(hf_dirs, saved, task, kwargs):
    """HF's *ForMaskedLM / *ForTokenClassification / *ForQuestionAnswering save no pooler; our
    MaskedLM, TokenClassifier and QuestionAnswerer never read it: a warning that it is random cried
    wolf on the most common load (a fine-tuned BertForMaskedLM into MaskedLM)."""
    messages = _load(task, hf_dirs[saved], **kwargs)
    assert not _about(messages, "pooler"), messages
    assert not _about(messages, "random"), messages


@pytest.mark.multibackend
def test_masked_lm_from_hf_masked_lm_loads_silently(hf_dirs):
    """The user's path of the brief on every backend: a BertForMaskedLM directory into MaskedLM
    gives no warning at all."""
    assert _load(kb.tasks.MaskedLM, hf_dirs["BertForMaskedLM"]) == []


@pytest.mark.parametrize("saved,task", [
    ("BertForSequenceClassification", kb.tasks.TextClassifier),
    ("RobertaForSequenceClassification", kb.tasks.TextClassifier),  # classifier.dense: the pooler
    ("BertModel", kb.models.BertBackbone),
    # a backbone has no head to miss, and the pretraining heads it drops are declared unused
    ("BertForPreTraining", kb.models.BertBackbone),
    ("ElectraForPreTraining", kb.models.ElectraBackbone),
    ("ElectraForMaskedLM", kb.models.ElectraBackbone),
])
def test_complete_load_is_silent(hf_dirs, saved, task):
    assert _load(task, hf_dirs[saved]) == []


@pytest.mark.multibackend
@pytest.mark.parametrize("saved,load,tensors,task", [
    ("BertForSequenceClassification", kb.models.BertBackbone.from_preset,
     "['classifier.bias', 'classifier.weight']", "TextClassifier"),
    ("BertForSequenceClassification", kb.presets.convert,
     "['classifier.bias', 'classifier.weight']", "TextClassifier"),
    ("BertForQuestionAnswering", kb.models.BertBackbone.from_preset,
     "['qa_outputs.bias', 'qa_outputs.weight']", "QuestionAnswerer"),
    ("RobertaForSequenceClassification", kb.models.RobertaBackbone.from_preset,
     "'classifier.dense.weight', 'classifier.out_proj.bias'", "TextClassifier"),
])
def test_backbone_of_a_fine_tuned_checkpoint_says_its_head_is_not_used(hf_dirs, saved, load,
                                                                       tensors, task):
    """A backbone from a fine-tuned checkpoint dropped its head (`classifier.*`) silently; HF's
    `BertModel.from_pretrained` logs the weights it did not use. A fine-tuned head is the
    checkpoint's trained answer: dropping it is said, naming the tensors and the task that
    loads them, at the caller. The pretraining heads of BertForPreTraining / ElectraForPreTraining
    (the common load of a backbone) stay silent (`test_complete_load_is_silent`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(hf_dirs[saved])
    caught = [w for w in caught if _about([str(w.message)], "were not used")]
    assert len(caught) == 1, caught
    assert _about([str(caught[0].message)], hf_dirs[saved], tensors, saved,
                  f"{task}.from_preset"), caught[0].message
    assert caught[0].filename == __file__, (caught[0].filename, caught[0].lineno)


# === Parts the task uses, left random: a warning naming them ===
@pytest.mark.parametrize("task", [kb.models.BertBackbone, kb.tasks.TextClassifier,
                                  kb.tasks.BertPretrainer])
def test_pooler_still_warns_where_it_is_read(hf_dirs, task):
    """A backbone (its `pooled_output`) and a TextClassifier / BertPretrainer (a head reads the
    pooler) from a checkpoint without one: the pooler is random, said, at the caller (a task's
    warning pointed into keras_bertfam/preset_hooks.py, a fixed stacklevel)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task.from_preset(hf_dirs["BertForMaskedLM"],
                         **({} if task is kb.models.BertBackbone else {"preprocessor": None}))
    found = [w for w in caught if _about([str(w.message)], "pooler.dense", "random")]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert found[0].filename == __file__, (found[0].filename, found[0].lineno)


@pytest.mark.multibackend
@pytest.mark.parametrize("saved,task,tensor,architecture", [
    ("BertModel", kb.tasks.TextClassifier, "classifier.weight", "BertForSequenceClassification"),
    ("RobertaModel", kb.tasks.TextClassifier, "classifier.out_proj.weight",
     "RobertaForSequenceClassification"),
    ("BertModel", kb.tasks.MaskedLM, "cls.predictions.transform.dense.weight", "BertForMaskedLM"),
])
def test_bare_model_into_task_warns_that_the_head_is_new(hf_dirs, saved, task, tensor,
                                                        architecture):
    """A bare `BertModel` directory (e.g. a fine-tuned classifier saved without its head) into
    TextClassifier: the classification head is random; the warning names the missing tensors,
    the task's layers and what to do."""
    messages = _load(task, hf_dirs[saved])
    found = _about(messages, hf_dirs[saved], tensor, "random initialization", architecture)
    assert len(found) == 1, messages
    assert "fit" in found[0], found


def _mlm_logits(task, hf_dir, hf_class):
    """(ours, HF's) MLM logits at a few positions of two rows, HF's model loaded from `hf_dir`."""
    hf = getattr(T, hf_class).from_pretrained(hf_dir).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(5, _SMALL["vocab_size"], (2, 9)).astype("int32")
    positions = np.array([[1, 2, 4], [0, 3, 5]], "int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    sequence = task.backbone(x)["sequence_output"]
    ours = keras.ops.convert_to_numpy(task.mlm_head(sequence, positions))
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids).long(),
                    token_type_ids=torch.tensor(x["segment_ids"]).long()).logits.numpy()
    return ours, np.take_along_axis(theirs, positions[:, :, None], axis=1)


@pytest.mark.multibackend
@pytest.mark.parametrize("saved,task,missing,layer", [
    ("BertForMaskedLM", kb.tasks.BertPretrainer, "cls.seq_relationship.weight", "nsp_head"),
    ("AlbertForMaskedLM", kb.tasks.AlbertPretrainer, "sop_classifier.classifier.weight",
     "sop_head"),
])
def test_pretrainer_from_masked_lm_loads_its_mlm_head(hf_dirs, saved, task, missing, layer):
    """A *ForMaskedLM directory (most domain BERTs on the Hub) into BertPretrainer /
    AlbertPretrainer: the heads loaded all or none, so the MLM head the checkpoint has stayed
    random with the pair head it lacks (continued pretraining started from a loss ~ln(vocab)).
    Now, as HF's *ForPreTraining.from_pretrained, it loads: HF's MLM logits; the warning names
    the pair head's tensors and layer alone."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pretrainer = task.from_preset(hf_dirs[saved], preprocessor=None)
    ours, theirs = _mlm_logits(pretrainer, hf_dirs[saved], saved)
    assert np.abs(ours - theirs).max() <= 1e-4
    caught = [w for w in caught if issubclass(w.category, UserWarning)]
    found = [w for w in caught if _about([str(w.message)], missing, "random initialization",
                                         f"'{layer}/")]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert "mlm_head" not in str(found[0].message), found[0].message
    assert all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]


def test_full_pretraining_checkpoint_loads_both_heads_silently(hf_dirs):
    assert _load(kb.tasks.BertPretrainer, hf_dirs["BertForPreTraining"]) == []
    assert _load(kb.tasks.MaskedLM, hf_dirs["BertForPreTraining"]) == []


def test_head_layer_loads_whole_or_not_at_all(hf_dirs, tmp_path):
    """A BertForPreTraining checkpoint without `cls.predictions.bias`: the MLM head's other
    tensors do not load without it (no half a layer); the NSP head loads. The warning names the
    missing tensor, the MLM head's layers and the tensors it leaves unread, not the NSP head."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(hf_dirs["BertForPreTraining"], tmp_path / "hf")
    weights = str(tmp_path / "hf" / "model.safetensors")
    state = load_file(weights)
    del state["cls.predictions.bias"]
    save_file(state, weights, metadata={"format": "pt"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = kb.tasks.BertPretrainer.from_preset(str(tmp_path / "hf"), preprocessor=None)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    found = _about(messages, "['cls.predictions.bias']", "'mlm_head/transform'",
                   "cls.predictions.transform.dense.weight", "random initialization")
    assert len(found) == 1 and len(messages) == 1, messages
    assert "nsp_head" not in found[0], found
    kernel = keras.ops.convert_to_numpy(task.mlm_head.dense.kernel)
    assert not np.allclose(kernel, state["cls.predictions.transform.dense.weight"].T)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(task.pair_head.dense.kernel),
                                  state["cls.seq_relationship.weight"].T)


def test_head_of_another_task_does_not_warn_twice(hf_dirs):
    """A BertForQuestionAnswering directory into TextClassifier: one warning for the head (the
    checkpoint is another task's), and the pooler's (TextClassifier reads it)."""
    messages = _load(kb.tasks.TextClassifier, hf_dirs["BertForQuestionAnswering"])
    assert len(_about(messages, "head")) == 1, messages
    assert _about(messages, "pooler.dense", "random"), messages


def test_token_classifier_from_hf_directory_of_two_labels(hf_dirs):
    """transformers 5 saves no `id2label` / `num_labels` for HF's default two labels: loading such
    a BertForTokenClassification directory into TokenClassifier without `num_classes` failed with
    "missing 1 required positional argument: 'num_classes'"; it has HF's default, 2, and its
    head."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = kb.tasks.TokenClassifier.from_preset(hf_dirs["BertForTokenClassification"],
                                                    preprocessor=None)
    assert task.num_classes == 2
    assert not [w for w in caught if issubclass(w.category, UserWarning)], caught


def test_convert_task_of_a_bare_model_refuses_without_the_warning(hf_dirs):
    """`convert_task` requires the head: its error says the head is missing; the new-head warning
    of the `from_preset` it calls came first, saying it again (and that the task loaded)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(kb.presets.checkpoints.CheckpointError,
                           match=r"lacks 2 weight\(s\) the TextClassifier head needs"):
            kb.presets.convert_task(hf_dirs["BertModel"], kb.tasks.TextClassifier,
                                    preprocessor=None)
    assert not _about([str(w.message) for w in caught], "random initialization"), caught


# === Heads no HF checkpoint of the directory fills: the same warning ===
def _load_from_here(cls, path, **kwargs):
    """`_load`, checking that each warning points at this file (from_preset's caller)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls.from_preset(path, preprocessor=None, **kwargs)
    caught = [w for w in caught if issubclass(w.category, UserWarning)]
    assert all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]
    return [str(w.message) for w in caught]


def test_spanbert_pretrainer_from_hf_directory_loads_its_mlm_head(hf_dirs):
    """No HF class has SpanBERT's span-boundary head: from an HF directory it started random
    with no word, and the MLM head with it, though a BertForMaskedLM has it (`cls.predictions`).
    The MLM head loads (HF's logits); the warning names the span-boundary head alone."""
    path = hf_dirs["BertForMaskedLM"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = kb.tasks.SpanBertPretrainer.from_preset(path, preprocessor=None)
    ours, theirs = _mlm_logits(task, path, "BertForMaskedLM")
    assert np.abs(ours - theirs).max() <= 1e-4
    caught = [w for w in caught if issubclass(w.category, UserWarning)]
    assert all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]
    messages = [str(w.message) for w in caught]
    found = _about(messages, path, "SpanBertPretrainer", "random initialization", "'sbo_head'",
                   "save_to_preset", "fit")
    assert len(found) == 1 and len(messages) == 1, messages
    assert "mlm_head" not in found[0], found


def test_spanbert_pretrainer_from_bare_model_warns_both_heads_are_new(hf_dirs):
    """A bare BertModel directory: the MLM head is new (the tensors of BertForMaskedLM it lacks
    named) and so is the span-boundary head (no HF class has it)."""
    path = hf_dirs["BertModel"]
    messages = _load_from_here(kb.tasks.SpanBertPretrainer, path)
    assert len(_about(messages, path, "cls.predictions.bias", "BertForMaskedLM",
                      "'mlm_head/transform'", "random initialization")) == 1, messages
    assert len(_about(messages, path, "'sbo_head'", "random initialization")) == 1, messages
    assert len(messages) == 2, messages
    with pytest.raises(kb.presets.checkpoints.CheckpointError,  # strict: the MLM head is required
                       match=r"lacks 5 weight\(s\) the SpanBertPretrainer head needs.*a "
                             r"BertModel checkpoint; SpanBertPretrainer loads its heads from "
                             r"BertForMaskedLM"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kb.presets.convert_task(path, kb.tasks.SpanBertPretrainer, preprocessor=None)


def test_electra_pretrainer_without_generator_preset_warns_its_generator_is_new(hf_dirs):
    """An ElectraForPreTraining directory has the discriminator and its head only: without
    `generator_preset=` the generator and its MLM head were random with no word; the warning
    names them (not the discriminator's head, which loads) and `generator_preset=`."""
    path = hf_dirs["ElectraForPreTraining"]
    messages = _load_from_here(kb.tasks.ElectraPretrainer, path)
    found = _about(messages, path, "ElectraPretrainer", "random initialization", "'generator'",
                   "'generator_head'", "generator_preset=", "ElectraForMaskedLM")
    assert len(found) == 1, messages
    assert "discriminator_head" not in found[0], found
    with warnings.catch_warnings(record=True) as caught:  # convert_task's (strict) load too
        warnings.simplefilter("always")
        kb.presets.convert_task(path, kb.tasks.ElectraPretrainer, preprocessor=None)
    assert _about([str(w.message) for w in caught], "'generator'", "generator_preset="), caught
    assert _load_from_here(kb.tasks.ElectraPretrainer, path,
                           generator_preset=hf_dirs["ElectraForMaskedLM"]) == []


def test_electra_pretrainer_from_bare_model_warns_at_the_caller(hf_dirs):
    """ElectraPretrainer.from_preset loads its heads one call shallower than Task.from_preset:
    the warning that a bare ElectraModel directory has no discriminator head pointed one frame
    above the caller (at pytest's python.py; at "sys", line 1, from a script)."""
    messages = _load_from_here(kb.tasks.ElectraPretrainer, hf_dirs["ElectraModel"],
                               generator_preset=hf_dirs["ElectraForMaskedLM"])
    found = _about(messages, "discriminator_predictions.dense.weight", "ElectraForPreTraining")
    assert len(found) == 1 and len(messages) == 1, messages


# === Every route to the same HF checkpoint: the same warnings ===
def _fake_hub_cache(cache, repo_id, model_dir, revision="0123456789abcdef"):
    """huggingface_hub's cache layout (models--org--name/{refs/main, snapshots/<rev>/}) holding
    `model_dir` -> the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return str(repo / "snapshots" / revision)


# The registered name whose checkpoint each HF model stands for (its config is the name's).
_REGISTERED = {
    "BertModel": "bert_tiny_en_uncased", "BertForMaskedLM": "bert_tiny_en_uncased",
    "ElectraForPreTraining": "electra_small_discriminator_uncased_en",
}
_ROUTES = {  # how a user names the checkpoint -> the preset passed to from_preset
    "directory": lambda case: case["dir"],
    "hub id": lambda case: "someorg/tiny",
    "hf:// id": lambda case: "hf://someorg/tiny",
    "registered name": lambda case: case["name"],
}


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """{HF class: its directory, the registered name it stands for, and an HF cache holding it
    as "someorg/tiny" and as that name's checkpoint}: nothing downloads (HF_HUB_OFFLINE=1)."""
    cases = {}
    for saved, name in _REGISTERED.items():
        root = tmp_path_factory.mktemp(saved)
        config = {k: v for k, v in kb.presets.get(name).config.items()
                  if k not in ("max_sequence_length", "num_segments")}
        family = T.ElectraConfig if saved.startswith("Electra") else T.BertConfig
        hf_config = family(vocab_size=config["vocabulary_size"], embedding_size=config.get(
            "embedding_dim"), hidden_size=config["hidden_dim"], num_hidden_layers=config[
            "num_layers"], num_attention_heads=config["num_heads"], intermediate_size=config[
            "intermediate_dim"])
        torch.manual_seed(0)
        getattr(T, saved)(hf_config).save_pretrained(str(root / "model"))
        snapshots = [_fake_hub_cache(root / "hub", repo, root / "model")
                     for repo in ("someorg/tiny", kb.presets.get(name).hf_id)]
        cases[saved] = {"dir": str(root / "model"), "name": name, "hub": str(root / "hub"),
                        "snapshots": snapshots}
    return cases


@pytest.mark.parametrize("saved,task,kwargs,expected", [  # the words of each warning
    ("BertModel", kb.tasks.TextClassifier, {"num_classes": 2},
     [("has no weights for TextClassifier's head", "classifier.weight", "'logits")]),
    ("BertForMaskedLM", kb.tasks.BertPretrainer, {},
     [("has no weights for BertPretrainer's head", "cls.seq_relationship.weight", "'nsp_head/"),
      ("has no pooler weights",)]),
    ("BertForMaskedLM", kb.models.BertBackbone, {}, [("has no pooler weights",)]),
    ("BertForMaskedLM", kb.tasks.MaskedLM, {}, []),
    ("ElectraForPreTraining", kb.tasks.ElectraPretrainer, {},
     [("has no weights for ElectraPretrainer's generator", "'generator'", "generator_preset=")]),
])
def test_every_route_to_a_checkpoint_warns_the_same(routed, monkeypatch, saved, task, kwargs,
                                                    expected):
    """A checkpoint's warnings do not depend on how it is named: its directory, its HF hub id
    (through the local cache, "org/name" or "hf://org/name") or a registered name whose weights
    it is. A registered name loaded a bare BertModel into TextClassifier, a BertForMaskedLM's
    MLM head without the NSP head, and an ElectraForPreTraining without its generator, all
    silently, while the same directory warned (session 46 kept registered names silent). The
    warnings name the files' directory, point at the caller, and differ in nothing else."""
    case = routed[saved]
    monkeypatch.setenv("HF_HUB_CACHE", case["hub"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if issubclass(task, kb.tasks.Task):
        kwargs = dict(kwargs, preprocessor=None)
    found = {}
    for route, preset in _ROUTES.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task.from_preset(preset(case), **kwargs)
        caught = [w for w in caught if issubclass(w.category, UserWarning)]
        assert all(w.filename == __file__ for w in caught), (route, [w.filename for w in caught])
        messages = [str(w.message) for w in caught]
        for where in case["snapshots"] + [case["dir"]]:
            messages = [m.replace(where, "<checkpoint>") for m in messages]
        found[route] = messages
    assert all(found[route] == found["directory"] for route in _ROUTES), found
    assert len(found["directory"]) == len(expected), found["directory"]
    for message, words in zip(found["directory"], expected):
        assert _about([message], "'<checkpoint>'", *words), message
