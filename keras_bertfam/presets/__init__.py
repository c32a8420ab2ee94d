"""The one preset mechanism: registered names, our preset directories, keras-hub and HF-format
directories.

`from_preset` on backbones, tokenizers and tasks comes here (through `keras_bertfam.preset_hooks`,
so models, tasks and preprocessing never import this package). A `preset` is resolved by
`loaders.get_loader`, one loader class per source, in order:
1. a directory saved by `save_to_preset` (it holds `keras_bertfam.json`): `OursLoader`;
2. a keras-hub preset directory of any family keras-hub has: `KerasHubLoader`;
3. an HF-format model directory (`config.json` with a `model_type`, weights, tokenizer files), or
   an HF hub id's snapshot in the local HF cache: `HFDirLoader`;
4. a registered name (`list()`), whose weights come from the public checkpoint in the local HF cache
   (nothing is downloaded unless the caller is online and asks for it with `download=True`):
   `HubCacheLoader`.

Modules: `registry` (families and names), `loaders`, `hf_heads` (`convert_task`, HF task heads),
`hf_export` (`export_to_transformers`), `checkpoints` (HF weight maps), `keras_hub_format`,
`integrity` (checksums, finiteness), `params` (parameter counts), `deferred` (the loaders build
without drawing the weights they load).
"""
import inspect
import json
import math
import os
import re
import shutil

from keras_bertfam import atomic, preset_hooks
from keras_bertfam.models import weights_files
from keras_bertfam.presets import checkpoints, integrity, keras_hub_format  # noqa: F401
from keras_bertfam.presets.deferred import deferred_initialization, deferring
from keras_bertfam.presets.hf_export import export_to_transformers  # noqa: F401
from keras_bertfam.presets.hf_heads import convert_task, load_hf_heads  # noqa: F401
from keras_bertfam.presets.loaders import (  # noqa: F401
    preset_path,
    BACKBONE_WEIGHTS,
    MANIFEST,
    TASK_WEIGHTS,
    TOKENIZER_ASSETS,
    HFDirLoader,
    HubCacheLoader,
    KerasHubLoader,
    OursLoader,
    PresetLoader,
    convert_hf,
    directory_format,
    get_loader,
    hf_cache_dir,
    hub_snapshot,
    read_manifest,
    registered_weights_dir,
)
from keras_bertfam.presets.registry import FAMILIES, PRESETS, family_of_class, get  # noqa: F401
from keras_bertfam.user_warnings import warn

_read_manifest = read_manifest  # the name cli.py used


def list(family=None):  # noqa: A001 - the public name kb.presets.list()
    """Prints and returns the registered presets: name, family, size, parameters, source."""
    rows = [p for p in PRESETS.values() if family in (None, p.family)]
    if not rows:
        raise ValueError(f"No presets of family {family!r}; families: {sorted(FAMILIES)}.")
    width = max(len(p.name) for p in rows)
    print(f"{'name':<{width}}  {'family':<11} {'size':<17} {'params':>9}  source")
    for p in rows:
        print(f"{p.name:<{width}}  {p.family:<11} {p.size:<17} {p.params / 1e6:>8.1f}M  "
              f"{p.hf_id or '-'}")
    return [p.name for p in rows]


def offline_status(name):
    """What a registered preset loads offline right now: {"weights": the local directory of its
    public checkpoint or None, "vocabulary": the local tokenizer files or None}."""
    from keras_bertfam.presets.vocabularies import vocabulary_path

    preset = get(name)
    try:
        weights = registered_weights_dir(preset)
    except FileNotFoundError:
        weights = None
    names = [preset.tokenizer.get(k) for k in ("vocabulary", "merges", "proto")
             if k in preset.tokenizer]
    try:
        files = [vocabulary_path(n) for n in names if n]
    except FileNotFoundError:
        files = []
    vocabulary = files if files and len(files) == len(names) and all(
        os.path.isfile(f) for f in files) else None
    return {"weights": weights, "vocabulary": vocabulary}


def count_params(preset):
    """The parameter count of a registered preset's config, computed without building it."""
    from keras_bertfam.presets.params import count_params as count

    preset = get(preset) if isinstance(preset, str) else preset
    spec = FAMILIES[preset.family]
    return count(spec.backbone_cls, preset.config, family=spec)


