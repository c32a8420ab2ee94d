"""The `keras-bertfam` console script.

It imports `keras_bertfam` in its lazy mode (submodules on first use), so that `--help`, argument
errors and the checks of the output directory answer without importing TensorFlow, and so that
TensorFlow's log lines can be silenced before it is imported (`keras_bertfam.cli`). A plain
`import keras_bertfam` stays eager: every class is registered with Keras' serialization at import.
"""
import os
import sys


def main(argv=None):
    if argv is None:  # the program itself (not a caller's own process, whose imports are its own)
        # Keras imports scikit-learn and pandas when they are installed (its scikit-learn
        # wrappers, its pandas inputs), TensorFlow JAX (tf.lite): ~2.7 s of CPU at every start
        # for modules no command uses (JAX: unless it is the backend).
        unused = ("sklearn", "pandas")
        if os.environ.get("KERAS_BACKEND") == "tensorflow":
            unused += ("jax",)
        for name in unused:
            sys.modules.setdefault(name, None)
    os.environ["KERAS_BERTFAM_LAZY_IMPORT"] = "1"
    try:
        from keras_bertfam import cli
    finally:  # only this process's first import of the package is lazy; children are not
        os.environ.pop("KERAS_BERTFAM_LAZY_IMPORT", None)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
