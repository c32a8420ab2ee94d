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
import ast
import functools
import re

import tensorflow as tf

# A traced function's error: "Graph execution error:", the failing op's Python stack when it
# was traced ("Detected at node ... defined at (most recent call last):", indented lines), then
# TensorFlow's message. The stack is the layer's own code (the traceback shows the user's call).
_GRAPH_STACK = re.compile(r"Graph execution error:\n\n|Detected at node [^\n]* defined at "
                          r"\(most recent call last\):\n(?:[ \t][^\n]*\n|\n)*")


# An eager `tf.debugging.Assert`: "Expected '<condition>' to be true. Summarized data: " then
# its data items, one a line; string items as bytes literals (b'...', or b"..." around a ')
_EAGER_ASSERT = re.compile(r"Expected '.*?' to be true\. Summarized data: (.*)\Z", re.S)
# A traced `tf.debugging.Assert`: "assertion failed: [item] [item]", then its node or the end
_GRAPH_ASSERT = re.compile(r"assertion failed: (\[.*?\])(?=\n\t \[\[|\s*\Z)", re.S)
_IN_PIPELINE = "Error in user-defined function passed to"
_BYTES_LITERAL = re.compile(r"b'(?:[^'\\]|\\.)*'" + r'|b"(?:[^"\\]|\\.)*"')


def _decoded(literal):
    return ast.literal_eval(literal.group(0)).decode("utf-8", "replace")


class InvalidInputError(tf.errors.InvalidArgumentError, ValueError):
    """A preprocessing layer's call refused its input (a TensorFlow InvalidArgumentError, e.g. a
    failed input check); also a ValueError. Built as TensorFlow's errors are, or from a message
    alone (as Keras rebuilds an error with its context under JAX and PyTorch)."""

    def __init__(self, *args):
        node_def, op, message = (None, None, args[0]) if len(args) == 1 else args[:3]
        super().__init__(node_def, op, message)
        self.args = (message,)


def readable(message):
    """TensorFlow's message as plain text: without a traced op's stack; a failed assertion as
    its data alone, one line (an eager `tf.debugging.Assert` says "Expected '<the condition
    tensor>' to be true. Summarized data: " then one item a line, strings as Python bytes
    literals; a traced one "assertion failed: [item] [item]" then the node; both print string
    data C-escaped: \\"T\\" for "T"), followed by "(in the tf.data input pipeline)" where it
    was raised there (TensorFlow's "Error in user-defined function passed to ...")."""
    message = _GRAPH_STACK.sub("", message)
    eager, graph = _EAGER_ASSERT.search(message), _GRAPH_ASSERT.search(message)
    if eager:
        items = [_BYTES_LITERAL.sub(_decoded, line) for line in eager.group(1).splitlines()]
    elif graph:
        items = graph.group(1)[1:-1].split("] [")
    else:
        return message
    text = " ".join(item.strip() for item in items if item.strip())
    text = text.replace('\\"', '"').replace("\\'", "'")
    return text + (" (in the tf.data input pipeline)" if _IN_PIPELINE in message else "")


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


def carries_tf_errors(call):
    """`call` (a layer's `call`; a task's `fit`, `evaluate`, `predict`, ...) lets a TensorFlow
    error out as `carry_tf_error` makes it: its message readable (`readable`), kept by Keras'
    layer call on every backend. A task's data pipeline raises its errors (a failed check, a
    byte-pair piece outside the vocabulary) from Keras' loop, C-escaped with TensorFlow's node
    names around them, on every backend."""
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


def _first_or_zero(values):
    """The first of `values` (a vector, maybe empty), or 0 where it is empty: an index or value
    a failed check names, read without a condition on the check."""
    return tf.concat([values, tf.zeros([1], values.dtype)], 0)[0]


def _assert_then(values, ok, message, bad, *more):
    """`values` once `ok`; else the pipeline stops with `message` formatted with the first of
    `bad` (a vector, maybe empty) and `more` values: one string, which reads as a sentence
    (an assertion's several data items print on lines of their own, strings as b'...')."""
    check = tf.debugging.Assert(ok, [tf.strings.format(message, (_first_or_zero(bad), *more))])
    with tf.control_dependencies([check]):
        return tf.identity(values) if not isinstance(values, tf.RaggedTensor) else \
            values.with_flat_values(tf.identity(values.flat_values))


