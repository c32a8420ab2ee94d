"""TensorFlow errors out of the preprocessing layers, with their message, on every backend.

A layer here runs TensorFlow ops under every Keras backend. When one fails in an eager call
(a label out of range, a byte-pair piece outside the vocabulary: a `tf.debugging.Assert`, or
any TensorFlow op's error), Keras' `Layer.__call__` re-raises the error with the call's
arguments added (`keras.src.utils.traceback_utils.inject_argument_info_in_traceback`). It knows
TensorFlow's errors only under the TensorFlow backend: under JAX and PyTorch it reads the
message from `args`, which a `tf.errors.OpError` leaves empty, and rebuilds the error with one
argument, which an OpError does not take, so the user got a RuntimeError whose message was empty
("Exception encountered when calling ...", then nothing, then the arguments).

`KeepsTFErrors`, first among the bases of every such layer (`_TFLayer`, the tokenizers, the
pretraining and fine-tuning preprocessors), gives the error its message back at the outermost
layer call: the same error on every backend, the TensorFlow error's class with Keras' context
and TensorFlow's message. An `InvalidArgumentError` (what an input check raises) becomes an
`InvalidInputError`, both a `tf.errors.InvalidArgumentError` and a ValueError (Python's error
for a wrong value). In a `tf.data` pipeline (`prepare`, a task's `fit` on raw text) the error
comes from the iterator, not from a layer call, and keeps TensorFlow's class and message.
"""
import re

import tensorflow as tf

# A traced function's error: "Graph execution error:", the failing op's Python stack when it
# was traced ("Detected at node ... defined at (most recent call last):", indented lines), then
# TensorFlow's message. The stack is the layer's own code (the traceback shows the user's call).
_GRAPH_STACK = re.compile(r"Graph execution error:\n\n|Detected at node [^\n]* defined at "
                          r"\(most recent call last\):\n(?:[ \t][^\n]*\n|\n)*")


class InvalidInputError(tf.errors.InvalidArgumentError, ValueError):
    """A preprocessing layer's eager call refused its input (a TensorFlow InvalidArgumentError,
    e.g. a failed input check); also a ValueError."""


def readable(message):
    """TensorFlow's message without a traced op's stack, with an assertion's quotes unescaped
    (`tf.debugging.Assert` prints its string data C-escaped: \\"T\\" for "T")."""
    message = _GRAPH_STACK.sub("", message)
    if "assertion failed: [" in message:
        message = message.replace('\\"', '"').replace("\\'", "'")
    return message


def carry_tf_error(error):
    """The error to raise instead of `error` (out of a Keras layer call) so that a TensorFlow
    error keeps its message on every backend; None: raise `error` itself."""
    if getattr(error, "_tf_message_carried", False):  # by an inner layer's call
        return None
    if isinstance(error, tf.errors.OpError):  # TensorFlow backend: Keras rebuilt it in context
        op_error, message = error, readable(error.message)
    elif (isinstance(error, RuntimeError) and hasattr(error, "_keras_call_info_injected")
          and isinstance(error.__context__, tf.errors.OpError)):
        # JAX / PyTorch: Keras' RuntimeError, whose message lacks the TensorFlow error's (its
        # context); Keras' format puts the message between bold marks, left empty
        op_error, message = error.__context__, str(error)
        empty = "\x1b[1m\x1b[0m"
        tf_message = readable(op_error.message)
        message = (message.replace(empty, f"\x1b[1m{tf_message}\x1b[0m", 1)
                   if empty in message else f"{tf_message}\n\n{message}")
    else:
        return None
    cls = (InvalidInputError if isinstance(op_error, tf.errors.InvalidArgumentError)
           else type(op_error))
    if cls is tf.errors.OpError:
        carried = cls(op_error.node_def, op_error.op, message, op_error.error_code)
    else:
        carried = cls(op_error.node_def, op_error.op, message)
    carried._keras_call_info_injected = True  # outer Keras layer calls pass it on unchanged
    carried._tf_message_carried = True
    return carried.with_traceback(error.__traceback__)


class KeepsTFErrors:
    """Mixin (before the Keras layer class among the bases) of a layer that runs TensorFlow
    ops: a TensorFlow error of its call keeps its message on every backend (module docstring)."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            carried = carry_tf_error(error)
            if carried is None:
                raise
            raise carried from None
