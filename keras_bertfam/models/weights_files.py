"""Keras weights files (`.weights.h5`, a `.keras` archive's weights) checked against the model
they are loaded into, before anything is assigned.

Keras' `load_weights` fills each layer of the model from the entry at the layer's path in the
file and never looks at the file's other entries: a 2-layer model's file loaded into a 1-layer
model, a BERT file into a DistilBERT or ELECTRA backbone (their segment table and pooler left
over), loaded without a word. A model variable the file lacks, or holds in another shape, is an
error only once the layers before it were overwritten. Here the file's layout (paths, keys and
shapes) is compared with what the model itself would save, and a file that does not fit is
refused with the paths that differ; nothing is loaded.
"""
import contextlib
import json
import os
import zipfile

import h5py
import numpy as np
from keras.src.saving import saving_lib
from keras.src.utils.file_utils import is_remote_path

# Keras' optimizer loads its state when its variable count matches the file's and otherwise
# skips it with a warning (plain weights into a compiled model); that stays Keras' behaviour.
OPTIMIZER = "optimizer"
# A task's weights file records the task's class here (`record_task_class`): a group no model
# has, which Keras' loading (and an earlier version of this library) never reads.
TASK_CLASS_PATH = "keras_bertfam_task"


def record_task_class(filepath, name):
    """Writes `name` (a task class) into the `.weights.h5` file just saved."""
    with h5py.File(filepath, "a") as h5:
        group = h5.require_group(f"{TASK_CLASS_PATH}/vars")
        if "0" in group:
            del group["0"]
        group["0"] = np.frombuffer(name.encode("utf-8"), dtype=np.uint8)


class _LayoutStore(saving_lib.H5IOStore):
    """A write store for Keras' saving walk (`_save_state` takes Keras' store classes only)
    that keeps the shapes, not the values: {path: {key: shape}}."""

    def __init__(self):  # no file
        self.entries, self._path = {}, None

    def __bool__(self):
        return True

    def make(self, path, metadata=None):
        self._path = path
        return self

    def __setitem__(self, key, value):
        self.entries.setdefault(self._path, {})[key] = tuple(np.shape(value))


def cache_attr_skipsets():
    """Keras 3.15's saving walk builds a throwaway `Layer()` for every layer it visits:
    `get_attr_skipset` stores each type's set under "saving_attr_skipset_<type>" and looks it up
    under "saving_attr_skiplist_<type>", so the cache never hits (BERT-Base: 193 layers built,
    ~0.2 s of a `load_weights`, twice with the check below). The sets it computes are kept under
    the name it reads (global state: `clear_session` drops them, and the next call refills)."""
    from keras.src.backend.common import global_state

    for obj_type in ("Layer", "Functional", "Operation", "Optimizer", "Metric", "Loss"):
        key = f"saving_attr_skiplist_{obj_type}"
        if global_state.get_global_attribute(key) is not None:
            continue
        # Layers' sets built here (a bare Layer makes no variable: safe in a StatelessScope,
        # the loaders' deferred initialization); the others' only once Keras built them.
        skipset = (saving_lib.get_attr_skipset(obj_type) if obj_type in ("Layer", "Functional")
                   else global_state.get_global_attribute(f"saving_attr_skipset_{obj_type}"))
        if skipset is not None:
            global_state.set_global_attribute(key, skipset)


def model_layout(model):
    """{path: {key: shape}} of what `model.save_weights` would write (nothing is written)."""
    cache_attr_skipsets()
    store = _LayoutStore()
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                           visited_saveables=set())
    return {p: keys for p, keys in store.entries.items() if keys}


@contextlib.contextmanager
def _open_h5(filepath):
    """-> (the h5 file, the task class a `.keras` archive's config names, else None)."""
    if filepath.endswith(".keras"):
        with zipfile.ZipFile(filepath) as archive, archive.open("model.weights.h5") as f, \
                h5py.File(f, "r") as h5:
            config = json.loads(archive.read("config.json"))
            ours = str(config.get("module", "")).startswith("keras_bertfam.tasks.")
            yield h5, config.get("class_name") if ours else None
    else:
        with h5py.File(filepath, "r") as h5:
            yield h5, None


