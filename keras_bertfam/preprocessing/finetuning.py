"""Raw strings -> `(x, y, sample_weight)` for the fine-tuning tasks, as `tf.data` stages.

Like the pretraining preprocessors, each is a Keras layer over TensorFlow tensors that a task maps
over its dataset (`task.fit(strings, labels)` calls `preprocessor.prepare(dataset)`); everything
is vectorized over the batch. A task's `predict` / `evaluate` on in-memory inputs (lists, arrays)
call `preprocessor.call_in_memory(examples)` instead: the same traced call, no pipeline. Labels
are checked in the graph: a label outside `num_classes`, or a QA answer that is not at its offset
in the context, stops the pipeline with a message naming it.
(Labels given as arrays or lists are checked before that, in Python, by the task's `fit` /
`evaluate`: `kb.tasks.classifier.check_label_values`.)
"""
import functools

import keras
import numpy as np
import tensorflow as tf

from keras_bertfam import preset_hooks
from keras_bertfam.preprocessing.errors import (KeepsTFErrors, _assert_then, _first_or_zero,
                                                check_column_lengths, check_text_batch)
from keras_bertfam.preprocessing.global_attention import TF_OPS, global_attention_for_task
from keras_bertfam.preprocessing.offsets import tokenize_with_offsets
from keras_bertfam.preprocessing.packing import (XLNET_PAD_SEGMENT_ID, SegmentPacker, left_pad,
                                                 xlnet_pack)
from keras_bertfam.preprocessing.ragged import merge_rows, ranges, row_ids, rows_and_index
from keras_bertfam.preprocessing.tokenizers import (XLNetTokenizer, python_texts_to_tensor,
                                                    require_special_tokens)

AUTOTUNE = tf.data.AUTOTUNE

GROUP_BY_LENGTH_BATCHES = 50  # HF's megabatch of group_by_length: 50 batches sorted together


def as_segments(x, who=None, expected=None):
    """keras-hub's convention: a tuple is segments (a sentence pair is a tuple of two batches);
    anything else, a Python list of strings included, is one batch (or one string). A column
    of texts, an array or tensor of shape (batch, 1) (a `keras.Input(shape=(1,),
    dtype="string")`, as Keras' `TextVectorization` takes it), is the batch of its texts
    (`_text_column`). `who`: each segment is checked to be one batch of texts
    (`check_text_batch`: not a table, lists of lists, another 2-D array), which `expected`
    describes."""
    segments = tuple(_text_column(s) for s in (x if isinstance(x, tuple) else (x,)))
    if who is not None:
        for segment in segments:
            check_text_batch(segment, who, expected)
    return segments


def _text_column(batch):
    """A (batch, 1) array or dense tensor (symbolic too; a tensor spec) -> its [batch] texts;
    anything else (lists, tables, ragged or other shapes: `check_text_batch` names them) as it
    is. A tensor of shape (batch, None) is taken for a column too, its width checked when it
    runs: a dataset's `.batch()` of make_csv_dataset's [1] columns (the keras.io SBERT
    example's) has no static width. So is a tensor of unknown rank, [batch] or (batch, 1) when
    it runs: a traced call that met both (`_traced_call`, `reduce_retracing`) relaxes the rank."""
    if isinstance(batch, (str, bytes, list, dict, tf.RaggedTensor, tf.RaggedTensorSpec)) or \
            hasattr(batch, "columns"):
        return batch
    try:
        dims = tuple(batch.shape)
    except (AttributeError, TypeError, ValueError):  # no shape, or of unknown rank
        dims = None if isinstance(batch, tf.Tensor) else ()
    if dims is not None and (len(dims) != 2 or dims[1] not in (1, None)):
        return batch
    if isinstance(batch, tf.TensorSpec):
        return tf.TensorSpec(dims[:1], batch.dtype)
    if (dims is None or dims[1] is None) and isinstance(batch, tf.Tensor):
        rank = tf.rank(batch)
        batch = _assert_then(batch, (rank >= 1) & (rank <= 2),
                             "A tensor of texts is a batch [B] or a (batch, 1) column of "
                             "texts; got one of rank {}.", tf.reshape(rank, [1]))
        width = tf.reduce_prod(tf.shape(batch)[1:], keepdims=True)
        batch = _assert_then(batch, width[0] == 1,
                             "A rank-2 tensor of texts is read as a (batch, 1) column of "
                             "texts; got {} texts in a row: pass a [batch] tensor of texts, "
                             "or a (batch, 1) one.", width)
        return tf.reshape(batch, [-1])
    return batch[:, 0]


def check_fits_positions(sequence_length, limit, backbone_name):
    """The one check that a preprocessor's `sequence_length` fits the position table of the
    backbone it feeds (`max_sequence_length`; None: no table, as XLNet's relative positions):
    a longer one fails later in a Slice of the position embedding. Run when a task is built
    (`check_backbone_and_preprocessor`), before its raw-text fit / predict, and when an
    attached preprocessor's `sequence_length` is set."""
    if isinstance(sequence_length, (int, np.integer)) and isinstance(
            limit, (int, np.integer)) and sequence_length > limit:
        raise ValueError(
            f"sequence_length={sequence_length} is longer than {backbone_name}'s "
            f"max_sequence_length={limit} (its position table): expected sequence_length <= "
            f"{limit}.")


def preset_preprocessor(cls, preset, **kwargs):
    """`cls(tokenizer=<the preset's tokenizer>, **kwargs)` (`kwargs` over the arguments of a
    `cls` preprocessor a task saved in the preset: its `sequence_length`, ...), whose
    `sequence_length` must fit the position table of the preset's backbone (the check a task
    makes of the preprocessor it is given, made here, where the preset's backbone config is
    known). The preset is resolved
    once (`get_loader`: a directory's manifest read, a hub id's snapshot found), and both are
    read from that one loader."""
    loader = preset_hooks.call("get_loader", preset)
    kwargs = preset_hooks.call("preprocessor_args", loader, cls, kwargs)  # a saved task's
    preprocessor = cls(preset_hooks.call("load_tokenizer", loader), **kwargs)
    if isinstance(preprocessor, ReturnsModelInputs):
        # the preset's backbone says whether x holds `segment_ids` (DistilBERT's WordPiece
        # vocabulary is BERT's); kept by `get_config`
        object.__setattr__(preprocessor, "_preset_segment_ids",
                           preset_hooks.call("takes_segment_ids", loader))
        # and whether they hold a `global_attention_mask` (a Longformer's)
        object.__setattr__(preprocessor, "_preset_global_attention",
                           preset_hooks.call("takes_global_attention", loader))
    table = preset_hooks.call("position_table", loader)
    check_fits_positions(getattr(preprocessor, "sequence_length", None), *table)
    if table[0] is not None:
        # a `sequence_length` set later is checked then (a fine-tuning preprocessor's setter);
        # a task the preprocessor is given sets its own backbone's table
        object.__setattr__(preprocessor, "_position_table", table)
    return preprocessor


def _pack(x, y=None, sample_weight=None):
    if y is None:
        return x
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def _tensors(examples):
    """Tuples and dicts stay structure; anything else (a list, an array) becomes one tensor, as
    `tf.data.Dataset.from_tensor_slices` reads its argument."""
    if isinstance(examples, tuple):
        return tuple(_tensors(e) for e in examples)
    if isinstance(examples, dict):
        return {k: _tensors(v) for k, v in examples.items()}
    if isinstance(examples, (tf.Tensor, tf.RaggedTensor)):
        return examples
    return tf.convert_to_tensor(examples)


def any_batch_size(t):
    """The spec of a batch (a tensor, a ragged tensor or an array) with its batch size unknown:
    one trace of a function for every batch size."""
    spec = tf.type_spec_from_value(t)
    shape = tf.TensorShape([None]).concatenate(spec.shape[1:])
    if isinstance(spec, tf.RaggedTensorSpec):
        return tf.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank, spec.row_splits_dtype)
    return tf.TensorSpec(shape, spec.dtype)


