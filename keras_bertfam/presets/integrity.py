"""Weights that cannot load wrong: sha256 checksums for the files of our preset manifests, and a
finiteness check for weights from files without our manifest (HF safetensors / .bin, keras-hub
`model.weights.h5`).

A preset manifest (`keras_bertfam.json`) written by `save_to_preset` records
`"files": {relative path: sha256}` for every weights and asset file, and is written last, so a
directory whose manifest exists is complete. `verify` recomputes the digests on load (in a
thread, while the model is built and the file read): a flipped byte anywhere in
`backbone.weights.h5` is refused naming the file, and the load returns nothing.
Checkpoint manifests (the CLI's) can use the same `checksums` / `verify`.
"""
import concurrent.futures
import hashlib
import os

import numpy as np

_CHUNK = 8 << 20  # hashlib releases the GIL on large buffers: hashing overlaps model building


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the requested model (`checkpoints.CheckpointError`)."""


class IntegrityError(CheckpointError):
    """A file that does not match its manifest, or weights that are not finite."""


def read_json_object(path):
    """A JSON file holding an object (config.json, tokenizer.json, keras_bertfam.json) -> dict;
    a damaged, truncated or binary file, or another JSON type, is a `CheckpointError` naming the
    file (not json's or the codec's bare error)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path!r} is not a readable JSON file ({type(e).__name__}: {e}): "
                              "a damaged or truncated file?") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path!r} holds a JSON {type(data).__name__}, not an object of "
                              "keys.")
    return data


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def checksums(root, names):
    """{name: sha256} of the files `names` (paths relative to `root`, "/"-separated)."""
    return {name: sha256(os.path.join(root, *name.split("/"))) for name in sorted(names)}


def files_under(root, subdir):
    """The files under `root/subdir`, as "/"-separated paths relative to `root`."""
    out = []
    for dirpath, _, filenames in os.walk(os.path.join(root, subdir)):
        for filename in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, filename), root).replace(os.sep, "/"))
    return out


def verify(root, recorded, names=None, manifest="keras_bertfam.json"):
    """Checks the files `names` (default: all) of `recorded` ({name: sha256}) under `root`."""
    for name in sorted(recorded if names is None else names):
        if name not in recorded:
            continue
        path = os.path.join(root, *name.split("/"))
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path!r} is missing: {os.path.join(root, manifest)!r} lists "
                                    "it as part of the preset.")
        actual = sha256(path)
        if actual != recorded[name]:
            raise IntegrityError(
                f"{path!r} is corrupt: its sha256 is {actual[:16]}..., {manifest} recorded "
                f"{recorded[name][:16]}... when it was saved. The file was damaged or changed "
                "after saving; restore it or save the preset again.")


class Verification:
    """`verify` started in a thread (so it overlaps building the model); `result()` raises its
    error. With nothing recorded it is a no-op (presets saved before checksums existed)."""

    def __init__(self, root, recorded, names):
        self._future = None
        if recorded and any(name in recorded for name in names):
            pool = concurrent.futures.ThreadPoolExecutor(1)
            self._future = pool.submit(verify, root, recorded, names)
            pool.shutdown(wait=False)

    @property
    def recorded(self):
        """Whether the manifest records a checksum of the files (else nothing is verified)."""
        return self._future is not None

    def result(self):
        if self._future is not None:
            self._future.result()


def check_finite(key, value, source):
    """Raises naming tensor `key` of file `source` if `value` holds NaN or inf."""
    value = np.asarray(value)
    # A NaN or inf anywhere makes the sum NaN or inf, so a finite sum clears the tensor in one
    # pass with no [N] boolean temporary; only a non-finite sum (or one overflowing from huge
    # finite values) is checked element by element.
    if value.dtype.kind == "f" and not (np.isfinite(np.sum(value, dtype=np.float64)) or
                                        np.isfinite(value).all()):
        bad = int(value.size - np.isfinite(value).sum())
        raise IntegrityError(
            f"{source!r}: tensor {key!r} {tuple(value.shape)} holds {bad} non-finite value(s) "
            "(NaN or inf); expected finite weights. The file is corrupt or was saved from a "
            "diverged model.")
