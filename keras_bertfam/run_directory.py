"""A training run's output directory: a lock, and checkpoints that are one atomic unit each.

Layout of `OUTPUT/` (`keras-bertfam pretrain --output OUTPUT`):

    .lock                      the PID of the run writing here (flock'ed while it runs)
    checkpoints/step-200/      the newest complete checkpoint (older ones are deleted)
        <files>                e.g. model.weights.h5, training_state.json
        manifest.json          written last: the step and every file's size and sha256
    preset/  export/1/         what a finished run produces

A checkpoint is written into `checkpoints/tmp-step-N.PID/`, its manifest last, and then renamed to
`step-N` in one `rename`: a run killed at any moment leaves either the previous complete
checkpoint or the new complete one (plus temporary entries, removed at the next start). Resuming
verifies the manifest: every file present with its size and sha256, and the step it names.

Only the standard library here: the CLI checks a directory (lock, writability, the checkpoint's
integrity) before it imports TensorFlow.
"""
import errno
import hashlib
import json
import os
import shutil

from keras_bertfam.atomic import fsync_dir

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
LOCK = ".lock"
FORMAT = 1

# Tests kill the process at the N-th file boundary of a checkpoint write (a file written, a
# directory renamed or removed): KERAS_BERTFAM_TEST_EXIT_AT_BOUNDARY=N exits (as kill -9 would,
# no cleanup) right after it; `boundary_hook` (a function of the boundary's number and a label)
# is called at each one, as boundary_hook(number, step, label).
boundary_hook = None
_boundaries = [0]


class RunDirectoryError(Exception):
    """A problem with the output directory or a checkpoint in it; the message says what to do."""


def _boundary(step, label):
    _boundaries[0] += 1
    n = _boundaries[0]
    if boundary_hook is not None:
        boundary_hook(n, step, label)
    if os.environ.get("KERAS_BERTFAM_TEST_EXIT_AT_BOUNDARY") == str(n):
        os._exit(137)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fresh(path):
    return f"Delete {path} (or use a new --output) to start fresh."


