"""Keras weights files (`.weights.h5`, a `.keras` archive's weights) checked against the model
they are loaded into, before anything is assigned.

Keras' `load_weights` fills each layer of the model from the entry at the layer's path in the
file and never looks at the file's other entries: a 2-layer model's file loaded into a 1-layer
model, a BERT file into a DistilBERT or ELECTRA backbone (their segment table and pooler left
over), loaded without a word. A model variable the file lacks, or holds in another shape, is an
error only once the layers before it were overwritten. Here the file's layout (paths, keys and
shapes) is compared with what the model itself would save, and a file that does not fit is
refused with the paths that differ; nothing is loaded.

Our `save_weights` (a task's, a backbone's) also records in the file (`record`):
- the settings that change what the weights compute with the same shapes (`FUNCTION_KEYS`:
  another activation, LayerNorm epsilon, an ALBERT's number of layers over its shared
  weights, ...), of the model and of each backbone in it: a model configured otherwise is
  refused naming each setting, the file's value and the model's;
- a digest of each tensor's bytes (`tensor_digest`): a byte changed after saving (a plain
  `.weights.h5` has no manifest) is refused naming the file and the tensor, before anything is
  assigned.
A file without the record (Keras' own, keras-hub's, ours before) is checked as before. A `.keras`
archive (Keras' writer, no record) gives the same settings from its config.json
(`config_settings`), refused alike; it has no tensor digests, but the CRC-32 its zip records of
the weights is checked on every Python (`verify_archive`).

A compiled task's optimizer state is a list that Keras loads back by position whenever the
optimizer has as many variables as the file's: a task compiled with other layers frozen (the
same number of variables) got other weights' moments, silently. A task's `save_own_variables`
records, in its weights (`.weights.h5` and `.keras` alike), whose state each position holds
(`optimizer_record`: the saved path of each model variable); a load that would put it on other
variables is refused naming them (`optimizer_mismatch`), by `load_weights` before anything is
loaded, by `keras.saving.load_model` once Keras' walk of the archive ends (no model returned).
"""
import collections
import concurrent.futures
import contextlib
import contextvars
import hashlib
import inspect
import io
import json
import mmap
import os
import struct
import zipfile
import zlib

import h5py
import keras
import numpy as np
from keras.src.saving import saving_lib
from keras.src.utils.file_utils import is_remote_path

# Keras' optimizer loads its state when its variable count matches the file's and otherwise
# skips it with a warning (plain weights into a compiled model); that stays Keras' behaviour,
# but for state recorded as another variables' (`optimizer_mismatch`).
OPTIMIZER = "optimizer"
# A task's record of its optimizer's state (`optimizer_record`), among the task's own keys: a
# JSON dataset no model reads.
OPTIMIZER_RECORD = "keras_bertfam_optimizer"
# A task's weights file records the task's class here (`record`): a group no model has,
# which Keras' loading (and an earlier version of this library) never reads.
TASK_CLASS_PATH = "keras_bertfam_task"


# The record of our `save_weights` (`record`): a JSON dataset no model reads, holding
# {"settings": {owner: {key: value}}, "digests": {dataset path: `tensor_digest`}}.
RECORD_PATH = "keras_bertfam_record"
# Constructor arguments (of backbones and tasks) that change what the weights compute while
# every weight keeps its shape; the arguments that change a shape (sizes, vocabulary) are the
# layout's to compare, and training settings (dropout, initializer_range, dtype) and input
# limits (max_global_tokens) change nothing the weights compute. `from_preset` warns when one
# of these is overridden while the preset's weights load (`presets.warn_function_overrides`).
FUNCTION_KEYS = (
    "num_layers", "num_heads", "activation", "layer_norm_epsilon",
    "num_groups", "share", "num_inner_repetitions", "heads_per_layer",  # ALBERT's sharing; pruning
    "position_offset", "attention_window",  # an EncoderBackbone's positions; Longformer
    "clamp_len", "untie_r",  # XLNet's relative positions and biases
    "hidden_activation",  # TextClassifier's / MultipleChoice's head
    "head_activation", "head_layer_norm_epsilon",  # MaskedLM's head
)
# A `.keras` archive's weights member (Keras' name).
ARCHIVE_WEIGHTS = "model.weights.h5"
# {path: the checks its caller made itself} (`checked_by_caller`).
_CALLER_CHECKED = contextvars.ContextVar("keras_bertfam_caller_checked", default={})
# The `.keras` archives whose CRC-32 `check_weights_file` verified, while Keras reads them
# (`checked_load`): `check_archive_store` does not verify them again.
_VERIFIED_ARCHIVES = contextvars.ContextVar("keras_bertfam_verified_archives",
                                            default=frozenset())
# The models (ids) whose file `checked_load` compared or was told not to (skip_mismatch), while
# Keras loads it: `check_optimizer_store` does not compare their optimizer's record again.
_OPTIMIZERS_CHECKED = contextvars.ContextVar("keras_bertfam_optimizers_checked",
                                             default=frozenset())