def _concatenate(parts, pad_values, side="right"):
    """Chunks of the same structure -> one, along the batch axis; arrays whose later axes differ
    (`pad_to_batch_max`) are padded on the `side` of axis 1 (`pad_values[name]`, else 0)."""
    import numpy as np

    def join(arrays, name):
        longest = max(a.shape[1] if a.ndim > 1 else 0 for a in arrays)

        def widths(a):
            extra = (longest - a.shape[1], 0) if side == "left" else (0, longest - a.shape[1])
            return [(0, 0), extra] + [(0, 0)] * (a.ndim - 2)

        arrays = [np.pad(a, widths(a), constant_values=pad_values.get(name, 0)) if a.ndim > 1
                  else a for a in arrays]
        return np.concatenate(arrays, axis=0)

    def walk(items, name=None):
        if isinstance(items[0], dict):
            return {k: walk([i[k] for i in items], k) for k in items[0]}
        if isinstance(items[0], tuple):
            return tuple(walk([i[n] for i in items]) for n in range(len(items[0])))
        return items[0] if len(items) == 1 else join(items, name)

    return walk(parts)


def _arity(ds):
    """How many parts a dataset element has (the arguments its map function receives)."""
    return len(ds.element_spec) if isinstance(ds.element_spec, tuple) else 1


def _is_string(spec):
    return isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)) and spec.dtype == tf.string


# The messages of the label checks, the same in Python (`kb.tasks.classifier.check_label_values`,
# arrays and lists) and in the tf.data graph (`check_labels`, datasets); {} is the value.
NOT_AN_INTEGER = ("Invalid {what} {{}}: expected {expected} (a float is accepted only when "
                  "it is a whole number, e.g. 1.0); a fraction would be truncated.")
ANSWER_START = "an integer character offset into the context (-1: no answer)"
ONE_LABEL_PER_WORD = ("Each word needs one label: example {} has {} word(s) but {} label(s). "
                      "Sentences are split on whitespace; pass lists of words to split them "
                      "yourself.")
NOT_FINITE = ("Invalid regression target {}: expected a finite number (not NaN or inf), which "
              "would turn every weight into NaN.")
TEXT_TARGET = "expected a number (num_classes=1: regression), not text"


MULTI_LABEL = ("Multi-label classification (several labels per example, a sigmoid each) is "
               "not supported: TextClassifier is single-label (a softmax over num_classes).")
MULTI_TARGET = ("Multi-target regression is not supported: num_classes=1 predicts one score per "
                "example.")


ONE_CHOICE_LABEL = ("The label is the index of the right choice: for one-hot rows pass "
                    "np.argmax(y, axis=-1) (a dataset: ds.map(lambda x, y: (x, "
                    "tf.argmax(y, axis=-1))).")


def check_label_shape(shape, who, what, note):
    """Labels of one value per example, of shape (N,) or (N, 1) (`shape` a tuple, dims maybe
    None), else a ValueError naming the shape, and `note` (a label matrix failed inside the
    step: "Incompatible shapes: [4] vs. [12]")."""
    if getattr(shape, "rank", 0) is None:  # unknown rank (a dataset's): its values' checks
        return
    shape = tuple(shape)
    if len(shape) <= 1 or (len(shape) == 2 and shape[1] == 1):
        return
    raise ValueError(f"{who} takes one {what} per example (labels of shape (N,) or (N, 1)); got "
                     f"labels of shape {shape}. {note}")


def _flat(values):
    return tf.reshape(values.flat_values if isinstance(values, tf.RaggedTensor) else values, [-1])


def as_labels(labels):
    """Labels as a tensor: a preprocessor called directly takes them as Python lists or
    arrays too (lists of different lengths: a RaggedTensor, a token classifier's)."""
    if isinstance(labels, (tf.Tensor, tf.RaggedTensor)):
        return labels
    try:
        return tf.convert_to_tensor(labels)
    except ValueError:  # non-rectangular
        return tf.ragged.constant(labels)


def text_labels_error(who, num_classes, what="label", count="num_classes", where=""):
    """The ValueError for labels of dtype string (TensorFlow's was "Cast string to int32 is not
    supported"): class ids (or the regression targets of `num_classes=1`) are numbers. `where`:
    how they were found (`check_no_text_labels`)."""
    if isinstance(num_classes, int) and num_classes == 1:
        what, expected, convert, names = "regression target", TEXT_TARGET, \
            "tf.strings.to_number(y)", ""
    elif isinstance(num_classes, int) or count == "num_classes":  # class ids
        expected = (f"expected integer class ids from 0 to {num_classes - 1} ({count}="
                    f"{num_classes}), not text" if num_classes is not None else
                    f"expected integer class ids ({count}=None: not checked against a count), "
                    f"not text")
        convert = "tf.strings.to_number(y, tf.int32)"
        names = (", or for class names a lookup, keras.layers.StringLookup(vocabulary=names, "
                 "num_oov_indices=0)")
    else:  # the number of choices (a tensor in the graph)
        expected = f"expected integer indices from 0 to the {count} minus 1, not text"
        convert, names = "tf.strings.to_number(y, tf.int32)", ""
    return ValueError(f"{who} got {what}s of dtype string{where}: {expected}; e.g. "
                      f"ds.map(lambda x, y: (x, {convert})){names}.")


def check_not_text(labels, who, num_classes, what="label", count="num_classes"):
    """Labels as a tensor (`as_labels`), refused by `text_labels_error` when they are strings."""
    labels = as_labels(labels)
    if labels.dtype == tf.string:
        raise text_labels_error(who, num_classes, what, count)
    return labels


def check_no_text_labels(ds, who, num_classes, x_parts=1, pairs=False):
    """A dataset (fit, evaluate) whose elements are more parts than x (`x_parts`), all strings:
    x and string labels, which `_has_labels` (and `_split`) read as raw examples without labels
    (fit and evaluate then said "raw examples alone" or "None values not supported"). Refused
    naming the labels' dtype, as string labels in memory are. `num_classes` None: the labels
    are choice indices. `pairs`: x may be a text pair, which goes as ((first, second), labels)."""
    spec = ds.element_spec if isinstance(ds, tf.data.Dataset) else None
    if isinstance(spec, tuple) and len(spec) > x_parts and all(map(_is_string, spec)):
        what = "targets" if num_classes == 1 else "labels"
        raise text_labels_error(who, num_classes, **(
            {"what": "choice label", "count": "number of choices"} if num_classes is None
            else {}), where=(
            f" as the last of a dataset's {len(spec)} string tensors (fit and evaluate take "
            f"{what}" + (f": a text pair alone has none, its {what} go as ((first, second), "
                         f"{what}))" if pairs else ")")))


def check_integer_labels(labels, what="label", expected="an integer class id"):
    """Float labels must be whole numbers (0.5 or NaN is refused, 1.0 passes), in the graph."""
    if not labels.dtype.is_floating:
        return labels
    flat = _flat(labels)
    bad = tf.logical_not(tf.equal(flat, tf.round(flat)))
    first = tf.boolean_mask(flat, bad)[:1]
    return _assert_then(labels, tf.logical_not(tf.reduce_any(bad)),
                        NOT_AN_INTEGER.format(what=what, expected=expected), first)


def check_finite_targets(targets):
    """Regression targets must be finite, in the graph."""
    targets = tf.cast(targets, tf.float32)
    flat = _flat(targets)
    bad = tf.logical_not(tf.math.is_finite(flat))
    return _assert_then(targets, tf.logical_not(tf.reduce_any(bad)), NOT_FINITE,
                        tf.boolean_mask(flat, bad)[:1])


def check_labels(labels, num_classes, what="label", allow_negative=False, count="num_classes",
                 who="TextClassifier"):
    """In the tf.data graph (so on every backend): stops the pipeline at the first label outside
    `0..num_classes-1`, naming its value and the range (`allow_negative`: labels < 0 pass, where
    they mean 'ignore'), or at a float label that is not a whole number. `num_classes` may be a
    tensor (the number of choices). The message is `check_label_values`' (labels in memory).
    String labels are refused at once, naming `who` (the task)."""
    labels = check_not_text(labels, who, num_classes, what, count)
    labels = check_integer_labels(labels, what)
    labels = tf.cast(labels, tf.int32)
    flat = tf.reshape(labels.flat_values if isinstance(labels, tf.RaggedTensor) else labels, [-1])
    bad = flat >= num_classes
    if not allow_negative:
        bad = tf.logical_or(bad, flat < 0)
    return _assert_then(labels, tf.logical_not(tf.reduce_any(bad)),
                        f"Invalid {what} {{}}: the valid range is 0 to {{}} ({count}={{}}).",
                        tf.boolean_mask(flat, bad)[:1], num_classes - 1, num_classes)