# === Backbones ===
@deferring
def load_backbone(preset, cls=None, load_weights=True, download=False, alone=True,
                  built=None, **overrides):
    """The backbone of `preset` (any source); `cls` checks the family. `alone`: see
    `convert_hf`; `built`: see `PresetLoader.load_backbone`. An override of a setting that
    changes what the preset's weights compute warns (`warn_function_overrides`)."""
    loader = get_loader(preset, download)
    backbone = loader.load_backbone(cls=cls, load_weights=load_weights, alone=alone,
                                    built=built, **overrides)
    if load_weights:
        found = loader.backbone_config()
        if found is not None:
            warn_function_overrides(preset, found[1], overrides, found[0])
    return backbone


def warn_function_overrides(preset, saved, overrides, cls):
    """Warns for each setting of `FUNCTION_KEYS` (activation, layer_norm_epsilon, ...) that
    `overrides` sets otherwise than the preset's config `saved` (where it has none, `cls`'s
    default): the preset's weights, trained under its value, then compute something else.
    keras-hub and HF take such overrides silently; training settings (dropout) are not said.
    The warning points at the user's line (from_preset's, convert's caller)."""
    defaults = inspect.signature(cls.__init__).parameters
    for key in weights_files.function_keys(cls):
        if key not in overrides:
            continue
        if key in saved:
            value = saved[key]
        elif key in defaults and defaults[key].default is not inspect.Parameter.empty:
            value = defaults[key].default
        else:
            continue
        if weights_files.setting_value(value) != weights_files.setting_value(overrides[key]):
            warn(
                f"{preset!r} was saved with {key}={value!r}; loading its weights with "
                f"{key}={overrides[key]!r} computes something else than they were trained for "
                f"(the weights load as they are). Leave {key} to the preset, or pass "
                f"load_weights=False to build the model untrained.")


def save_backbone(backbone, preset_dir, tokenizer=None):
    _write_preset(preset_dir, backbone, tokenizer)


def _write_preset(preset_dir, backbone, tokenizer=None, task=None):
    """Weights and assets first, then the manifest with their sha256 (a directory whose manifest
    exists is complete, and every file it names is verified on load), all into a new directory
    beside `preset_dir` that then replaces it whole (`atomic.replace_dir`): a save interrupted
    or failing at any point leaves the previous preset as it was. Files of the old directory
    that are not the preset's (a README, a model card) are copied into the new one."""
    preset_dir = preset_path(preset_dir, "save_to_preset")
    if os.path.exists(preset_dir) and not os.path.isdir(preset_dir):
        raise FileExistsError(f"save_to_preset({preset_dir!r}): that path is a file; expected a "
                              "directory (new, or a preset to overwrite).")
    spec = family_of_class(type(backbone))
    if spec is None:
        raise ValueError(f"{type(backbone).__name__} is not a registered family's backbone.")
    _check_finite_weights(task if task is not None else backbone, preset_dir)
    head, name = os.path.split(os.path.realpath(preset_dir))  # a link's directory is replaced
    os.makedirs(head, exist_ok=True)
    stage = os.path.join(head, f"tmp-new-{name}.{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)  # this process's own, from a save that failed
    os.makedirs(stage)
    try:
        _write_preset_files(stage, spec, backbone, tokenizer, task)
        if os.path.isdir(preset_dir):
            _copy_other_files(preset_dir, stage)
        atomic.replace_dir(stage, os.path.join(head, name))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


# What a preset directory holds of its own: the rest of an old one is copied over by a rewrite.
_PRESET_ENTRIES = (MANIFEST, MANIFEST + ".tmp", BACKBONE_WEIGHTS, TASK_WEIGHTS,
                   TOKENIZER_ASSETS.split(os.sep)[0])


def _copy_other_files(old, new):
    for entry in os.listdir(old):
        if entry in _PRESET_ENTRIES or os.path.lexists(os.path.join(new, entry)):
            continue
        source = os.path.join(old, entry)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, os.path.join(new, entry), symlinks=True)
        else:
            shutil.copy2(source, os.path.join(new, entry), follow_symlinks=False)