def function_keys(cls):
    """`FUNCTION_KEYS` of a backbone or task class, but for the arguments it names in
    `output_settings`, which act after its weights (TextClassifier's output `activation`: its
    logits are the same under any)."""
    skip = getattr(cls, "output_settings", ())
    return tuple(k for k in FUNCTION_KEYS if k not in skip)


def _utf8(text):
    """`text` as the weights file holds it: a dataset of its UTF-8 bytes (uint8)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _json_of(dataset):
    """The data of a `_utf8` dataset of JSON (an h5py dataset or an array)."""
    return json.loads(bytes(np.asarray(dataset[()]).astype(np.uint8)).decode("utf-8"))


def setting_value(value):
    """A setting as the record holds it (JSON; a callable activation by its Keras config)."""
    def default(obj):
        try:
            return keras.saving.serialize_keras_object(obj)
        except Exception:  # noqa: BLE001 - anything else by its repr
            return repr(obj)

    return json.loads(json.dumps(value, default=default))


def _roles(holders):
    """The owner names (`function_settings`) of the backbones whose `holders` (the model's
    constructor argument holding each, None where none does) are given: "backbone" for one;
    with several, each by its role, e.g. a Distiller's "teacher" / "student", ELECTRA's
    "generator" / "discriminator" ("<role> <i>" where one argument holds several, "backbone
    <i>" where none does)."""
    if len(holders) == 1:
        return ["backbone"]
    names = [role or "backbone" for role in holders]
    repeated = {name for name in names if names.count(name) > 1}
    seen = collections.Counter()
    roles = []
    for name in names:
        roles.append(f"{name} {seen[name]}" if name in repeated else name)
        seen[name] += 1
    return roles


def function_settings(model):
    """{owner: {key: value}} of `FUNCTION_KEYS` for `model` ("": its own constructor
    arguments) and each backbone inside it ("backbone"; where there are several, each by the
    constructor argument of `model` that holds it, `_roles`: a Distiller's "teacher" and
    "student")."""
    from keras_bertfam.models.backbone import Backbone  # models.backbone imports this module

    def settings(obj):
        params = inspect.signature(type(obj).__init__).parameters
        found = {k: getattr(obj, k) for k in function_keys(type(obj))
                 if k in params and hasattr(obj, k)}
        if getattr(obj, "heads_per_layer", None) is not None:  # any family's keyword
            found["heads_per_layer"] = list(obj.heads_per_layer)
        return setting_value(found)

    inner = [layer for layer in model._flatten_layers(include_self=False)
             if isinstance(layer, Backbone)]
    holder = {}
    if len(inner) > 1:
        for name in list(inspect.signature(type(model).__init__).parameters)[1:]:
            try:
                value = getattr(model, name, None)
            except Exception:  # noqa: BLE001 - a property that cannot answer holds nothing
                continue
            for layer in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(layer, keras.layers.Layer):
                    for held in layer._flatten_layers(include_self=True):
                        holder.setdefault(id(held), name)
    owners = {"": settings(model)}
    roles = _roles([holder.get(id(backbone)) for backbone in inner])
    for role, backbone in zip(roles, inner):
        owners[role] = settings(backbone)
    return owners


def _tensors(h5, with_places=True):
    """-> ({path: {key: shape}}, {dataset path: (offset, size) in the file, or None where its
    bytes are not one contiguous block (chunked, compact, empty)} or None) of the tensors (the
    datasets of each "vars" group) of an open `.weights.h5`."""
    layout, places = {}, {} if with_places else None

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and name.rsplit("/", 1)[-1] == "vars" and len(obj):
            datasets = {k: obj[k] for k in obj}
            layout[name[:-len("vars")].rstrip("/")] = {k: tuple(d.shape) for k, d in
                                                       datasets.items()}
            if places is not None:
                for k, d in datasets.items():
                    offset = d.id.get_offset()
                    places[f"{name}/{k}"] = (None if offset is None
                                             else (offset, d.id.get_storage_size()))

    h5.visititems(visit)  # the root's "vars" (a task's own keys) too
    return layout, places


# A tensor's digest: the sha256 of the sums (mod 2**64) of its bytes' 64-bit words in each
# block of 4 KiB, and of the bytes after the last whole block. Any change inside one block
# that does not keep the block's sum (a flipped bit or byte, a changed word; damage in several
# blocks) changes it; two changes in one block that cancel exactly (two words swapped) do not.
# A CRC-32 or sha256 of every byte took 0.2-0.3 s of BERT-Base's 438 MB (10-15% of its
# `load_weights`), these sums ~0.1 s (BUILD.md, "Weights files: tensor digests").
DIGEST = "sha256 of 4 KiB block sums"
_BLOCK_WORDS = 512


def tensor_digest(data):
    """The digest (`DIGEST`, 32 hex digits) of a tensor's bytes (any buffer)."""
    data = memoryview(data).cast("B")
    whole = len(data) // (8 * _BLOCK_WORDS) * (8 * _BLOCK_WORDS)
    words = np.frombuffer(data, np.uint64, whole // 8).reshape(-1, _BLOCK_WORDS)
    digest = hashlib.sha256(words.sum(axis=1, dtype=np.uint64).tobytes())
    digest.update(data[whole:])
    return digest.hexdigest()[:32]


def _digests(filepath, h5, places, names=None):
    """{dataset path: `tensor_digest`} for `names` (default: all) of `places` (`_tensors`).
    Contiguous tensors are read through a memory map of the file (no copy); the others, and
    all of them where the file cannot be mapped, through h5py."""
    names = sorted(places if names is None else names)
    with contextlib.ExitStack() as stack:
        try:
            f = stack.enter_context(open(filepath, "rb"))
            view = stack.enter_context(memoryview(stack.enter_context(
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))))
        except (OSError, ValueError):  # a file system without mmap
            view = None
        digests = {}
        for name in names:
            place = places[name] if view is not None else None
            if place is None:
                data = np.ascontiguousarray(h5[name][()])
                digests[name] = tensor_digest(data.tobytes() if data.dtype.kind != "O"
                                              else repr(data.tolist()).encode())
            else:
                offset, size = place
                with view[offset:offset + size] as part:
                    digests[name] = tensor_digest(part)
    return digests


def record(filepath, model, task_class=None):
    """Writes into the `.weights.h5` file `model` just saved: its task class (`task_class`),
    its settings (`function_settings`) and each tensor's digest (`RECORD_PATH`). Nothing for
    another file (Keras' sharded `.weights.json`, a `.keras` archive, a remote path)."""
    def put(group, name, text):  # a UTF-8 dataset, replacing the one there
        if name in group:
            del group[name]
        group[name] = _utf8(text)

    filepath = str(filepath)
    if not filepath.endswith(".weights.h5") or not os.path.isfile(filepath):
        return
    with h5py.File(filepath, "a") as h5:
        if task_class is not None:
            put(h5.require_group(f"{TASK_CLASS_PATH}/vars"), "0", task_class)
            h5.flush()  # the digests read the file's bytes
        digests = _digests(filepath, h5, _tensors(h5)[1])
        data = {"settings": function_settings(model), "digest": DIGEST, "digests": digests}
        put(h5, RECORD_PATH, json.dumps(data))


@contextlib.contextmanager
def checked_by_caller(filepath, verified_bytes=False, overridden=()):
    """Within it, `check_weights_file` leaves checks of `filepath` to the caller:
    `verified_bytes` (it verified the whole file's sha256, a preset's or checkpoint's manifest:
    the tensors are not hashed twice) and the settings `overridden` (keys of `FUNCTION_KEYS` it
    set otherwise on purpose and said so: `from_preset`'s overrides, which warn)."""
    outer = _CALLER_CHECKED.get()
    token = _CALLER_CHECKED.set({**outer, str(filepath): (bool(verified_bytes),
                                                          frozenset(overridden))})
    try:
        yield
    finally:
        _CALLER_CHECKED.reset(token)


class WeightsMismatch(ValueError):
    """A weights file refused as another model's: another layout, task class or configuration,
    or optimizer state of other variables or another optimizer (`check_weights_file`,
    `check_optimizer_store`). Its message names the file, what differs and how to proceed."""


class DamagedFile(OSError):
    """A weights file whose bytes changed after it was saved (its tensors' digests, a `.keras`
    archive's CRC-32), named."""


def verify_digests(filepath, recorded, places, h5=None):
    """Raises (OSError) naming `filepath` and the tensors whose bytes are not those the file's
    record holds. Only the tensors both hold are compared (a tensor the file lacks, or one a
    tool added, is the layout's to judge). `h5`: the file, open (else it is opened here)."""
    names = sorted(set(recorded) & set(places))
    with contextlib.nullcontext(h5) if h5 is not None else h5py.File(filepath, "r") as h5:
        actual = _digests(filepath, h5, places, names)
    changed = [name for name in names if actual[name] != recorded[name]]
    if changed:
        raise DamagedFile(
            f"The weights file {filepath!r} is damaged: the bytes of {len(changed)} tensor(s) "
            f"changed after it was saved: {_shown(changed)} (their digest differs from the one "
            f"recorded when it was saved). Restore the file or save it again. Nothing was "
            f"loaded.")


def verify_archive(archive, filepath, member=ARCHIVE_WEIGHTS, after=""):
    """Raises (`DamagedFile`, naming `filepath`, then `after`) when `member` of the `.keras`
    archive `archive` (an open `ZipFile`) does not hold the bytes whose CRC-32 the archive
    recorded (`archive_member`)."""
    with archive_member(archive, filepath, member, after):
        pass


class _Window(io.RawIOBase):
    """A read-only file over a buffer (`archive_member`'s view), for h5py: its reads and seeks
    cost what they read (zipfile's file object of a member rewinds to the member's start, and
    re-reads up to the new position, on every backward seek: ~3 s of a 45 MB archive's
    `read_layout`)."""

    def __init__(self, view):
        super().__init__()
        self._view, self._at = view, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._at

    def seek(self, offset, whence=io.SEEK_SET):
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        if start + offset < 0:
            raise ValueError(f"negative seek position {start + offset}")
        self._at = start + offset
        return self._at

    def readinto(self, buffer):
        with memoryview(buffer) as given, given.cast("B") as out:
            size = max(0, min(len(out), len(self._view) - self._at))
            out[:size] = self._view[self._at:self._at + size]
        self._at += size
        return size


@contextlib.contextmanager
def archive_member(archive, filepath, member=ARCHIVE_WEIGHTS, after=""):
    """Yields the bytes of `member` of the `.keras` archive `archive` (an open `ZipFile`), a
    memoryview, once checked against the CRC-32 the archive recorded: else `DamagedFile`
    (naming `filepath`, then `after`). zipfile checks it only at the end of a read from the
    member's start, and h5py's reads of the member seek (from Python 3.12 a seek in a stored
    member turns the check off: a changed byte loaded silently there). A stored member (Keras
    writes them so) is a window of a memory map of the archive, its header checked by zipfile
    (no copy: h5py reading it touches only what it reads); any other (deflated, or an archive
    without a file to map) is read through zipfile once into memory."""
    info = archive.getinfo(member)  # a missing member: KeyError, as zipfile's
    with contextlib.ExitStack() as stack:
        try:
            view = _stored_window(archive, info, stack)
            if view is None:
                view = stack.enter_context(memoryview(_read_member(archive, info)))
            elif zlib.crc32(view) != info.CRC:
                raise zipfile.BadZipFile(f"Bad CRC-32 for file {member!r}")
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise DamagedFile(
                f"The weights file {filepath!r} is damaged: its {member!r} does not hold the "
                f"bytes the archive recorded ({type(e).__name__}: {e}). Restore the file or save "
                f"it again.{after}") from e
        yield view


def _stored_window(archive, info, stack):
    """A memoryview of the stored member `info`'s bytes in a memory map of `archive`'s file
    (its maps entered into `stack`), or None where the member is compressed or encrypted, or
    the archive has no file to map."""
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return None
    try:
        mapped = stack.enter_context(mmap.mmap(archive.fp.fileno(), 0,
                                               access=mmap.ACCESS_READ))
    except (AttributeError, OSError, ValueError):  # no file (a file object), no mmap
        return None
    with archive.open(info):  # zipfile's checks of the member's local header
        pass
    # the data follows the 30-byte local header, its name and its extra field
    name_size, extra_size = struct.unpack_from("<HH", mapped, info.header_offset + 26)
    start = info.header_offset + 30 + name_size + extra_size
    if start + info.compress_size > len(mapped):
        raise EOFError(f"the archive ends {start + info.compress_size - len(mapped)} bytes "
                       f"before the end of {info.filename!r}")
    whole = stack.enter_context(memoryview(mapped))
    return stack.enter_context(whole[start:start + info.compress_size])


def _read_member(archive, info):
    """The bytes of the member `info`, read through zipfile once (which checks their CRC-32 at
    the end of the read)."""
    data = bytearray(info.file_size)
    with archive.open(info) as f, memoryview(data) as view:
        at = 0
        while at < len(data):
            read = f.readinto(view[at:at + (1 << 24)])
            if not read:
                raise EOFError(f"{info.filename!r} ends after {at} of {len(data)} bytes")
            at += read
        if f.read(1):  # zipfile checks the CRC-32 once it reaches the end
            raise zipfile.BadZipFile(f"{info.filename!r} holds more than {len(data)} bytes")
    return data


def check_archive_store(store):
    """For `load_own_variables(store)` of a task or backbone: where Keras reads a `.keras`
    archive's weights on the fly (`load_weights` of a `.keras`, also with skip_mismatch=True or
    into a user's model holding ours; `keras.saving.load_model`, once its read of the whole
    member failed), the archive's CRC-32 is checked once per read (`verify_archive`)."""
    archive = getattr(store, "archive", None)
    if (not isinstance(archive, zipfile.ZipFile) or getattr(store, "mode", None) != "r"
            or getattr(store, "_keras_bertfam_verified", False)
            or str(archive.filename) in _VERIFIED_ARCHIVES.get()):
        return
    store._keras_bertfam_verified = True
    verify_archive(archive, str(archive.filename), str(store.path_or_io))


class _LayoutStore(saving_lib.H5IOStore):
    """A write store for Keras' saving walk (`_save_state` takes Keras' store classes only)
    that keeps the shapes, not the values: `entries` {path: {key: shape}}, `places`
    {id(variable): the dataset path it is saved at ("<path>/vars/<key>")} of the variables
    saved as they are (a layer's own: Keras saves each variable itself), and `tasks` {path:
    task} of the tasks saved (the model's own at "", others inside it: `save_optimizer_record`)."""

    def __init__(self):  # no file
        self.entries, self.places, self.tasks, self._path = {}, {}, {}, None

    def __bool__(self):
        return True

    def make(self, path, metadata=None):
        self._path = path
        return self

    def __setitem__(self, key, value):
        self.entries.setdefault(self._path, {})[key] = tuple(np.shape(value))
        if isinstance(value, keras.Variable):
            self.places.setdefault(id(value), "/".join(filter(None, (self._path, "vars", key))))


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
    """{path: {key: shape}} of what `model.save_weights` would write (nothing is written), but
    its optimizer's state (`_walk`)."""
    return _walk(model)[0]


Walked = collections.namedtuple("Walked", "layout places tasks")


def _walk(model):
    """-> `Walked`: `layout` (`model_layout`), `places` {id(variable): the dataset path it is
    saved at} and `tasks` {path: task} (`_LayoutStore`) of `model`. Its optimizer is not walked
    (its state is a list of tensors that Keras reads out to save; the layout's comparison
    leaves it to `optimizer_mismatch`)."""
    cache_attr_skipsets()
    store = _LayoutStore()
    optimizer = getattr(model, "optimizer", None)
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                           visited_saveables={id(optimizer)} if optimizer is not None else set())
    return Walked({p: keys for p, keys in store.entries.items() if keys}, store.places,
                  store.tasks)