def check_segment_ids(value, name="segment_ids"):
    """A preprocessor's `segment_ids` (or `global_attention_mask`) argument: "auto", True or
    False."""
    if value != "auto" and not isinstance(value, bool):
        raise ValueError(f"{name} must be 'auto', True or False, got {value!r}.")
    return value


@functools.cache
def _layer_state():
    """The attributes every Keras layer has (`_called`, `_parent_path`, `built`, ...): Keras'
    bookkeeping, which a first call changes, not a setting."""
    return frozenset(vars(keras.layers.Layer()))


def trace_key(preprocessor, *more, unread=()):
    """What a preprocessor's traced functions read besides their inputs: its tokenizer (special
    ids, vocabulary, resources) and its own scalar settings but those named in `unread` (read
    only outside them), and `more`. A function traced for one key is not called under another
    (traced anew: nothing stale runs)."""
    tok = preprocessor.tokenizer
    settings = tuple(sorted((k, v) for k, v in vars(preprocessor).items()
                            if isinstance(v, (bool, int, float, str, type(None)))
                            and k not in _layer_state() and k not in unread))
    return (id(tok), tok.cls_token_id, tok.sep_token_id, tok.pad_token_id,
            tok.vocabulary_size(), getattr(tok, "resource_generation", lambda: 0)(), settings,
            *more)


# A `Dataset.map` (`filter`, `flat_map`) function of plain TF ops, or of none: not converted by
# AutoGraph, which tf.data runs on each new map's function (a lambda's source parsed again).
no_autograph = tf.autograph.experimental.do_not_convert


def traced_once(owner, key, name, fn):
    """`fn` as a `tf.function` made once per `owner` (a preprocessor, a task) and `key` (what
    `fn` reads besides its inputs: `trace_key`, a task's check settings), kept as `name` among
    the owner's traced functions. A `Dataset.map` traces its function again for every new
    pipeline (each fit's, evaluate's, predict's); a map of this traces a call of it, and its
    graph is traced once per element spec. A new key drops the owner's functions (traced anew:
    nothing stale runs). No AutoGraph: our traced functions are plain TF ops (loops are
    `tf.while_loop`s; converting them re-parsed ours and tf-text's source)."""
    cached = owner.__dict__.get("_traced_functions")
    if cached is None or cached[0] != key:
        cached = (key, {})
        object.__setattr__(owner, "_traced_functions", cached)
    if name not in cached[1]:
        cached[1][name] = tf.function(fn, reduce_retracing=True, autograph=False)
    return cached[1][name]


class ReturnsModelInputs:
    """The `segment_ids` argument of a preprocessor whose x feeds a backbone: whether x holds
    `segment_ids`. A backbone that takes none (RoBERTa, DistilBERT) gets exactly its inputs, as
    keras-hub's family preprocessors return: Keras' functional model given a dict with another
    key matches it by position, so a user's model over `backbone.input` read `segment_ids` as
    `token_ids`. "auto" (default): whether the model fed takes them (`returns_segment_ids`).
    Set `self.segment_ids` (`check_segment_ids`) in the constructor.

    The `global_attention_mask` argument: whether x holds a Longformer's
    `global_attention_mask`, the global attention the task of `global_attention_task` puts on
    the rows (`LongformerBackbone.task_global_attention`: a classifier's on `<s>`), so that a
    model of one's own over a Longformer's `backbone.input` gets every input it takes and
    computes what the family's task computes. "auto" (default): where the preset's backbone
    takes one and no task is attached (a task derives it in its own graph); True / False:
    always / never. Set `self.global_attention_mask` in the constructor."""

    # The task whose global attention x carries (`global_attention_for_task`; None: none).
    global_attention_task = None

    @property
    def returns_segment_ids(self):
        """`segment_ids` if a bool; "auto": XLNet's layout has them; else the task this is
        attached to (`check_backbone_and_preprocessor`: whether its backbones take them), else
        the preset it was loaded from (`from_preset`: its backbone's config), else True: a
        tokenizer alone does not tell the family (a byte-level BPE vocabulary is RoBERTa's or
        Longformer's, whose QA / multiple-choice global attention reads them; a WordPiece one
        BERT's, ELECTRA's or DistilBERT's)."""
        if getattr(self, "packing_layout", None) == "xlnet":
            return True
        if self.segment_ids != "auto":
            return self.segment_ids
        for found in (self.__dict__.get("_task_segment_ids"),
                      self.__dict__.get("_preset_segment_ids")):
            if found is not None:
                return found
        return True

    @property
    def returns_global_attention(self):
        """`global_attention_mask` if a bool; "auto": False once attached to a task (its graph
        derives the mask: `_task_global_attention`), else whether the preset's backbone takes
        one (`from_preset`: a Longformer's), else False (a byte-level BPE vocabulary alone is
        RoBERTa's or Longformer's)."""
        value = getattr(self, "global_attention_mask", "auto")
        if value != "auto":
            return value
        for found in (self.__dict__.get("_task_global_attention"),
                      self.__dict__.get("_preset_global_attention")):
            if found is not None:
                return found
        return False

    def model_inputs(self, features):
        """Packed features (a dict) without `segment_ids` where `returns_segment_ids` is False,
        with the task's `global_attention_mask` where `returns_global_attention` (computed from
        the rows' `segment_ids` before they are dropped: QA's and multiple choice's rule)."""
        if self.returns_global_attention:
            features = dict(features, global_attention_mask=tf.cast(global_attention_for_task(
                features, self.global_attention_task, xp=TF_OPS), tf.int32))
        if self.returns_segment_ids:
            return features
        return {k: v for k, v in features.items() if k != "segment_ids"}

    def segment_ids_config(self):
        """`{"segment_ids": ...}` for `get_config` where it is set or resolves to False (a
        preset's or a task's backbone without them: the reloaded layer returns the same keys);
        else {} (the configs saved before this argument). `global_attention_mask` alike, where
        it is set or resolves to True."""
        config = {}
        if self.segment_ids != "auto" or not self.returns_segment_ids:
            config["segment_ids"] = self.returns_segment_ids
        if getattr(self, "global_attention_mask", "auto") != "auto" or \
                self.returns_global_attention:
            config["global_attention_mask"] = self.returns_global_attention
        return config