def read_layout(filepath):
    """-> ({path: {key: shape}}, the task class it was saved from or None: a backbone's, a
    user's class, a file saved before tasks recorded it) of a `.weights.h5` file or a `.keras`
    archive's weights; a file that is not one (truncated, damaged, another
    format) is an OSError naming it (as h5py's, which does not)."""
    layout = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and name.rsplit("/", 1)[-1] == "vars" and len(obj):
            layout[name[:-len("vars")].rstrip("/")] = {k: tuple(obj[k].shape) for k in obj}

    if not os.path.exists(filepath):
        raise FileNotFoundError(f"The weights file {filepath!r} does not exist.")
    try:
        with _open_h5(filepath) as (h5, task):
            h5.visititems(visit)  # the root's "vars" (a task's own keys) too
            if layout.pop(TASK_CLASS_PATH, None):
                task = h5[TASK_CLASS_PATH]["vars"]["0"][()]
    except Exception as e:  # h5py's OSError, zipfile's BadZipFile, a missing group, ...
        raise OSError(
            f"Cannot read the weights file {filepath!r} ({os.path.getsize(filepath)} bytes): it "
            f"is truncated, damaged or not a Keras weights file ({type(e).__name__}: {e})."
        ) from e
    if isinstance(task, np.ndarray):
        task = bytes(task.astype(np.uint8)).decode("utf-8", errors="replace")
    return layout, task


def _shown(paths, limit=4):
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return f"{paths[:limit]}{more}"


def _prefix_of(part, whole):
    """The path prefix under which every path of `part` is in `whole` (None: there is none)."""
    if not part:
        return None
    first = min(part)
    for path in whole:
        if path.endswith("/" + first):
            prefix = path[:-len(first)]
            if all(prefix + p in whole for p in part):
                return prefix
    return None


def check_weights_file(model, filepath, task_class=None):
    """Refuses (ValueError) a weights file whose layout is not the model's, before anything is
    loaded: weights the model has no place for, model weights the file lacks, shapes that
    differ (naming the paths), or, for a task (`task_class`, its class name), a file another
    task class saved. The optimizer's state is left to Keras, and so are the keys a layer reads
    itself (a task's seed generators, a LoRA layer's factors): only the keys both sides hold
    are compared."""
    filepath = str(filepath)
    if not filepath.endswith((".weights.h5", ".keras")) or is_remote_path(filepath):
        return  # Keras' sharded `.weights.json`, a remote file: loaded by Keras as they are
    saved_layout, saved_task = read_layout(filepath)
    own_layout = model_layout(model)
    where = f"the weights file {filepath!r} into {type(model).__name__} {model.name!r}"

    def weights(layout):
        return {p for p in layout if p and p != OPTIMIZER and not p.startswith(OPTIMIZER + "/")}

    saved, own = weights(saved_layout), weights(own_layout)
    extra, missing = sorted(saved - own), sorted(own - saved)
    shapes = [f"{p}: {k} is {saved_layout[p][k]} in the file, {own_layout[p][k]} in the model"
              for p in sorted(saved & own)
              for k in sorted(saved_layout[p].keys() & own_layout[p].keys())
              if saved_layout[p][k] != own_layout[p][k]]
    if not (extra or missing or shapes):
        if task_class is not None and saved_task is not None and saved_task != task_class:
            raise ValueError(
                f"Cannot load {where}: the file holds a {saved_task}'s weights, whose head is "
                f"not a {task_class}'s (the same shapes, another function). Load its backbone "
                f"alone (`backbone.save_weights` / `task.backbone.load_weights`). Nothing was "
                f"loaded.")
        return
    problems = []
    if extra:
        problems.append(f"the file holds {len(extra)} layer(s) of weights the model has no place "
                        f"for: {_shown(extra)}")
    if missing:
        problems.append(f"the model has {len(missing)} layer(s) of weights the file does not "
                        f"hold: {_shown(missing)}")
    if shapes:
        problems.append(f"{len(shapes)} weight(s) differ in shape: {_shown(shapes, 3)}")
    hint = ""
    inner, outer = _prefix_of(saved, own), _prefix_of(own, saved)
    if inner is not None:
        hint = (f" The file holds the weights of a part of this model (at {inner.rstrip('/')!r}"
                f", e.g. a backbone's): load it into that part (`task.backbone.load_weights`).")
    elif outer is not None:
        hint = (f" The file holds this model inside a larger one (at {outer.rstrip('/')!r}"
                f"{', a ' + saved_task if saved_task else ''}): load it into that model.")
    raise ValueError(
        f"Cannot load {where}: it was saved from another model or configuration (another "
        f"family, task, num_layers, hidden_dim, num_heads, vocabulary_size, num_classes, ...): "
        f"{'; '.join(problems)}.{hint} Nothing was loaded.")