def _optimizer_state(model):
    """(`model`'s optimizer, the model variables its state is for, in its order), or None where
    it has no optimizer or one not built (no variables to load into)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.variables:
        return None
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    return optimizer, list(getattr(inner, "_trainable_variables", None) or [])


def _optimizer_classes(optimizer):
    """The names of `optimizer`'s class and of the optimizer classes it extends, Keras' base
    `Optimizer` excluded (a LossScaleOptimizer: its inner optimizer's), e.g. ["AdamW", "Adam"]:
    what its state's slots mean."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return [c.__name__ for c in type(inner).__mro__
            if issubclass(c, keras.optimizers.Optimizer) and c is not keras.optimizers.Optimizer]


def optimizer_record(model, places=None):
    """{"variables": the number of the optimizer's variables (what Keras compares), "classes":
    `_optimizer_classes`, "trainable": the dataset path each model variable whose state it holds
    is saved at, in the optimizer's order} of `model`'s optimizer, or None
    (`_optimizer_state`). A variable the weights do not hold as it is (a LoRA factor, merged
    into its kernel when saved) by its Keras path. `places`: the model's `_walk`'s, if it was
    walked (else it is walked here)."""
    state = _optimizer_state(model)
    if state is None:
        return None
    optimizer, trainable = state
    if places is None:
        places = _walk(model).places
    return {"variables": len(optimizer.variables), "classes": _optimizer_classes(optimizer),
            "trainable": [places.get(id(v), v.path) for v in trainable]}