class FinetuningPreprocessor(ReturnsModelInputs, KeepsTFErrors, keras.layers.Layer):
    """Shared base: a tokenizer and a `[CLS] A [SEP] (B [SEP])` packer of `sequence_length`.

    `layout`: `"bert"` packs `[CLS] A [SEP] (B [SEP])`, padded on the right; `"xlnet"` packs
    XLNet's `A <sep> (B <sep>) <cls>`, padded on the LEFT, segment ids 0 / 1 and 2 for `<cls>`
    (HF `XLNetTokenizer`'s; `xlnet_pack`), so that `<cls>` is the last position, where XLNet's
    classifier reads its summary (question answering: `context <sep> question <sep> <cls>`,
    HF's `run_qa.py` for XLNet). `"auto"` (default): the layout of the task it is attached to
    (XLNet's for an `XLNetBackbone`), or alone, XLNet's for an `XLNetTokenizer` and BERT's for
    every other tokenizer.
    """

    LAYOUTS = ("auto", "bert", "xlnet")
    # What `call` (and a task's fit / predict) takes as x, named by the errors of other shapes
    raw_inputs = "a batch of texts (a list or 1-D array of strings, a string tensor [B])"
    # Whether this preprocessor can pack XLNet's layout (every fine-tuning preprocessor here
    # can; a subclass that cannot sets False and is refused layout="xlnet").
    xlnet_layout_supported = True

    def __init__(self, tokenizer, sequence_length=128, layout="auto", segment_ids="auto",
                 global_attention_mask="auto", **kwargs):
        super().__init__(**kwargs)
        self.segment_ids = check_segment_ids(segment_ids)
        self.global_attention_mask = check_segment_ids(global_attention_mask,
                                                       "global_attention_mask")
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.tokenizer = tokenizer
        self.layout = layout  # first: a subclass's check of sequence_length may read the layout
        self.sequence_length = sequence_length
        self.built = True

    @property
    def layout(self):
        return self._layout

    @layout.setter
    def layout(self, value):
        allowed = self.LAYOUTS if self.xlnet_layout_supported else ("auto", "bert")
        if value not in allowed:
            raise ValueError(f"{type(self).__name__} packs the layouts {allowed}; got layout="
                             f"{value!r}.")
        before = self.__dict__.get("_layout")
        self._layout = value
        if "_sequence_length" in self.__dict__:  # set after construction: checked again
            try:
                self._check_sequence_length(self._sequence_length)
            except ValueError:
                self._layout = before
                raise

    @property
    def packing_layout(self):
        """The layout this preprocessor packs: `layout`, with "auto" resolved."""
        if self.layout != "auto":
            return self.layout
        if not self.xlnet_layout_supported:
            return "bert"
        attached = self.__dict__.get("_task_layout")
        if attached is not None:
            return attached
        return "xlnet" if isinstance(self.tokenizer, XLNetTokenizer) else "bert"

    @property
    def padding_side(self):
        """Where the packed rows' padding is: "left" for XLNet's layout, else "right"."""
        return "left" if self.packing_layout == "xlnet" else "right"

    @property
    def sequence_length(self):
        return self._sequence_length

    @sequence_length.setter
    def sequence_length(self, value):
        """Settable after construction, as keras-hub's: the next call packs to the new length."""
        if not isinstance(value, int) or isinstance(value, bool) or value < 4:
            raise ValueError(f"sequence_length must be an int >= 4, got {value!r}.")
        self._check_sequence_length(value)
        # attached to a task: its backbone's position table bounds the length at once (as a
        # pretraining preprocessor refuses any change), not at the next fit / predict
        check_fits_positions(value, *self.__dict__.get("_position_table", (None, None)))
        self._sequence_length = value

    def _check_sequence_length(self, value):
        """Subclasses' own bound on `sequence_length` (checked at construction and when set)."""

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """This preprocessor on a preset's tokenizer (keras-hub's `Preprocessor.from_preset`)."""
        return preset_preprocessor(cls, preset, **kwargs)

    @property
    def packer(self):
        """The `SegmentPacker` of `[CLS] A [SEP] (B [SEP])` (keras-hub's `preprocessor.packer`)."""
        return self._packer()

    def _packer(self):
        # Made anew when the tokenizer's special ids change (a tokenizer restored from a `.keras`
        # file gets its vocabulary, and so its special token ids, after this layer is
        # constructed, and Keras' loader reads the `packer` property before that) or when
        # `sequence_length` is set.
        # Between segments, one separator (BERT's [SEP]) or the tokenizer's `pair_separators`
        # (RoBERTa's `</s></s>`).
        tok = self.tokenizer
        sep = [tok.sep_token_id] * self.pair_separators
        ids = (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, sep)
        packer = getattr(self, "_segment_packer", None)
        if packer is None or (packer.start_value, packer.end_value, packer.pad_value,
                              packer.sep_value) != ids or \
                packer.sequence_length != self.sequence_length or \
                packer.truncate != self.truncate:
            packer = SegmentPacker(self.sequence_length, start_value=ids[0], end_value=ids[1],
                                   pad_value=ids[2], sep_value=ids[3], truncate=self.truncate)
            object.__setattr__(self, "_segment_packer", packer)
        return packer

    @property
    def pair_separators(self):
        """Separator tokens between two segments: 1 ([SEP]) or the tokenizer's (RoBERTa: 2)."""
        return getattr(self.tokenizer, "pair_separators", 1)

    def _check_text(self, *batches, rank=1):
        """Each of `batches` is one batch of texts (`rank` 2: of word lists), else an error
        naming it and `raw_inputs` (`check_text_batch`)."""
        for batch in batches:
            check_text_batch(batch, type(self).__name__, self.raw_inputs, rank)

    # Whether x is two batches (`check_pair`): questions and contexts, contexts and choices
    takes_a_pair = False

    def check_raw(self, x, who=None):
        """The one check of raw x's shape (`who`: the task to name, else this preprocessor),
        made where x enters: a direct call (`__call__`), a dataset's element spec (`prepare`),
        a task's in-memory x (`Task._prepare`, before the examples become tensors). Not again
        in `call`, which each of them reaches. Here: a pair preprocessor's x is two batches
        (`check_pair`); a dict or table of columns is named (`check_text_batch`)."""
        if self.takes_a_pair:
            self.check_pair(x, who)
        elif isinstance(x, dict) or hasattr(x, "columns"):
            check_text_batch(x, who or type(self).__name__, self.raw_inputs)

    def __call__(self, *args, **kwargs):
        if args or "x" in kwargs:
            self.check_raw(args[0] if args else kwargs["x"])
        return super().__call__(*args, **kwargs)

    def _check_element_spec(self, ds):
        """A dataset's elements: x as `check_raw` takes it (its spec), batches, not single
        examples. Returns the element spec as a tuple."""
        spec = ds.element_spec if isinstance(ds.element_spec, tuple) else (ds.element_spec,)
        pair = self.takes_a_pair and not isinstance(spec[0], dict)  # (a dict: named as it is)
        self.check_raw(self._split(spec)[0] if pair else spec[0])
        first = tf.nest.flatten(spec[0])[0]
        if isinstance(first, (tf.TensorSpec, tf.RaggedTensorSpec)) and first.shape.rank == 0:
            raise ValueError(
                f"{type(self).__name__} takes a dataset of batches: its elements are single "
                f"examples ({ds.element_spec}). Batch it first, e.g. ds.batch(32).")
        return spec

    def check_pair(self, x, who=None):
        """x is two batches (a tuple, or a list of two that are not strings), else an error
        naming what it is and `raw_inputs`."""
        if isinstance(x, (tuple, list)) and len(x) == 2 and not any(
                isinstance(part, (str, bytes)) for part in x):
            check_column_lengths(tuple(x), who or type(self).__name__)
            return
        count = f" of {len(x)} items" if isinstance(x, (tuple, list)) else ""
        raise ValueError(f"{who or type(self).__name__} takes {self.raw_inputs}; got a "
                         f"{type(x).__name__}{count}: {x!r:.80}.")

    # How two segments share `sequence_length` (keras-hub's `truncate`): "round_robin" (BERT's
    # longest-first `_truncate_seq_pair`: the same lengths) or "waterfall" (the first segment
    # whole, the second what is left); TextClassifierPreprocessor takes it as an argument.
    truncate = "round_robin"

    def _features(self, segments):
        require_special_tokens(self.tokenizer, ["cls", "sep", "pad"], type(self).__name__)
        if self.packing_layout == "xlnet":
            if self.truncate != "round_robin":
                raise ValueError(
                    f"{type(self).__name__}(truncate={self.truncate!r}): XLNet's layout is "
                    f"truncated longest first (HF's XLNetTokenizer); use truncate='round_robin'.")
            tok = self.tokenizer
            features = xlnet_pack(*segments, sequence_length=self.sequence_length,
                                  sep_token_id=tok.sep_token_id, cls_token_id=tok.cls_token_id,
                                  pad_token_id=tok.pad_token_id)
            return {k: tf.cast(v, tf.int32) for k, v in features.items()}
        token_ids, segment_ids, padding_mask = self._packer()(tuple(segments))
        return self.model_inputs({"token_ids": tf.cast(token_ids, tf.int32),
                                  "segment_ids": tf.cast(segment_ids, tf.int32),
                                  "padding_mask": tf.cast(padding_mask, tf.int32)})

    @property
    def prepares_batch_by_batch(self):
        """Whether `prepare` maps each batch on its own (no regrouping, nothing random): a
        resumed `fit` then skips input batches rather than prepared ones."""
        return type(self).prepare is FinetuningPreprocessor.prepare

    def prepare(self, ds, training=True, batch_size=None):
        """A dataset of batched raw examples -> a dataset of model inputs (and labels).

        `batch_size`: the batch size a task's `fit` / `evaluate` / `predict` was given (None:
        none given), which every preprocessor's `prepare` takes and a task always passes. Only
        a preprocessor that re-batches what it makes uses it (`QuestionAnswererPreprocessor`'s
        windows); the others keep the incoming batches (a pretraining preprocessor's are its
        own `batch_size`) and ignore it. A subclass overriding `prepare` takes it too: a task
        refuses a preprocessor whose `prepare` does not, when built with it or given it."""
        return ds.map(self._map_function(ds), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)

    def _map_function(self, ds):
        """`_traced_call` for `ds.map`, traced for the dataset's element spec here rather than
        by `tf.data`: the same trace as `call_in_memory`'s on examples of that spec (a `fit` on
        in-memory examples and then an `evaluate` or `predict` on them trace the tokenizing graph
        once, not once each: `tf.data`'s own trace is not reused outside its pipeline)."""
        spec = self._check_element_spec(ds)
        traced = self._traced_call(len(spec)).get_concrete_function(*spec)
        return no_autograph(lambda *element: traced(*element))

    def call_in_memory(self, examples, chunk_size=4096):
        """In-memory raw examples, as `tf.data.Dataset.from_tensor_slices` takes them (x, or a
        tuple `(x, y)` / `(x, y, sample_weight)`), -> the model inputs (and labels) as NumPy
        arrays, without a `tf.data` pipeline: one traced call per `chunk_size` examples.

        A task's `predict` / `evaluate` on in-memory inputs comes here. Building a pipeline costs
        seconds at every call (its map function is traced, its iterator instantiated: ~3 s for
        two strings on 2 cores), this a few milliseconds once traced. The trace is kept until a
        setting changes (`sequence_length`, the tokenizer's special ids, ...), and serves every
        number of examples: it is traced for any batch size, as the dataset route's, not for the
        first call's (a call with another count traced the tokenizing graph again, 1-2 s).
        Chunks that `pad_to_batch_max` cut to different lengths are padded to the longest.
        """
        examples = _tensors(examples)
        element = examples if isinstance(examples, tuple) else (examples,)
        first = tf.nest.flatten(element)[0]
        count = int(first.nrows()) if isinstance(first, tf.RaggedTensor) else int(first.shape[0])
        call = self._traced_call(len(element))
        call.get_concrete_function(*tf.nest.map_structure(any_batch_size, element))
        parts = [tf.nest.map_structure(lambda t: t.numpy(), call(*tf.nest.map_structure(
            lambda t: t[start:start + chunk_size], element))) for start in range(0, count,
                                                                              chunk_size)]
        pad_values = {"token_ids": self.tokenizer.pad_token_id}
        if self.packing_layout == "xlnet":
            pad_values["segment_ids"] = XLNET_PAD_SEGMENT_ID
        return _concatenate(parts, pad_values, self.padding_side)

    def _traced_call(self, arity):
        """`self.call` on a dataset element of `arity` parts as one `tf.function`, traced once for
        the current settings (a setting changed since: traced anew, nothing stale is called)."""
        # one function per arity: TF cannot relax across arities
        return traced_once(self, trace_key(self), arity, lambda *e: self.call(*self._split(e)))

    def _split(self, element):
        """A dataset element -> (x, y, sample_weight); x a string tensor or a tuple of them."""
        element = tuple(element)
        if len(element) == 1:
            return element[0], None, None
        if isinstance(element[1], dict):  # no fine-tuning preprocessor's labels are a dict
            key = next(iter(element[1]), "labels")
            raise ValueError(
                f"{type(self).__name__} takes the labels themselves, not a dict: got labels "
                f"with keys {sorted(map(str, element[1]))}. Pass e.g. "
                f"ds.map(lambda x, y: (x, y[{key!r}])).")
        if all(_is_string(tf.type_spec_from_value(e)) for e in element
               if not isinstance(e, (tuple, list))) and not isinstance(element[0], (tuple, list)):
            return element, None, None  # a sentence pair without labels
        return (element[0], element[1], element[2] if len(element) > 2 else None)

    def get_config(self):
        config = super().get_config()
        config.update(tokenizer=keras.saving.serialize_keras_object(self.tokenizer),
                      sequence_length=self.sequence_length, layout=self.layout,
                      **self.segment_ids_config())
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TextClassifierPreprocessor(FinetuningPreprocessor):
    """Strings (or `(first, second)` pairs of strings) -> packed inputs, labels checked.

    `x`: [B] strings, or a tuple of two [B] string tensors (sentence pairs, GLUE's MNLI/STS-B).
    `y`: [B] ints in `0..num_classes-1`, or floats when `num_classes=1` (regression).
    `pad_to_batch_max=True` cuts each batch to its longest example (at most `sequence_length`):
    dynamic padding, which saves most of the compute on short sentences.

    `group_by_length=True` (training only; implies `pad_to_batch_max`) is HF `Trainer`'s
    `group_by_length`: `prepare` takes `group_by_length_batches` (50) consecutive batches at a
    time, sorts their examples by token count (longest first) and cuts them into batches of the
    incoming size again, each padded to its own longest. On the Rotten Tomatoes sentences the
    padded tokens fall from 1.34x the real ones (random batches, or bucketing by word count) to
    1.02x. `predict` and `evaluate` keep their order and batches.

    `pad_to_multiple_of` (HF `DataCollatorWithPadding`'s): with dynamic padding, a batch's width
    is its longest example rounded up to a multiple of this (at most `sequence_length`). The
    default "auto" is 8 on JAX, where every new width compiles the train step again (a few
    seconds each: up to `sequence_length` compilations in a fit, `sequence_length / 8` with
    rounding), and 1 (no rounding) on TensorFlow and PyTorch, whose steps take any width.
    The extra columns are padding: the outputs are the same.
    """

    global_attention_task = "TextClassifier"

    group_by_length_batches = GROUP_BY_LENGTH_BATCHES
    raw_inputs = ("a batch of texts (a list, 1-D array or pandas Series of strings, a string "
                  "tensor [B]), or a tuple of two such batches for text pairs")

    def __init__(self, tokenizer, sequence_length=128, num_classes=None, pad_to_batch_max=False,
                 group_by_length=False, pad_to_multiple_of="auto", truncate="round_robin",
                 **kwargs):
        if truncate not in ("round_robin", "waterfall"):
            raise ValueError(f"{type(self).__name__}: truncate must be 'round_robin' or "
                             f"'waterfall' (keras-hub's), got {truncate!r}.")
        self.truncate = truncate
        super().__init__(tokenizer, sequence_length, **kwargs)
        self.num_classes = num_classes
        self.pad_to_batch_max = check_flag("pad_to_batch_max", pad_to_batch_max)
        self.group_by_length = check_flag("group_by_length", group_by_length)
        self.pad_to_multiple_of = check_pad_to_multiple_of(pad_to_multiple_of)

    def check_raw(self, x, who=None):
        """Each segment one batch of texts (`as_segments`: `check_text_batch`)."""
        as_segments(x, who or type(self).__name__, self.raw_inputs)
        check_column_lengths(x, who or type(self).__name__)

    def call(self, x, y=None, sample_weight=None):
        segments = as_segments(x)  # checked where x entered (`check_raw`)
        if len(segments) > 2:
            raise ValueError(f"TextClassifier takes one or two segments, got {len(segments)}.")
        features = self._features([self.tokenizer(s) for s in segments])
        if self.dynamic_padding:
            features = _cut_to_longest(features, self.width_multiple, self.padding_side)
        if y is not None:
            if self.num_classes and self.num_classes > 1:
                y = as_labels(y)
                one_hot = y.shape.rank == 2 and y.shape[1] == self.num_classes
                check_label_shape(y.shape, "TextClassifier", "class id", MULTI_LABEL + (
                    " One-hot labels: map them to class ids, e.g. ds.map(lambda x, y: (x, "
                    "tf.argmax(y, axis=-1)))." if one_hot else ""))
                y = check_labels(y, self.num_classes)
            elif self.num_classes == 1:  # regression: finite float32 targets
                # (TensorFlow's "Cast string to float is not supported")
                y = check_not_text(y, "TextClassifier", 1)
                check_label_shape(y.shape, "TextClassifier", "regression target", MULTI_TARGET)
                y = check_finite_targets(y)
            else:  # no task attached: the labels as given (integer labels stay integer), but
                # not text (which passed through: class ids are numbers)
                y = check_not_text(y, type(self).__name__, None)
        return _pack(features, y, sample_weight)

    @property
    def dynamic_padding(self):
        """Whether a batch is cut to its longest example (`group_by_length` implies it)."""
        return self.pad_to_batch_max or self.group_by_length

    @property
    def width_multiple(self):
        """`pad_to_multiple_of` resolved for the Keras backend (see the class docstring)."""
        return width_multiple(self.pad_to_multiple_of)

    @property
    def prepares_batch_by_batch(self):
        return not self.group_by_length

    def prepare(self, ds, training=True, batch_size=None):
        if not (training and self.group_by_length):
            return super().prepare(ds, training)
        self._check_element_spec(ds)
        call = self._traced_call(_arity(ds))

        def sorted_megabatch(*batches):  # [K, (B)] per part -> K·B examples, longest first
            examples = tf.nest.map_structure(_merge_batches, batches)
            first = tf.nest.flatten(batches)[0]
            size = (tf.reduce_max(first.row_lengths()) if isinstance(first, tf.RaggedTensor)
                    else tf.shape(first, out_type=tf.int64)[1])
            return longest_first(call(*examples)), size

        multiple, side = self.width_multiple, self.padding_side

        def cut(*element):
            return (_cut_to_longest(element[0], multiple, side), *element[1:]) \
                if len(element) > 1 else _cut_to_longest(element[0], multiple, side)

        grouped = (ds.ragged_batch(self.group_by_length_batches)
                   .map(no_autograph(sorted_megabatch), num_parallel_calls=AUTOTUNE)
                   .flat_map(no_autograph(lambda out, size: tf.data.Dataset.from_tensor_slices(
                       out).batch(size)))
                   .map(no_autograph(cut), num_parallel_calls=AUTOTUNE))
        if int(ds.cardinality()) >= 0:  # one partial batch at most: as many batches as came in
            grouped = grouped.apply(tf.data.experimental.assert_cardinality(ds.cardinality()))
        return grouped.prefetch(AUTOTUNE)

    def get_config(self):
        config = dict(super().get_config(), num_classes=self.num_classes,
                      pad_to_batch_max=self.pad_to_batch_max,
                      group_by_length=self.group_by_length,
                      pad_to_multiple_of=self.pad_to_multiple_of)
        if self.truncate != "round_robin":
            config["truncate"] = self.truncate
        return config