def _write_preset_files(preset_dir, spec, backbone, tokenizer, task):
    manifest_path = os.path.join(preset_dir, MANIFEST)
    config = backbone.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key, None)
    if not backbone.trainable:
        config["trainable"] = False  # loads frozen (`OursLoader`), as keras-hub's presets do
    manifest = {"format_version": 1, "family": spec.name, "backbone": config}
    files = [BACKBONE_WEIGHTS]
    backbone.save_weights(os.path.join(preset_dir, BACKBONE_WEIGHTS))
    if tokenizer is not None:
        manifest["tokenizer"] = save_tokenizer(tokenizer, preset_dir)
        files += integrity.files_under(preset_dir, TOKENIZER_ASSETS)
    if task is not None:
        manifest["task"] = _task_entry(task)
        task.save_weights(os.path.join(preset_dir, TASK_WEIGHTS))
        files.append(TASK_WEIGHTS)
    manifest["files"] = integrity.checksums(preset_dir, files)
    atomic.write_file(manifest_path, lambda f: json.dump(manifest, f, indent=2))


def _check_finite_weights(model, preset_dir):
    """A model whose training diverged is not saved as a preset (a NaN preset loads silently
    everywhere else): the error names the first non-finite variable."""
    import keras
    import numpy as np

    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise ValueError(
                f"Not saving {type(model).__name__} to {preset_dir!r}: its variable "
                f"{variable.path!r} holds NaN or inf (training diverged). Expected finite "
                "weights; keep the last good preset / checkpoint (keras.callbacks.TerminateOnNaN "
                "stops fit at the first NaN loss).")


# === Tokenizers ===
def load_tokenizer(preset, download=False, **kwargs):
    return get_loader(preset, download).load_tokenizer(**kwargs)


def position_table(preset, download=False):
    """(max_sequence_length, backbone class name) of the backbone a preset builds, read from its
    config (nothing built); (None, None) where it has no position table (XLNet) or no backbone
    config (a tokenizer-only preset). A preprocessor's `from_preset` checks its
    `sequence_length` against it (`check_fits_positions`)."""
    found = get_loader(preset, download).backbone_config()
    if found is None:
        return None, None
    cls, config = found
    parameter = inspect.signature(cls).parameters.get("max_sequence_length")
    if parameter is None:
        return None, None
    limit = config.get("max_sequence_length", parameter.default)
    return (limit if isinstance(limit, int) else None), cls.__name__


def takes_segment_ids(preset, download=False):
    """Whether the backbone a preset builds takes a `segment_ids` input, read from its config
    (nothing built; `Backbone.takes_segment_ids_in`); None without a backbone config. A
    preprocessor's `from_preset` returns them only then (`ReturnsModelInputs`)."""
    found = get_loader(preset, download).backbone_config()
    if found is None:
        return None
    cls, config = found
    return cls.takes_segment_ids_in(config)


def takes_global_attention(preset, download=False):
    """Whether the backbone a preset builds takes a `global_attention_mask` input (a
    Longformer's: its class derives a task's, `task_global_attention`), read from its config
    (nothing built); None without a backbone config. A preprocessor's `from_preset` returns
    the mask its task would derive only then (`ReturnsModelInputs`)."""
    found = get_loader(preset, download).backbone_config()
    if found is None:
        return None
    return getattr(found[0], "task_global_attention", None) is not None


def save_tokenizer(tokenizer, preset_dir):
    """Copies the tokenizer's files into the preset's assets; returns its spec for the manifest."""
    assets = os.path.join(preset_dir, TOKENIZER_ASSETS)
    os.makedirs(assets, exist_ok=True)
    tokenizer.save_assets(assets)
    config = tokenizer.get_config()
    spec = {"kind": tokenizer.kind, "class": type(tokenizer).__name__}
    spec.update({k: v for k, v in config.items()
                 if k not in ("name", "trainable", "dtype", "vocabulary", "proto", "merges",
                              "sequence_length", "config_file")})
    return spec