def save_optimizer_record(model, store):
    """For `save_own_variables(store)` of a task: its `optimizer_record` under `OPTIMIZER_RECORD`
    (none without a built optimizer; in a layout walk, the task's path is noted instead)."""
    if isinstance(store, _LayoutStore):
        store.tasks.setdefault(store._path or "", model)
        return
    found = optimizer_record(model)
    if found is not None:
        store[OPTIMIZER_RECORD] = _utf8(json.dumps(found))


def optimizer_mismatch(saved, model, places=None):
    """Where Keras would load the optimizer state a file records (`saved`, its
    `optimizer_record`) into an optimizer of another class (`_optimizer_classes`: neither
    extends the other, e.g. Lion's moments as SGD's velocities) or onto other variables of
    `model`: what differs, naming the optimizers or the variables; else None (the same
    variables in the same order, of the same or an extended class; an optimizer of another
    variable count, whose state Keras skips with a warning; no optimizer to load into; a file
    recording no class, saved before it was recorded: the variables alone). `places`: as
    `optimizer_record`'s."""
    state = _optimizer_state(model)
    if (state is None or not isinstance(saved, dict)
            or saved.get("variables") != len(state[0].variables)):
        return None
    saved_classes, classes = saved.get("classes"), _optimizer_classes(state[0])
    if (isinstance(saved_classes, list) and saved_classes
            and saved_classes[0] not in classes and classes[0] not in saved_classes):
        return (f"its optimizer state is a {saved_classes[0]}'s, the model's optimizer is a "
                f"{classes[0]}, whose state means something else ({saved['variables']} "
                f"variables each: Keras would load them by position, the {saved_classes[0]}'s "
                f"as the {classes[0]}'s). Compile with a {saved_classes[0]} (as saved) to resume "
                f"its training, or load the weights before `compile` (a fresh optimizer; "
                f"`keras.saving.load_model(path, compile=False)`).")
    theirs = [str(p) for p in saved.get("trainable") or []]
    own = optimizer_record(model, places)["trainable"]
    if theirs == own:
        return None
    differ = [f"{o} would get {t}'s" for o, t in zip(own, theirs) if o != t]
    counts = (f"it is for {len(theirs)} trainable variables, the model's optimizer for "
              f"{len(own)}; " if len(theirs) != len(own) else "")
    return (f"its optimizer state is other variables' (Keras loads it by position): {counts}"
            f"{len(differ)} of the model's {len(own)} trainable variables would get another's "
            f"moments: {_shown(differ, 3)}. Freeze the same layers as in the saved model before "
            f"`compile`, or load the weights before `compile` (a fresh optimizer).")