def check_flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_pad_to_multiple_of(value):
    if value != "auto" and (not isinstance(value, (int, np.integer))
                            or isinstance(value, (bool, np.bool_)) or value < 1):
        raise ValueError(f"pad_to_multiple_of must be a positive int or 'auto', got {value!r}.")
    return value if value == "auto" else int(value)


def width_multiple(pad_to_multiple_of):
    """`pad_to_multiple_of` resolved for the Keras backend: "auto" is 8 on JAX (every new batch
    width compiles its train step again), 1 elsewhere (their steps take any width)."""
    if pad_to_multiple_of == "auto":
        return 8 if keras.backend.backend() == "jax" else 1
    return pad_to_multiple_of


def _cut_to_longest(features, multiple=1, side="right"):
    """Features of a batch cut to its longest example (`padding_mask`'s longest row), rounded
    up to a multiple of `multiple` within the batch's width; the padding columns go from the
    `side` the rows are padded on (XLNet's: the left)."""
    longest = tf.reduce_max(tf.reduce_sum(tf.cast(features["padding_mask"], tf.int32), axis=1))
    width = tf.shape(features["padding_mask"])[1]
    if multiple > 1:
        longest = tf.minimum((longest + multiple - 1) // multiple * multiple, width)
    if side == "left":
        return {k: v[:, width - longest:] for k, v in features.items()}
    return {k: v[:, :longest] for k, v in features.items()}


def longest_first(examples):
    """Examples (features, or a tuple whose first element is the features) in descending order
    of their real tokens (`padding_mask`'s row sums; ties keep their order): HF's
    `group_by_length` sorts a megabatch this way before cutting it into batches."""
    features = examples[0] if isinstance(examples, tuple) else examples
    order = tf.argsort(tf.reduce_sum(tf.cast(features["padding_mask"], tf.int32), axis=1),
                       direction="DESCENDING", stable=True)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), examples)