# === Tasks ===
@deferring
def load_task(cls, preset, load_weights=True, preprocessor="default", download=False, **kwargs):
    """`cls` on the preset's backbone, with its tokenizer in `cls.default_preprocessor`.

    From one of our preset directories saved from a `cls` task, the task's saved arguments (e.g.
    `num_classes`), its preprocessor's (e.g. `sequence_length`) and its weights come back;
    `kwargs` override them. From an HF-format directory or a registered name, the task's HF heads
    come too when the checkpoint has them (`convert_task` requires them).
    """
    loader = get_loader(preset, download)
    cls = _saved_task_class(loader) if _is_generic_task(cls) else cls
    check_task_family(cls, loader)
    saved = loader.saved_task(cls) if load_weights or loader.kind == "ours" else {}
    # the saved task's arguments the caller gives other values (num_classes=5 on a 3-class
    # preset): its head weights then do not fit, and the head is new (as keras-hub's)
    changed = {k: v for k, v in kwargs.items()
               if k in saved.get("config", {}) and saved["config"][k] != v}
    kwargs = dict(saved.get("config", {}), **kwargs)
    # an HF checkpoint, however named: a directory, a hub id's snapshot, a registered name's
    from_hf = load_weights and isinstance(loader, HFDirLoader)
    if from_hf and "num_classes" not in kwargs and "num_classes" in (
            inspect.signature(cls.__init__).parameters):
        labels = _hf_num_labels(cls, loader)
        if labels:  # HF's *ForSequenceClassification / *ForTokenClassification: its labels
            kwargs["num_classes"] = labels
    if from_hf:
        _warn_if_multi_label(cls, loader)
    # keras-hub's `dtype=` builds the backbone with that policy (the task's layers follow it)
    dtype = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    tasks = []  # built on the backbone before its weights are read: a bad argument fails first
    loader.load_backbone(load_weights=load_weights,
                         alone=not from_hf,  # load_hf_heads says what is left: heads may fill
                         built=lambda backbone: tasks.append(_build_task(
                             cls, loader, backbone, preprocessor, saved, dict(kwargs))),
                         **dtype)
    task = tasks[0]
    if saved and load_weights:
        try:
            loader.load_task_weights(task, overridden=changed)
            warn_function_overrides(preset, saved.get("config", {}), changed, cls)
        except checkpoints.CheckpointError as e:
            if not changed or isinstance(e, integrity.IntegrityError):
                raise
            warn(
                f"{preset!r} holds a {cls.__name__} saved with "
                f"{ {k: saved['config'][k] for k in changed} }; with {changed} its task weights do "
                f"not fit, so the head is new (its backbone's weights are the preset's).")
    elif from_hf:
        load_hf_heads(task, loader, download=download, warn_no_pooler=True)
    return task


def _build_task(cls, loader, backbone, preprocessor, saved, kwargs):
    """`cls` on `backbone` with `kwargs`; with preprocessor="default", `cls.default_preprocessor`
    on the preset's tokenizer, with the saved preprocessor's arguments and those of `kwargs`."""
    if preprocessor == "default":
        tokenizer = loader.load_tokenizer()
        args = dict(saved.get("preprocessor", {}))
        args.update(_pop_preprocessor_args(cls, kwargs))
        _follow_sequence_length(args, saved.get("preprocessor", {}))
        args.update({k: kwargs[k] for k in getattr(cls, "preprocessor_shared_args", ())
                     if k in kwargs})
        preprocessor = cls.default_preprocessor(tokenizer, backbone, **args)
    else:
        _pop_preprocessor_args(cls, kwargs)
    # a saved model argument (ElectraPretrainer's generator) as `Task.from_config` rebuilds it
    kwargs = {k: keras_object(v) for k, v in kwargs.items()}
    return cls(**{backbone_argument(cls): backbone}, preprocessor=preprocessor, **kwargs)


def _is_generic_task(cls):
    from keras_bertfam.tasks import Task

    return cls is Task


def _saved_task_class(loader):
    """The task class saved in the preset (keras-hub's generic `Task.from_preset` loads the saved
    task's own class)."""
    from keras_bertfam import tasks

    classes = sorted(n for n in dir(tasks) if isinstance(getattr(tasks, n), type) and issubclass(
        getattr(tasks, n), tasks.Task) and n != "Task")
    if loader.kind == "ours":
        name = loader.manifest.get("task", {}).get("class_name")
        if name in classes:
            return getattr(tasks, name)
    elif loader.kind == "keras_hub":  # BertTextClassifier: our TextClassifier
        saved = keras_hub_format.saved_task_class(loader.where) or ""
        ours = [n for n in classes if saved.endswith(n)]
        if ours:
            return getattr(tasks, max(ours, key=len))
    raise ValueError(
        f"{loader.preset!r} holds no task this library builds (a backbone and tokenizer, or a "
        "task of a class it has not), so `Task.from_preset` cannot tell which task to build: "
        f"use a task class, e.g. `kb.tasks.TextClassifier.from_preset({loader.preset!r}, "
        f"num_classes=...)`. The task classes: {classes}.")