def optimizers_mismatch(model, saved_at, walked=None):
    """`optimizer_mismatch` of `model`'s own optimizer state and of each task's inside it (a
    Distiller's compiled teacher: Keras saves and loads its optimizer at its path), the first
    found (a task inside named, with its path), else None. `saved_at(path)`: the
    `optimizer_record` the file holds for the task at `path` ("" the model's own), or None.
    `walked`: the model's `_walk`, if it was walked (else it is walked here, where any
    optimizer is built)."""
    if walked is None:
        if not any(_optimizer_state(layer) for layer in model._flatten_layers(include_self=True)):
            return None
        walked = _walk(model)
    for path, task in sorted(walked.tasks.items()):
        saved = saved_at(path)
        if saved is None:
            continue
        if task is model:
            mismatch = optimizer_mismatch(saved, task, walked.places)
        else:  # (recorded by the task's own walk: its paths are its own)
            mismatch = optimizer_mismatch(saved, task)
            if mismatch:
                mismatch = f"its {type(task).__name__} {task.name!r} (at {path!r}): {mismatch}"
        if mismatch:
            return mismatch
    return None


def check_optimizer_store(model, store):
    """For `load_own_variables(store)` of a task, where `checked_load` did not compare the file
    (`keras.saving.load_model`; a sharded or remote file): refuses (`WeightsMismatch`) the
    optimizer state its record says is for other variables or another optimizer class
    (`optimizers_mismatch`: the task's own, and those of the tasks inside it, read at their
    paths from the store's file). Keras' walk goes on loading, then raises it (no model is
    returned)."""
    if id(model) in _OPTIMIZERS_CHECKED.get():
        return
    h5 = getattr(store, "h5_file", None)
    base = getattr(store, "_h5_entry_path", None) or ""

    def saved_at(path):
        if not path:
            return _json_of(store[OPTIMIZER_RECORD]) if OPTIMIZER_RECORD in store.keys() else None
        found = "/".join(filter(None, (base, path, "vars", OPTIMIZER_RECORD)))
        return (_json_of(h5[found]) if isinstance(h5, (h5py.File, h5py.Group)) and found in h5
                else None)

    mismatch = optimizers_mismatch(model, saved_at)
    if mismatch:  # (`load_model` reads the archive's weights from memory: no file name)
        archive = getattr(store, "archive", None)
        name = (archive.filename if isinstance(archive, zipfile.ZipFile)
                else getattr(h5, "filename", None))
        source = f"the weights file {name!r}" if isinstance(name, str) else "the weights"
        raise WeightsMismatch(f"Cannot load {source} into {type(model).__name__} "
                              f"{model.name!r}: {mismatch}")