def _merge_batches(t):
    """[K, (B), ...] -> [K·B, ...] (dense when `ragged_batch` kept the batches dense)."""
    if isinstance(t, tf.RaggedTensor):
        return t.merge_dims(0, 1)
    return tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TokenClassifierPreprocessor(FinetuningPreprocessor):
    """Words with one label each -> packed pieces; the label goes to each word's first piece.

    `x`: [B] strings (split on whitespace into words) or [B, (W)] ragged words. `y`: [B, (W)]
    ragged ints, or [B, W] dense with -1 as padding. Returns `(x, labels [B, T], weights [B, T])`:
    the first piece of each word carries its label with weight 1; other pieces, special tokens,
    padding, words cut by truncation and labels < 0 have weight 0 (label 0).
    """

    global_attention_task = "TokenClassifier"

    raw_inputs = ("sentences (a list of strings) or their words (a list of word lists, a "
                  "RaggedTensor)")

    def __init__(self, tokenizer, sequence_length=128, num_classes=None, **kwargs):
        super().__init__(tokenizer, sequence_length, **kwargs)
        self.num_classes = num_classes

    @staticmethod
    def words_of(x):
        """Sentences [B] (split on whitespace) or word lists [B, (W)] (a RaggedTensor, Python
        lists, a 2-D array or tensor) -> words [B, (W)]."""
        if not isinstance(x, (tf.Tensor, tf.RaggedTensor)):
            x = python_texts_to_tensor(x, "TokenClassifierPreprocessor")
        if isinstance(x, tf.Tensor) and x.shape.rank == 2:
            x = tf.RaggedTensor.from_tensor(x)
        return x if isinstance(x, tf.RaggedTensor) else tf.strings.split(x)

    def word_pieces(self, x):
        """-> (pieces [B, (T)], word index of each piece [B, (T)], is first piece [B, (T)],
        words [B, (W)])."""
        words = self.words_of(x)
        by_word = tokenize_words(words, self.tokenizer)  # [B, (W), (P)]
        pieces = by_word.values  # [N, (P)]
        local = tf.ragged.range(words.row_lengths()).flat_values  # [N] index of the word in its row
        word_index = by_word.with_flat_values(
            tf.cast(tf.gather(local, row_ids(pieces.row_splits)), tf.int32))
        first = by_word.with_flat_values(_first_flags(pieces))
        return merge_rows(by_word), merge_rows(word_index), merge_rows(first), words

    def call(self, x, y=None, sample_weight=None):
        self._check_text(x, rank=2)
        pieces, word_index, first, words = self.word_pieces(x)
        features = self._features([pieces])
        if y is None:
            return features
        y = as_labels(y)
        if y.shape.rank == 1:
            raise ValueError(
                f"{type(self).__name__} takes one label per word: labels [B, (W)] (a list of "
                f"lists, a RaggedTensor, or [B, W] padded with -1); got labels of shape "
                f"{y.shape}, one per sentence.")
        if not isinstance(y, tf.RaggedTensor):  # dense [B, W]: one column per word, padded
            y = tf.RaggedTensor.from_tensor(y, lengths=words.row_lengths())
        if self.num_classes:
            y = check_labels(y, self.num_classes, what="token label", allow_negative=True,
                             who="TokenClassifier")
        else:  # no task attached (TensorFlow's "Cast string to int32 is not supported")
            y = check_not_text(y, type(self).__name__, None, what="token label")
        y = tf.cast(y, tf.int32)
        n_words, n_labels = words.row_lengths(), y.row_lengths()
        differ = tf.where(tf.not_equal(n_labels, n_words))[:, 0]
        row = _first_or_zero(differ)
        y = _assert_then(y, tf.equal(tf.size(differ), 0), ONE_LABEL_PER_WORD, differ,
                         tf.gather(n_words, row), tf.gather(n_labels, row))
        flat_labels = y.flat_values
        # label of each piece = y[b, word_index]; valid where first piece and label >= 0
        row_base = tf.gather(tf.cast(y.row_starts(), tf.int32), row_ids(word_index.row_splits))
        piece_labels = word_index.with_flat_values(
            tf.gather(flat_labels, row_base + word_index.flat_values))  # [B, (T)]
        valid = tf.logical_and(first, piece_labels >= 0)
        labels = tf.where(valid, piece_labels, 0)
        weights = tf.cast(valid, tf.float32)
        # align with the packed sequence, truncated to the budget: BERT's [CLS] at 0, pieces
        # from 1; XLNet's pieces, <sep>, <cls> at the end, padded on the left
        budget = self.sequence_length - 2
        labels, weights = labels[:, :budget], weights[:, :budget]
        if self.packing_layout == "xlnet":
            def ending(x):  # two more positions (<sep>, <cls>), then left padding
                end = tf.RaggedTensor.from_tensor(tf.zeros([x.nrows(), 2], x.dtype))
                return left_pad(tf.concat([x, end], axis=1), self.sequence_length, 0)
            labels, weights = ending(labels), ending(weights)
        else:
            labels = tf.pad(labels.to_tensor(0, shape=[None, budget]), [[0, 0], [1, 1]])
            weights = tf.pad(weights.to_tensor(0.0, shape=[None, budget]), [[0, 0], [1, 1]])
        if sample_weight is not None:
            weights = weights * tf.cast(sample_weight, tf.float32)[:, None]
        return features, labels, weights

    def _split(self, element):
        element = tuple(element)
        return element + (None,) * (3 - len(element))

    def get_config(self):
        return dict(super().get_config(), num_classes=self.num_classes)


