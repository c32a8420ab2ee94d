"""TensorFlow errors out of the preprocessing layers, with their message, on every backend.

A layer here runs TensorFlow ops under every Keras backend. When one fails in an eager call
(a label out of range, a byte-pair piece outside the vocabulary: a `tf.debugging.Assert`, or
any TensorFlow op's error), Keras' `Layer.__call__` re-raises the error of `call` with the call's
arguments added (`keras.src.utils.traceback_utils.inject_argument_info_in_traceback`). It knows
TensorFlow's errors only under the TensorFlow backend: under JAX and PyTorch it reads the
message from `args`, which a `tf.errors.OpError` leaves empty, and rebuilds the error with one
argument, which an OpError does not take, so the user got a RuntimeError whose message was empty
("Exception encountered when calling ...", then nothing, then the arguments).

`KeepsTFErrors`, among the bases of every such layer (`_TFLayer`, the tokenizers, the pretraining
and fine-tuning preprocessors), wraps each `call` its subclasses define: a TensorFlow error
leaves `call` with its message in `args` (TensorFlow's message, without a traced op's Python
stack), so that Keras' context carries it on every backend. An `InvalidArgumentError` (what an
input check raises) leaves as an `InvalidInputError`, both a `tf.errors.InvalidArgumentError`
and a ValueError (Python's error for a wrong value), which Keras rebuilds as it is on every
backend; another TensorFlow error keeps its class under TensorFlow and is Keras' RuntimeError,
with the message, under JAX and PyTorch. `Layer.__call__` itself is Keras' (AutoGraph leaves it
as written). In a `tf.data` pipeline (`prepare`, a task's `fit` on raw text) the error comes
from the iterator, not from a layer call, and keeps TensorFlow's class and message.
"""
import functools
import re

import tensorflow as tf

# A traced function's error: "Graph execution error:", the failing op's Python stack when it
# was traced ("Detected at node ... defined at (most recent call last):", indented lines), then
# TensorFlow's message. The stack is the layer's own code (the traceback shows the user's call).
_GRAPH_STACK = re.compile(r"Graph execution error:\n\n|Detected at node [^\n]* defined at "
                          r"\(most recent call last\):\n(?:[ \t][^\n]*\n|\n)*")


class InvalidInputError(tf.errors.InvalidArgumentError, ValueError):
    """A preprocessing layer's call refused its input (a TensorFlow InvalidArgumentError, e.g. a
    failed input check); also a ValueError. Built as TensorFlow's errors are, or from a message
    alone (as Keras rebuilds an error with its context under JAX and PyTorch)."""

    def __init__(self, *args):
        node_def, op, message = (None, None, args[0]) if len(args) == 1 else args[:3]
        super().__init__(node_def, op, message)
        self.args = (message,)


def readable(message):
    """TensorFlow's message without a traced op's stack, with an assertion's quotes unescaped
    (`tf.debugging.Assert` prints its string data C-escaped: \\"T\\" for "T")."""
    message = _GRAPH_STACK.sub("", message)
    if "assertion failed: [" in message:
        message = message.replace('\\"', '"').replace("\\'", "'")
    return message


def carry_tf_error(error):
    """The error to raise instead of `error` out of a layer's `call`, so that Keras' layer call
    keeps a TensorFlow error's message on every backend; None: raise `error` itself."""
    if not isinstance(error, tf.errors.OpError) or isinstance(error, InvalidInputError):
        return None
    message = readable(error.message)
    if isinstance(error, tf.errors.InvalidArgumentError):
        carried = InvalidInputError(error.node_def, error.op, message)
    else:
        carried = type(error)(error.node_def, error.op, message, *(
            (error.error_code,) if type(error) is tf.errors.OpError else ()))
        carried.args = (message,)  # what Keras reads under JAX and PyTorch
    return carried.with_traceback(error.__traceback__)


def _carrying(call):
    @functools.wraps(call)  # Keras and keras-hub read `call`'s signature
    def carrying_call(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except tf.errors.OpError as error:
            carried = carry_tf_error(error)
            if carried is None:
                raise
            raise carried from None

    return carrying_call


class KeepsTFErrors:
    """Mixin of a Keras layer that runs TensorFlow ops: each `call` of its subclasses lets a
    TensorFlow error out with its message, on every backend (module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("call")
        if call is not None and not hasattr(call, "__wrapped__"):
            cls.call = _carrying(call)