def config_settings(config):
    """`function_settings` of the model a `.keras` archive's `config` (its config.json)
    describes, read from the config alone: "" its own constructor arguments, and those of each
    backbone serialized inside it, named as `function_settings` names them (by the argument
    holding it, `_roles`). None for a model not of this library (Keras' own archives hold no
    such record)."""
    from keras_bertfam.models.backbone import Backbone  # models.backbone imports this module

    def own(entry):
        args = entry.get("config")
        args = args if isinstance(args, dict) else {}
        keys = function_keys(registered(entry))
        return setting_value({k: args[k] for k in keys if k in args})

    def registered(entry):
        try:
            return keras.saving.get_registered_object(entry.get("registered_name") or "")
        except Exception:  # noqa: BLE001 - a name this session cannot resolve
            return None

    def is_backbone(entry):
        cls = registered(entry)
        return isinstance(cls, type) and issubclass(cls, Backbone)

    def backbones(value):
        if isinstance(value, dict):
            if "class_name" in value and "config" in value and is_backbone(value):
                return [value]
            return [b for v in value.values() for b in backbones(v)]
        if isinstance(value, list):
            return [b for v in value for b in backbones(v)]
        return []

    if not (isinstance(config, dict)
            and str(config.get("module", "")).startswith("keras_bertfam.")):
        return None
    args = config.get("config")
    held = [(name, b) for name, value in (args.items() if isinstance(args, dict) else ())
            for b in backbones(value)]
    settings = {"": own(config)}
    for role, (_, backbone) in zip(_roles([name for name, _ in held]), held):
        settings[role] = own(backbone)
    return settings