def tokenize_words(words, tokenizer, tokenize=None):
    """Words [B, (W)] -> their pieces [B, (W), (P)], each word tokenized on its own, as HF's
    tokenizers do with `is_split_into_words=True`: a byte-level BPE word after a space (HF's
    RoBERTa tokenizer takes split words only with `add_prefix_space=True`), so that every word
    starts with `Ġ` as it does inside a sentence; a word that is a special token ("<mask>") is
    that token alone. `tokenize`: the tokenizer's call (default the tokenizer; the export
    passes its servable one)."""
    flat = words.flat_values
    if getattr(tokenizer, "add_prefix_space", None) is False:
        special = tf.zeros_like(flat, tf.bool)
        for token in tokenizer.unsplittable_tokens or ():
            special |= tf.equal(flat, token)
        flat = tf.where(special, flat, tf.strings.join([" ", flat]))
    return words.with_flat_values((tokenize or tokenizer)(flat))


def _first_flags(pieces):
    """[N, (P)] pieces of N words -> flat bool, True at each word's first piece."""
    row, index = rows_and_index(pieces.row_splits)
    return tf.equal(index, tf.gather(pieces.row_starts(), row))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MultipleChoicePreprocessor(FinetuningPreprocessor):
    """`(context [B], choices [B, C])` strings -> inputs [B, C, T] of `[CLS] context [SEP]
    choice [SEP]` (SWAG / RACE; XLNet's layout: `context <sep> choice <sep> <cls>`); `y` [B] the
    index of the right choice."""

    global_attention_task = "MultipleChoice"

    raw_inputs = ("a tuple (contexts, choices): a batch of strings [B] and a batch of lists of "
                  "strings [B, C] (C choices each)")
    takes_a_pair = True

    def __init__(self, tokenizer, sequence_length=128, num_choices=None, **kwargs):
        super().__init__(tokenizer, sequence_length, **kwargs)
        self.num_choices = num_choices

    def _split(self, element):
        element = tuple(element)
        if isinstance(element[0], (tuple, list)):
            return element[0], element[1], element[2] if len(element) > 2 else None
        return element[:2], (element[2] if len(element) > 2 else None), \
            (element[3] if len(element) > 3 else None)

    def call(self, x, y=None, sample_weight=None):
        context, choices = x  # two batches: `check_raw` where x entered
        self._check_text(context)
        self._check_text(choices, rank=2)
        choices = tf.convert_to_tensor(choices)  # [B, C]
        num_choices = tf.shape(choices)[1]
        contexts = tf.repeat(tf.convert_to_tensor(context), num_choices)  # [B*C]
        flat = self._features([self.tokenizer(contexts),
                               self.tokenizer(tf.reshape(choices, [-1]))])
        features = {k: tf.reshape(v, [-1, num_choices, self.sequence_length])
                    for k, v in flat.items()}  # [B, C, T]
        if y is not None:
            y = as_labels(y)
            check_label_shape(y.shape, "MultipleChoice", "choice label", ONE_CHOICE_LABEL)
            y = check_labels(y, num_choices, what="choice label", count="number of choices",
                             who="MultipleChoice")
        return _pack(features, y, sample_weight)

    def get_config(self):
        return dict(super().get_config(), num_choices=self.num_choices)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class QuestionAnswererPreprocessor(FinetuningPreprocessor):
    """SQuAD-style span extraction: `(question [B], context [B])` -> windows of
    `[CLS] question [SEP] context-window [SEP]` (RoBERTa's `<s> question </s></s> window </s>`),
    padded on the right; in XLNet's layout (`layout`, "auto": the task's, XLNet's on an
    `XLNetBackbone`) `context-window <sep> question <sep> <cls>`, padded on the LEFT, segment ids
    0 (window and its `<sep>`), 1 (question and its `<sep>`), 2 (`<cls>`), as HF's `run_qa.py`
    packs them for XLNet (its tokenizer pads on the left, so the context comes first).
    Character offsets come from `tokenize_with_offsets` (WordPiece, byte-level BPE, SentencePiece).

    Long contexts are cut into windows of at most `sequence_length` tokens whose starts are
    `stride` context tokens apart (BERT's `doc_stride`; a window's whole context budget apart
    where that is fewer, as Google's `run_squad.py`: every context token is in a window, none is
    skipped between two); questions are cut to
    `max_question_length` tokens. Labels `y = (answer_start, answer_text)`: the answer's
    character offset in the context and its text (SQuAD's format; `answer_start = -1` for "no
    answer"). In each window the label is the token span of the answer, or the classification
    token (`[CLS]` at 0; XLNet's `<cls>`, the last position) when the answer is not wholly inside
    the window. The text at `answer_start` must equal `answer_text`: anything else is an error
    naming the example. A `sample_weight` [B] gives each window its example's weight.

    `windows(question, context)` also returns, per window, the example it came from and each
    token's character span in the context (-1 outside the context), which `QuestionAnswerer`
    uses to map predicted spans back to text.
    """

    global_attention_task = "QuestionAnswerer"

    raw_inputs = "a tuple (questions, contexts): two batches of strings [B]"
    takes_a_pair = True

    def __init__(self, tokenizer, sequence_length=384, stride=128, max_question_length=64,
                 **kwargs):
        if isinstance(max_question_length, (bool, np.bool_)) or not isinstance(
                max_question_length, (int, np.integer)) or max_question_length < 1:
            # (a negative one was a slice that cut tokens off every question's end; 0 no question)
            raise ValueError(f"max_question_length must be a positive number of tokens; got "
                             f"{max_question_length!r}.")
        # sequence_length's check reads it
        self.max_question_length = int(max_question_length)
        super().__init__(tokenizer, sequence_length, **kwargs)
        if not 0 < stride:
            raise ValueError(f"stride must be positive, got {stride}.")
        self.stride = stride

    def _check_sequence_length(self, value):
        """A window must hold a context token after the longest question and the special tokens
        of the layout packed now (a layout set later, or a task's, is checked again)."""
        specials = self._specials()
        if value - specials - self.max_question_length < 1:
            if self._xlnet():
                name = "XLNet's layout (context <sep> question <sep> <cls>)"
            elif self.pair_separators == 1:
                name = "BERT's layout ([CLS] question [SEP] context [SEP])"
            else:
                name = (f"BERT's layout with the tokenizer's {self.pair_separators} pair "
                        "separators (RoBERTa's <s> question </s></s> context </s>)")
            raise ValueError(
                f"sequence_length={value} leaves no room for the context after a question of up "
                f"to {self.max_question_length} tokens and the {specials} special tokens of "
                f"{name}: expected sequence_length >= "
                f"{self.max_question_length + specials + 1}, or a smaller max_question_length.")

    def _split(self, element):
        element = tuple(element)
        if isinstance(element[0], (tuple, list)):
            return element[0], element[1] if len(element) > 1 else None, \
                element[2] if len(element) > 2 else None
        return element[:2], None, None

    def _xlnet(self):
        return self.packing_layout == "xlnet"

    def _specials(self):
        """Special tokens of a window: [CLS] q [SEP] c [SEP], RoBERTa's <s> q </s></s> c </s>,
        XLNet's c <sep> q <sep> <cls> (whatever the tokenizer's pair separators)."""
        return 3 if self._xlnet() else 2 + self.pair_separators

    def windows(self, question, context):
        features, meta, _ = self._windows(question, context)
        return features, meta

    def _windows(self, question, context):
        """`windows`, and the context tokens of every example as flat [N] tensors: (example,
        character start, character end), for the labels."""
        # the layout packed now: a task's "auto" (set when the task took this preprocessor)
        self._check_sequence_length(self.sequence_length)
        question = tf.convert_to_tensor(question)
        context = tf.convert_to_tensor(context)
        # Questions and contexts in one call of `tokenize_with_offsets`: the tokenizer's ids, with
        # no state (an exported QuestionAnswerer's string signature runs this very graph; BPE's
        # own path writes a cache) and one BPE merge loop for both.
        ids, starts, ends = tokenize_with_offsets(self.tokenizer, tf.concat([question, context], 0))
        # On the flat tokens: row i's are [splits[i], splits[i + 1]), questions' rows first.
        # Windows and questions are gathered from them by index (`ranges`); ragged slices and
        # gathers traced ~5x the ops.
        count = tf.shape(question)[0]
        splits = tf.cast(ids.row_splits, tf.int32)  # [2B + 1]
        q_first, c_first = splits[:count], splits[count:-1]  # [B] each
        q_len = tf.minimum(splits[1:count + 1] - q_first, self.max_question_length)
        c_len = splits[count + 1:] - c_first
        budget = self.sequence_length - self._specials() - q_len  # [B] context tokens per window
        extra = tf.maximum(c_len - budget, 0)
        # windows start `stride` tokens apart, or a window's budget apart where that is less
        # (Google's run_squad.py: `start_offset += min(length, doc_stride)`): no context token
        # is ever skipped between two windows
        step = tf.minimum(self.stride, budget)  # [B]
        n_windows = 1 + (extra + step - 1) // step  # [B]
        w_index, _, window_example = ranges(tf.zeros_like(n_windows), n_windows)  # [W]
        w_start = w_index * tf.gather(step, window_example)  # [W] first context token
        w_len = tf.minimum(tf.gather(budget, window_example),
                           tf.gather(c_len, window_example) - w_start)
        w_len = tf.maximum(w_len, 0)
        # each window's tokens: flat indices into the tokens, and its row of them
        w_first = tf.gather(c_first, window_example) + w_start  # [W] the first token's index
        index, w_splits, w_row = ranges(w_first, w_len)
        q_index, q_splits, _ = ranges(tf.gather(q_first, window_example),
                                      tf.gather(q_len, window_example))
        flat_ids = ids.flat_values

        def rows(values, row_splits):
            return tf.RaggedTensor.from_row_splits(values, tf.cast(row_splits, tf.int64),
                                                   validate=False)

        win_ids = rows(tf.gather(flat_ids, index), w_splits)  # [W, (L)]
        q_win = rows(tf.gather(flat_ids, q_index), q_splits)  # [W, (Q)]
        w_q_len = tf.gather(q_len, window_example)  # [W]
        if self._xlnet():
            # pad... window <sep> question <sep> <cls>: the window ends 3 + Q before the end
            # (the window fits its budget: xlnet_pack truncates nothing)
            features = self._features([win_ids, q_win])
            lead = self.sequence_length - 3 - w_q_len - w_len  # [W]
        else:
            # [CLS] question [SEP] window [SEP] pad...: the window starts after [CLS] q [SEP]
            features = self._features([q_win, win_ids])
            lead = w_q_len + 1 + self.pair_separators  # [W]
        # character spans of each packed position (context tokens from `lead` on; -1 elsewhere)
        column = index + tf.gather(lead - w_first, w_row)  # a window's tokens from `lead` on
        shape = [tf.size(window_example), self.sequence_length]
        scatter_idx = tf.stack([w_row, column], axis=1)
        flat_start, flat_end = starts.flat_values, ends.flat_values
        span_start = tf.tensor_scatter_nd_update(tf.fill(shape, -1), scatter_idx,
                                                 tf.gather(flat_start, index))
        span_end = tf.tensor_scatter_nd_update(tf.fill(shape, -1), scatter_idx,
                                               tf.gather(flat_end, index))
        meta = {"example_index": window_example, "token_start": span_start,
                "token_end": span_end, "window_start": w_start, "window_length": w_len,
                "lead": lead,
                "cls_index": tf.fill(tf.shape(window_example),
                                     self.sequence_length - 1 if self._xlnet() else 0)}
        c_tokens = tf.range(splits[count], splits[-1])  # [N] the contexts' tokens
        context_tokens = (row_ids(splits[count:] - splits[count]),
                          tf.gather(flat_start, c_tokens), tf.gather(flat_end, c_tokens))
        return features, meta, context_tokens

    def call(self, x, y=None, sample_weight=None):
        question, context = x  # two batches: `check_raw` where x entered
        self._check_text(question, context)
        features, meta, (row, cs, ce) = self._windows(question, context)
        if y is None:
            return features
        answer_start, answer_text = y
        context = tf.convert_to_tensor(context)
        answer_start = tf.cast(check_integer_labels(
            tf.convert_to_tensor(answer_start), "answer_start", ANSWER_START), tf.int32)
        answer_len = tf.strings.length(answer_text, unit="UTF8_CHAR")
        found = tf.strings.substr(context, tf.maximum(answer_start, 0), answer_len,
                                  unit="UTF8_CHAR")
        ok = tf.logical_or(answer_start < 0, tf.equal(found, answer_text))
        bad = tf.where(tf.logical_not(ok))[:1, 0]
        answer_start = _assert_then(
            answer_start, tf.reduce_all(ok), "The answer is not in its context at answer_start: "
            "example {} has answer_text {}, but its context has {} there.", bad,
            _first_or_zero(tf.gather(answer_text, bad)), _first_or_zero(tf.gather(found, bad)))
        # the answer's token span in the whole context, by HF run_qa.py's rule: from the last
        # token starting at or before its first character to the first token ending at or after
        # its end (offsets are ascending). Where tokens share a first character this is the
        # last of them: the word after SentencePiece's lone "▁" (which spans the word's first
        # character), the last byte-level piece of a multi-byte character (each spans the whole
        # character, so the answer's character span is whole either way), as HF's labels. An
        # answer overlapping no token has no span.
        # (row, cs, ce: [N] each context token's example, first and end character)
        a0 = tf.gather(answer_start, row)  # [N] the answer's start, for each context token
        a1 = tf.gather(answer_start + answer_len, row)

        def count(flags):  # [N] -> [B]: how many of each context's tokens
            return tf.math.unsorted_segment_sum(tf.cast(flags, tf.int32), row,
                                                tf.size(answer_start))

        found_tokens = (count((ce > a0) & (cs < a1)) > 0) & (answer_start >= 0)
        first_tok = count(cs <= a0) - 1
        last_tok = count(ce < a1)
        e = meta["example_index"]
        tok0, tok1 = tf.gather(first_tok, e), tf.gather(last_tok, e)  # [W]
        w0, wl = meta["window_start"], meta["window_length"]
        has = tf.gather(found_tokens, e) & (tok0 >= w0) & (tok1 < w0 + wl)
        # elsewhere the classification token: [CLS] at 0, XLNet's <cls> last (HF's run_qa.py:
        # `input_ids.index(cls_token_id)`), never a padding position
        start = tf.where(has, meta["lead"] + tok0 - w0, meta["cls_index"])
        end = tf.where(has, meta["lead"] + tok1 - w0, meta["cls_index"])
        if sample_weight is not None:  # each window takes its example's weight
            sample_weight = tf.gather(tf.cast(sample_weight, tf.float32), e)
        return _pack(features, {"start_positions": start, "end_positions": end}, sample_weight)

    def prepare(self, ds, training=True, batch_size=None):
        """Windows re-batched by `batch_size` (a task's `fit(batch_size=...)`: windows a step,
        as HF's batch of features), 32 without one."""
        windows = ds.map(self._map_function(ds), num_parallel_calls=AUTOTUNE)
        return windows.unbatch().batch(batch_size or 32).prefetch(AUTOTUNE)

    def get_config(self):
        return dict(super().get_config(), stride=self.stride,
                    max_question_length=self.max_question_length)
