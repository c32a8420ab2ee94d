"""Files and directories replaced whole: a kill at any moment leaves the old one or the new one.

Only the standard library: the CLI checks its run directory before it imports TensorFlow, and
`save_to_preset` (presets), the CLI's run (run_directory) and the SavedModel tools (export)
write through it.
"""
import os
import shutil


def fsync_dir(path):
    """Flushes a directory's entries (a rename in it) to disk, where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_dir(tmp, final):
    """Moves the complete directory `tmp` to `final`, replacing what is there: the old one is
    renamed aside (to `tmp-old-<name>.<pid>` beside it) first and removed after, so a kill at
    any moment leaves a whole directory at `final` or, between the two renames, at that name
    (`old_copies` finds it)."""
    head, name = os.path.split(os.path.abspath(final))
    old = os.path.join(head, f"tmp-old-{name}.{os.getpid()}")
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(head)
    if os.path.exists(old):
        shutil.rmtree(old)


def old_copies(final):
    """The directories `replace_dir` renamed aside from `final` and did not remove."""
    head, name = os.path.split(os.path.abspath(final))
    prefix = f"tmp-old-{name}."
    if not os.path.isdir(head):
        return []
    return sorted(os.path.join(head, f) for f in os.listdir(head)
                  if f.startswith(prefix) and f[len(prefix):].isdigit())


def write_file(path, write, mode="w"):
    """Writes the file `path` whole: `write(f)` into `path + ".tmp"` (opened with `mode`), then
    renamed over `path`. A write that fails leaves the old file as it was and no ".tmp" (a kill
    may leave the ".tmp", never a half-written `path`)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, mode) as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