@contextlib.contextmanager
def _open_h5(filepath):
    """-> (the h5 file, the task class a `.keras` archive's config names, else None, the
    archive's `config_settings`, else None); a `.keras` archive's weights verified first
    (`archive_member`), and read through its view (`_Window`)."""
    if filepath.endswith(".keras"):
        with zipfile.ZipFile(filepath) as archive, archive_member(
                archive, filepath, after=" Nothing was loaded.") as view, \
                h5py.File(_Window(view), "r") as h5:
            config = json.loads(archive.read("config.json"))
            ours = str(config.get("module", "")).startswith("keras_bertfam.tasks.")
            yield h5, config.get("class_name") if ours else None, config_settings(config)
    else:
        with h5py.File(filepath, "r") as h5:
            yield h5, None, None


SavedFile = collections.namedtuple("SavedFile", "layout task record places optimizer")


def read_layout(filepath):
    """-> `SavedFile`: `layout` {path: {key: shape}}, `task` the task class it was saved from
    or None (a backbone's, a user's class, a file saved before tasks recorded it), `record`
    ({"settings", "digests"}, `record`; a `.keras` archive of this library's model: its
    `config_settings` alone; None in a file without it), `places` (its tensors'
    bytes, `_tensors`; None without a record) and `optimizer` ({path: the `optimizer_record`
    of the task saved there}: "" the saved task's own, others of tasks inside it; empty in a
    file without it) of a `.weights.h5` file or a `.keras`
    archive's weights; a file that is not one (truncated, damaged, another
    format) is an OSError naming it (as h5py's, which does not)."""
    with _read(filepath) as (saved, _):
        return saved


@contextlib.contextmanager
def _read(filepath):
    """`read_layout`, the file kept open within: -> (`SavedFile`, the h5 file)."""
    found, optimizer = None, {}
    if not os.path.exists(filepath):
        raise FileNotFoundError(f"The weights file {filepath!r} does not exist.")
    with contextlib.ExitStack() as stack:
        try:
            h5, task, configured = stack.enter_context(_open_h5(filepath))
            recorded = RECORD_PATH in h5
            layout, places = _tensors(h5, with_places=recorded)
            if layout.pop(TASK_CLASS_PATH, None):
                task = h5[TASK_CLASS_PATH]["vars"]["0"][()]
            optimizer = {p: _json_of(h5["/".join(filter(None, (p, "vars", OPTIMIZER_RECORD)))])
                         for p, keys in layout.items() if OPTIMIZER_RECORD in keys}
            if recorded:
                found = _json_of(h5[RECORD_PATH])
            elif configured is not None:  # a `.keras` archive: its model's config says them
                found = {"settings": configured}
        except DamagedFile:
            raise
        except Exception as e:  # h5py's OSError, zipfile's BadZipFile, a missing group, ...
            raise OSError(
                f"Cannot read the weights file {filepath!r} ({os.path.getsize(filepath)} bytes): "
                f"it is truncated, damaged or not a Keras weights file ({type(e).__name__}: {e})."
            ) from e
        if isinstance(task, np.ndarray):
            task = bytes(task.astype(np.uint8)).decode("utf-8", errors="replace")
        yield SavedFile(layout, task, found if isinstance(found, dict) else None, places,
                        optimizer), h5


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


def _settings_differ(saved, own, overridden=()):
    """["<owner's >key is <file's> in the file, <model's> in the model"] of the settings
    (`function_settings`) both record that differ, but for the keys `overridden`."""
    differ = []
    for owner in sorted(saved.keys() & own.keys()):
        if not isinstance(saved[owner], dict):
            continue
        whose = f"the {owner}'s " if owner else ""
        differ += [f"{whose}{key} is {saved[owner][key]!r} in the file, {own[owner][key]!r} in "
                   f"the model" for key in FUNCTION_KEYS if key not in overridden
                   and key in saved[owner] and key in own[owner]
                   and saved[owner][key] != own[owner][key]]
    return differ


def _is_checked(filepath):
    """Whether `check_weights_file` reads `filepath`: a local `.weights.h5` or `.keras`."""
    return filepath.endswith((".weights.h5", ".keras")) and not is_remote_path(filepath)


@contextlib.contextmanager
def checked_load(model, filepath, task_class=None, skip_mismatch=False):
    """Around Keras' `load_weights` of our task or backbone `model`: `check_weights_file`
    first (unless `skip_mismatch`, Keras' partial loading, or `model` is not built); within,
    Keras' read of the `.keras` archive the check verified does not verify its CRC-32 again
    (`check_archive_store`), nor compare the optimizer's record again (`check_optimizer_store`)."""
    filepath = str(filepath)
    checking = not skip_mismatch and model.built
    if checking:
        check_weights_file(model, filepath, task_class)
    archives, models = _VERIFIED_ARCHIVES.get(), _OPTIMIZERS_CHECKED.get()
    if checking and _is_checked(filepath) and filepath.endswith(".keras"):
        archives |= {filepath}
    if not checking or _is_checked(filepath):  # the tasks inside it too (`optimizers_mismatch`)
        models |= {id(layer) for layer in model._flatten_layers(include_self=True)}
    tokens = _VERIFIED_ARCHIVES.set(archives), _OPTIMIZERS_CHECKED.set(models)
    try:
        yield
    finally:
        _OPTIMIZERS_CHECKED.reset(tokens[1])
        _VERIFIED_ARCHIVES.reset(tokens[0])


