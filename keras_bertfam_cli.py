"""The `keras-bertfam` console script.

It imports `keras_bertfam` in its lazy mode (submodules on first use), so that `--help`, argument
errors and the checks of the output directory answer without importing TensorFlow, and so that
TensorFlow's log lines can be silenced before it is imported (`keras_bertfam.cli`). A plain
`import keras_bertfam` stays eager: every class is registered with Keras' serialization at import.
"""
import os
import sys


def main(argv=None):
    os.environ["KERAS_BERTFAM_LAZY_IMPORT"] = "1"
    try:
        from keras_bertfam import cli
    finally:  # only this process's first import of the package is lazy; children are not
        os.environ.pop("KERAS_BERTFAM_LAZY_IMPORT", None)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