def preprocessor_args(loader, cls, kwargs):
    """A preprocessor `cls`'s arguments from a preset: those a task saved there with a `cls`
    preprocessor (as keras-hub's `Preprocessor.from_preset` reads a saved preprocessor.json; of
    a keras-hub directory, its preprocessor's `sequence_length`), overridden by `kwargs`."""
    saved = loader.manifest.get("task", {}) if loader.kind == "ours" else {}
    if loader.kind == "keras_hub":  # its preprocessor.json's sequence_length
        length = keras_hub_format.saved_sequence_length(loader.where, cls.__name__)
        saved = {"preprocessor_class": cls.__name__,
                 "preprocessor": {"sequence_length": length}} if length else {}
    if saved.get("preprocessor_class") != cls.__name__:
        return dict(kwargs)
    args = dict(saved.get("preprocessor", {}), **kwargs)
    _follow_sequence_length(args, saved.get("preprocessor", {}))
    return args


def _own_head_config(cls, loader):
    """The HF config of a checkpoint of `cls`'s own head (its architecture is the family's HF
    model of `cls`), else None."""
    cfg = checkpoints.read_hf_config(loader.hf_model_dir())
    architecture = (loader.family.hf_task_architectures or {}).get(cls.__name__)
    if architecture is None or architecture not in (cfg.get("architectures") or ()):
        return None
    return cfg


def _hf_num_labels(cls, loader):
    """The label count of an HF checkpoint of `cls`'s own head (its config's `id2label`, or
    `num_labels`, else HF's default 2: transformers 5 saves neither for it), as HF's
    `AutoModelFor*.from_pretrained` reads it; None for another model."""
    cfg = _own_head_config(cls, loader)
    if cfg is None:
        return None
    labels = cfg.get("id2label")
    count = len(labels) if isinstance(labels, dict) and labels else cfg.get("num_labels")
    count = 2 if count is None else count
    return count if isinstance(count, int) and count > 0 else None


def _warn_if_multi_label(cls, loader):
    """An HF classifier trained for multi-label classification (`problem_type`, HF's sigmoid
    and BCE per label) loads as our single-label one (a softmax): its weights load, the labels'
    meaning does not; said, not silent."""
    cfg = _own_head_config(cls, loader)
    if cfg is None or cfg.get("problem_type") != "multi_label_classification":
        return
    warn(
        f"{loader.preset!r} is an HF classifier with problem_type='multi_label_classification' "
        f"(a sigmoid per label, several labels per example); {cls.__name__} is single-label: "
        f"its head loads, but it predicts a softmax over the labels (one label per example) and "
        f"fit takes one class id per example.")


def check_task_family(cls, loader):
    """A task class that needs one family (`backbone_families`) refuses another's preset."""
    families = getattr(cls, "backbone_families", None)
    if not families:
        return
    spec = loader.family
    if spec.name not in families:
        raise ValueError(
            f"{loader.preset!r} is a {spec.name!r} preset; {cls.__name__} needs a backbone of the "
            f"{' or '.join(repr(f) for f in families)} family "
            f"({', '.join(FAMILIES[f].backbone_cls.__name__ for f in families if f in FAMILIES)}).")


def _follow_sequence_length(args, saved):
    """A saved masker whose `mask_selection_length` was the default for the saved length
    (`ceil(rate · sequence_length)`) follows a new `sequence_length`; one set otherwise, or a
    masker passed in, is kept."""
    masker, old, new = args.get("masker"), saved.get("sequence_length"), args.get(
        "sequence_length")
    if not isinstance(masker, dict) or masker is not saved.get("masker") or not (
            isinstance(old, int) and isinstance(new, int)) or old == new:
        return
    config = masker.get("config", {})
    rate, length = config.get("mask_selection_rate"), config.get("mask_selection_length")
    if isinstance(rate, (int, float)) and length == max(1, math.ceil(old * rate)):
        config = dict(config, mask_selection_length=max(1, math.ceil(new * rate)))
        args["masker"] = dict(masker, config=config)


def _pop_preprocessor_args(cls, kwargs):
    names = getattr(cls, "preprocessor_args", ())
    return {k: kwargs.pop(k) for k in [*kwargs] if k in names}


def backbone_argument(cls):
    """The argument a task class takes its backbone in (ElectraPretrainer: `discriminator`): the
    preset's backbone, which `load_task` passes there and `_task_entry` leaves to the manifest's
    "backbone"."""
    return getattr(cls, "backbone_argument", "backbone")


def keras_object(value):
    """A task argument saved as a serialized Keras object (a dict with "class_name"), rebuilt."""
    if isinstance(value, dict) and "class_name" in value:
        import keras

        return keras.saving.deserialize_keras_object(value)
    return value