class RunDirectory:
    """The output directory of one training run. `with RunDirectory(path) as run:` creates it,
    checks that it is writable, locks it and removes temporary entries of an interrupted run."""

    def __init__(self, path):
        self.path = path
        self.checkpoints = os.path.join(path, CHECKPOINTS)
        self._lock_fd = None
        self.took_over = None  # the PID of a dead run whose lock this one took over

    # === Lock and writability ===
    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def open(self):
        try:
            os.makedirs(self.checkpoints, exist_ok=True)
            for where in (self.path, self.checkpoints):
                probe = os.path.join(where, f"tmp-write-test.{os.getpid()}")
                with open(probe, "w") as f:
                    f.write("ok")
                os.remove(probe)
        except OSError as e:
            raise RunDirectoryError(
                f"--output {self.path} is not a writable directory ({e.strerror or e}: "
                f"{e.filename or self.path}); choose another --output.") from None
        self._lock()
        self.remove_temporaries()

    def _lock(self):
        import fcntl

        path = os.path.join(self.path, LOCK)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise RunDirectoryError(
                    f"--output {self.path} is in use by another run (PID {self._holder(path)}, "
                    f"lock {path}): wait for it to finish, stop it, or use another --output."
                ) from None
            # The holder may have removed the file between our open and flock: lock the file
            # that is at the path now.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # A lock left by a dead process (kill -9) holds no flock: it is taken over here.
        previous = os.read(fd, 64).decode(errors="replace").strip()
        if previous and previous != str(os.getpid()):
            self.took_over = previous
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._lock_fd = fd

    @staticmethod
    def _holder(path):
        try:
            with open(path) as f:
                return f.read().strip() or "unknown"
        except OSError:
            return "unknown"

    def close(self):
        if self._lock_fd is None:
            return
        try:
            os.remove(os.path.join(self.path, LOCK))
        except OSError:
            pass
        os.close(self._lock_fd)  # releases the flock
        self._lock_fd = None

    def remove_temporaries(self):
        """Temporary entries a killed run left (a half-written checkpoint, one being deleted)."""
        for where in (self.path, self.checkpoints):
            for name in os.listdir(where):
                if name.startswith("tmp-"):
                    full = os.path.join(where, name)
                    if os.path.isdir(full) and not os.path.islink(full):
                        shutil.rmtree(full, ignore_errors=True)
                    else:
                        try:
                            os.remove(full)
                        except OSError:
                            pass

    # === Checkpoints ===
    def steps(self):
        """Steps of the complete (renamed) checkpoints, ascending."""
        if not os.path.isdir(self.checkpoints):
            return []
        found = []
        for name in os.listdir(self.checkpoints):
            if name.startswith("step-") and name[5:].isdigit():
                found.append(int(name[5:]))
        return sorted(found)

    def checkpoint_dir(self, step):
        return os.path.join(self.checkpoints, f"step-{step}")

    def latest(self, expected_files):
        """The newest checkpoint as (step, directory), verified against its manifest, or None.

        Raises RunDirectoryError naming the file when a file is missing, truncated or corrupt.
        """
        steps = self.steps()
        if not steps:
            return None
        step = steps[-1]
        where = self.checkpoint_dir(step)
        older = (f" The previous checkpoint (step {steps[-2]}) is intact: delete {where} to "
                 "resume from it." if len(steps) > 1 else "")
        manifest_path = os.path.join(where, MANIFEST)
        try:
            with open(manifest_path) as f:
                manifest = json.load(f)
            files = manifest["files"]
            if manifest.get("step") != step or not isinstance(files, dict):
                raise ValueError(f"it names step {manifest.get('step')}")
        except FileNotFoundError:
            raise RunDirectoryError(
                f"The checkpoint manifest {manifest_path} is missing.{older} {_fresh(self.path)}"
            ) from None
        except (ValueError, KeyError, TypeError) as e:
            raise RunDirectoryError(
                f"The checkpoint manifest {manifest_path} is corrupt ({type(e).__name__}: "
                f"{e}).{older} {_fresh(self.path)}") from None
        for name in expected_files:
            if name not in files:
                raise RunDirectoryError(
                    f"The checkpoint manifest {manifest_path} does not list {name}.{older} "
                    f"{_fresh(self.path)}")
        for name, entry in files.items():
            path = os.path.join(where, name)
            if not os.path.isfile(path):
                raise RunDirectoryError(
                    f"The checkpoint file {path} is missing.{older} {_fresh(self.path)}")
            size = os.path.getsize(path)
            if size != entry.get("bytes") or sha256(path) != entry.get("sha256"):
                raise RunDirectoryError(
                    f"The checkpoint file {path} is corrupt (its size or sha256 differs from "
                    f"{MANIFEST}'s).{older} {_fresh(self.path)}")
        return step, where

    def save(self, step, writers):
        """Writes a checkpoint of `step`: `writers` maps each file name to a function writing
        that file at the path it is given. Returns the checkpoint's directory."""
        final = self.checkpoint_dir(step)
        tmp = os.path.join(self.checkpoints, f"tmp-step-{step}.{os.getpid()}")
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        files = {}
        for name, write in writers.items():
            path = os.path.join(tmp, name)
            write(path)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            files[name] = {"bytes": os.path.getsize(path), "sha256": sha256(path)}
            _boundary(step, f"wrote {name}")
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"format": FORMAT, "step": step, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        _boundary(step, f"wrote {MANIFEST}")
        if os.path.exists(final):  # this step is saved already (complete): keep that one
            shutil.rmtree(tmp)
            return final
        os.rename(tmp, final)
        fsync_dir(self.checkpoints)
        _boundary(step, f"renamed to {os.path.basename(final)}")
        for old in self.steps():
            if old != step:
                trash = os.path.join(self.checkpoints, f"tmp-old-step-{old}")
                os.rename(self.checkpoint_dir(old), trash)
                _boundary(step, f"renamed step-{old} for removal")
                shutil.rmtree(trash)
                _boundary(step, f"removed step-{old}")
        return final