def check_weights_file(model, filepath, task_class=None):
    """Refuses (`WeightsMismatch`, a ValueError) a weights file whose layout is not the
    model's, before anything is loaded: weights the model has no place for, model weights the
    file lacks, shapes that differ (naming the paths), or, for a task (`task_class`, its class
    name), a file another task class saved, or optimizer state recorded as other variables'
    or another optimizer's (`optimizers_mismatch`: the model's and that of each task inside
    it).
    The rest of the optimizer state (the model's, and that of each task inside it) is left to
    Keras, and so are the keys a layer reads itself (a task's seed generators, a LoRA layer's
    factors): only the keys both sides hold are compared. A file our `save_weights` wrote
    (`record`) is also refused when a tensor's bytes changed after saving (`DamagedFile`) or
    when the model's `function_settings` differ from the file's, unless the caller made that
    check itself (`checked_by_caller`); a `.keras` archive whose weights are not those its
    CRC-32 records (`verify_archive`) alike."""
    filepath = str(filepath)
    if not _is_checked(filepath):
        return  # Keras' sharded `.weights.json`, a remote file: loaded by Keras as they are
    verified_bytes, overridden = _CALLER_CHECKED.get().get(filepath, (False, frozenset()))
    with _read(filepath) as (saved_file, h5), contextlib.ExitStack() as stack:
        saved_layout, saved_task, record = saved_file.layout, saved_file.task, saved_file.record
        digests = record.get("digests") if record else None
        verification = None
        if isinstance(digests, dict) and filepath.endswith(".weights.h5") and not verified_bytes:
            # hashed in a thread while the model's layout is walked (NumPy and hashlib release
            # the GIL); the thread is done before the file closes
            pool = concurrent.futures.ThreadPoolExecutor(1)
            stack.callback(pool.shutdown)
            verification = pool.submit(verify_digests, filepath, digests, saved_file.places, h5)
        walked = _walk(model)
        own_layout = walked.layout
        if verification is not None:
            verification.result()
    where = f"the weights file {filepath!r} into {type(model).__name__} {model.name!r}"

    # The optimizer state of the model and of each task inside it (a Distiller's teacher, compiled
    # or not when saved): compared by `optimizers_mismatch`, the rest left to Keras, which skips
    # it with a warning where the optimizer has another variable count (or none to load into).
    optimizers = {OPTIMIZER} | {"/".join(filter(None, (path, OPTIMIZER))) for path in walked.tasks}

    def weights(layout):
        return {p for p in layout
                if p and not any(p == o or p.startswith(o + "/") for o in optimizers)}

    saved, own = weights(saved_layout), weights(own_layout)
    extra, missing = sorted(saved - own), sorted(own - saved)
    shapes = [f"{p}: {k} is {saved_layout[p][k]} in the file, {own_layout[p][k]} in the model"
              for p in sorted(saved & own)
              for k in sorted(saved_layout[p].keys() & own_layout[p].keys())
              if saved_layout[p][k] != own_layout[p][k]]
    if not (extra or missing or shapes):
        if task_class is not None and saved_task is not None and saved_task != task_class:
            raise WeightsMismatch(
                f"Cannot load {where}: the file holds a {saved_task}'s weights, whose head is "
                f"not a {task_class}'s (the same shapes, another function). Load its backbone "
                f"alone (`backbone.save_weights` / `task.backbone.load_weights`). Nothing was "
                f"loaded.")
        settings = record.get("settings") if record else None
        differ = _settings_differ(settings, function_settings(model), overridden) if isinstance(
            settings, dict) else []
        if differ:
            raise WeightsMismatch(
                f"Cannot load {where}: it was saved from a model configured otherwise, whose "
                f"weights have the same shapes but compute something else: "
                f"{'; '.join(differ)}. Build the model with the file's values (or pass "
                f"skip_mismatch=True to load the weights anyway). Nothing was loaded.")
        mismatch = optimizers_mismatch(model, saved_file.optimizer.get, walked)
        if mismatch:
            raise WeightsMismatch(f"Cannot load {where}: {mismatch} Nothing was loaded.")
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
    raise WeightsMismatch(
        f"Cannot load {where}: it was saved from another model or configuration (another "
        f"family, task, num_layers, hidden_dim, num_heads, vocabulary_size, num_classes, ...): "
        f"{'; '.join(problems)}.{hint} Nothing was loaded.")
