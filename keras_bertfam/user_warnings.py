"""Warnings that point at the user's line.

`warn` gives a warning from the first frame outside keras_bertfam and outside the libraries it
runs under (Keras, keras-hub, TensorFlow, JAX, torch, ...; importlib's frozen frames): the
`from_preset`, `fit`, `export`, ... call in the user's script, notebook cell or test, however
deep the package is when it warns and whoever called it (a `tf.data` map or a `fit` tracing our
code, Keras' weight loading calling a layer's `load_own_variables`). A fixed `stacklevel` points
wherever the call depth happened to be. Without such a frame (everything on the stack is library
code, e.g. a `tf.data` worker thread), the outermost frame. When the CLI is the program (the
`keras-bertfam` console script, `python -m keras_bertfam_cli`, `python -m keras_bertfam.cli`,
which runs the console script's `main`), the user's line is the CLI's: `keras_bertfam_cli.main`'s
call that runs the command (so `keras_bertfam_cli` is not in `LIBRARIES`).

A leaf module: it imports nothing of ours, so that every part of the package may use it."""
import sys
import warnings

# Top-level modules whose frames are not the user's (matched on a frame's module `__name__`,
# which AutoGraph's converted code keeps, unlike its file name).
LIBRARIES = frozenset({
    __name__.partition(".")[0],  # keras_bertfam
    "keras", "keras_hub", "keras_nlp", "tf_keras", "tensorflow", "tensorflow_text", "tf2onnx",
    "jax", "jaxlib", "torch", "optree", "tree", "absl", "importlib", "contextlib",
})


def _is_library(frame):
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str):
        return False
    return (name.partition(".")[0] in LIBRARIES
            or frame.f_code.co_filename.startswith("<frozen importlib"))


def user_frame(frame=None):
    """The first frame, from `frame` (by default `user_frame`'s caller) outwards, that is not
    library code (see `LIBRARIES`); the outermost frame if every one is."""
    frame = frame if frame is not None else sys._getframe(1)
    while _is_library(frame) and frame.f_back is not None:
        frame = frame.f_back
    return frame


def warn(message, category=UserWarning):
    """`warnings.warn(message, category)` given at the user's frame (`user_frame`): Python
    prints its `file:line`, and filters (`"default"`, `"once"`, `-W error`, `catch_warnings`)
    see the user's module, as a warning with the right `stacklevel` would. Python 3.11 has no
    `skip_file_prefixes`, and `stacklevel` counts frames differently (it skips importlib's), so
    the warning is given explicitly at that frame."""
    if isinstance(message, Warning):
        category = type(message)
    frame = user_frame(sys._getframe(1))
    module = frame.f_globals.get("__name__")
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    # No `module_globals`: with it, the source line is fetched through the module's loader,
    # which raises for `python -c` and `python -m` programs' `__main__` ("'__main__' is not a
    # built-in module"); `warnings.warn` does not pass it either. The line is read from the
    # file when the warning is shown.
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=module if isinstance(module, str) else None,
                           registry=registry)