def _task_entry(task):
    config = task.get_config()
    for key in ("backbone", backbone_argument(type(task)), "preprocessor", "name", "trainable"):
        config.pop(key, None)
    entry = {"class_name": type(task).__name__, "config": config}
    preprocessor = getattr(task, "preprocessor", None)
    if preprocessor is not None:
        names = set(getattr(type(task), "preprocessor_args", ()))
        entry["preprocessor"] = {
            k: v for k, v in preprocessor.get_config().items() if k in names}
        entry["preprocessor_class"] = type(preprocessor).__name__
    return entry


def save_task(task, preset_dir):
    tokenizer = getattr(getattr(task, "preprocessor", None), "tokenizer", None)
    _write_preset(preset_dir, task.backbone, tokenizer, task=task)


def upload_preset(uri, preset):
    """Uploads a `save_to_preset` directory to Kaggle Models
    ("kaggle://<user>/<model>/keras/<variation>") or the HF hub ("hf://[<org>/]<name>"), as
    keras-hub's `upload_preset` (which checks keras-hub's layout and refuses ours). The directory
    is verified first (its manifest, every file's sha256), then handed to
    `kagglehub.model_upload` or to huggingface_hub's `create_repo` and `upload_folder`: the
    transfer and the credentials are theirs. `from_preset("hf://...", download=True)` loads it
    back; a Kaggle upload, from the directory `kagglehub.model_download` returns."""
    if not isinstance(uri, str) or not re.fullmatch(r"(kaggle|hf)://[^/\s]+(/[^/\s]+)*", uri):
        raise ValueError(
            f"upload_preset's uri is 'kaggle://<user>/<model>/keras/<variation>' (Kaggle Models) "
            f"or 'hf://[<org>/]<name>' (the HF hub); got {uri!r}.")
    preset_dir = preset_path(preset, "upload_preset's preset")
    if not os.path.isdir(preset_dir):
        raise FileNotFoundError(f"The preset directory {preset_dir!r} does not exist.")
    if not OursLoader.claims(preset_dir):
        raise ValueError(
            f"{preset_dir!r} has no {MANIFEST}: upload_preset uploads a directory written by "
            "this library's `save_to_preset` (keras-hub's own directories: "
            "`keras_hub.upload_preset`).")
    integrity.verify(preset_dir, read_manifest(preset_dir).get("files") or {})
    scheme, handle = uri.split("://", 1)
    if scheme == "kaggle":
        import kagglehub

        kagglehub.model_upload(handle, preset_dir)
    else:
        import huggingface_hub

        repo = huggingface_hub.create_repo(repo_id=handle, exist_ok=True)
        huggingface_hub.upload_folder(repo_id=repo.repo_id, folder_path=preset_dir)


def convert(path, load_weights=True, **overrides):
    """An HF-format model directory -> our backbone with the checkpoint's weights. An override
    of a setting that changes what the weights compute warns, as `from_preset`'s
    (`warn_function_overrides`)."""
    path = preset_path(path, "convert's path (an HF-format model directory)")
    # A directory no format claims is read as HF's: convert_hf's error names the missing files.
    loader = (directory_format(path) or HFDirLoader) if os.path.isdir(path) else None
    if loader is not HFDirLoader:
        what = {None: "no such directory", OursLoader: "a keras_bertfam preset directory",
                KerasHubLoader: "a keras-hub preset directory"}[loader]
        cls = FAMILIES[PRESETS[path].family].backbone_cls if path in PRESETS else None
        raise (FileNotFoundError if loader is None else ValueError)(
            f"convert({path!r}): {what}; expected an HF-format model directory (config.json and "
            f"weights). Load {'a registered name' if cls else 'a preset'} with its backbone's "
            f"from_preset (kb.models.{cls.__name__ if cls else 'BertBackbone'}.from_preset).")
    backbone = convert_hf(path, load_weights=load_weights, **overrides)
    if load_weights:
        cls, saved = HFDirLoader(path, path).backbone_config()
        warn_function_overrides(path, saved, overrides, cls)
    return backbone


preset_hooks.register(load_backbone=load_backbone, save_backbone=save_backbone,
                      get_loader=get_loader, load_tokenizer=load_tokenizer,
                      position_table=position_table, takes_segment_ids=takes_segment_ids,
                      takes_global_attention=takes_global_attention,
                      load_task=load_task, save_task=save_task,
                      preprocessor_args=preprocessor_args,
                      load_hf_heads=load_hf_heads,
                      deferred_initialization=deferred_initialization)