class KeepsTFErrors:
    """Mixin of a Keras layer that runs TensorFlow ops: each `call` of its subclasses lets a
    TensorFlow error out with its message, on every backend (module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("call")
        if call is not None and not hasattr(call, "__wrapped__"):
            cls.call = carries_tf_errors(call)


# === Raw text in another shape ===
def check_column_lengths(x, who):
    """Raw columns (a tuple: a text pair's two batches, a QuestionAnswerer's questions and
    contexts, ...) hold as many examples each, where that is known without reading them (a
    list's, an array's or a pandas Series' length, a tensor's static batch size); else an error
    naming both counts. A string tensor or a Series of another length reached the packer
    ("Shapes of all inputs must match"); a task's `fit` said "Dimensions 2 and 1 are not
    compatible". (What is known only in a graph: the packers' own check, `packing`.)"""
    if not isinstance(x, tuple) or len(x) < 2:
        return
    counts = [(i, n) for i, n in enumerate(map(_batch_size, x)) if n is not None]
    for i, n in counts[1:]:
        if n != counts[0][1]:
            raise ValueError(f"{who} got columns of different lengths: column {counts[0][0]} "
                             f"has {counts[0][1]} examples, column {i} has {n}.")


def _batch_size(column):
    """How many examples one raw column holds, where that is known without reading it; else
    None (a string, a dict, a 0-d value, a tensor of unknown batch size: named elsewhere)."""
    if isinstance(column, (str, bytes, dict)):
        return None
    shape = getattr(column, "shape", None)
    if isinstance(shape, tf.TensorShape):
        return shape[0] if shape.rank else None
    if shape is not None and len(shape) == 0:
        return None
    try:
        return len(column)
    except TypeError:
        return None


def check_text_batch(x, who, expected, rank=1):
    """One batch of raw text, as a task's `fit` / `predict` or a preprocessor's call receives
    it (a Python list, an array, a pandas Series, a tensor): refused, naming its type and shape
    and what `who` takes (`expected`), where it is a dict or a table of columns (a pandas
    DataFrame), lists nested deeper than `rank` (1: a batch of texts; 2: a batch of word
    lists), or an array or tensor of a higher rank. These failed deep inside (SegmentPacker's
    "must be a rank-2 RaggedTensor", TensorFlow's "Could not build a TypeSpec", a mixed-type
    conversion error). Anything else passes (its items are checked where they are read)."""
    if isinstance(x, dict) or hasattr(x, "columns"):  # a pandas DataFrame
        columns = [str(c) for c in getattr(x, "columns", x)]
        model_inputs = "token_ids" in columns
        raise ValueError(
            f"{who} takes {expected}; got {_a(type(x).__name__)} of columns {columns[:5]}: "
            + ("model inputs. A task with a preprocessor takes raw text; build it with "
               "preprocessor=None to feed token ids." if model_inputs else
               f"pass one column, e.g. x[{columns[0] if columns else 'text'!r}]."))
    if isinstance(x, list):
        i = _too_deep(x, rank)
        if i is not None:
            raise ValueError(f"{who} takes {expected}; got a list whose item {i} is "
                             f"{_a(type(x[i]).__name__)} {x[i]!r:.60}"
                             + (" (lists nested deeper than words)." if rank > 1 else "."))
        return
    shape = getattr(x, "shape", None)
    try:
        dims = None if shape is None else len(shape)
    except (TypeError, ValueError):  # a tensor of unknown rank
        dims = None
    if dims is not None and dims > rank:
        shape = tuple(shape) if not hasattr(shape, "as_list") else tuple(shape.as_list())
        kind = ("tf.Tensor" if isinstance(x, (tf.Tensor, tf.TensorSpec)) else  # symbolic too
                "NumPy array" if type(x).__name__ == "ndarray" else type(x).__name__)
        raise ValueError(f"{who} takes {expected}; got {_a(kind)} of rank {dims} "
                         f"(shape {shape}).")


def _a(noun):
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _too_deep(items, rank):
    """The index of the first of `items` (a Python list) that nests deeper than `rank` allows
    (rank 1: any list, tuple or array; rank 2: one holding such), or None."""
    for i, item in enumerate(items[:1000]):
        if isinstance(item, (list, tuple)) or (
                getattr(item, "ndim", 0) > 0 and not isinstance(item, (str, bytes))):
            if rank <= 1 or _too_deep(list(item), rank - 1) is not None:
                return i
    return None
