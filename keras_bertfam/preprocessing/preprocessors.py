"""Raw text -> `(x, y, sample_weight)` for the pretraining tasks, as `tf.data` stages.

A preprocessor is a Keras layer over TensorFlow tensors (it is never converted to the backend)
that a task maps over its dataset: `task.fit(strings)` calls `preprocessor.prepare(dataset)`.
Objectives that change the number of examples (NSP / SOP pairing, RoBERTa's document packing)
produce a variable number of instances per batch of documents and rebatch them to `batch_size`.

Randomness in `prepare` is fairseq's seed-per-element scheme: each batch is zipped with a draw of
`tf.data.Dataset.random(seed)` (new draws every epoch) that seeds its pairing and masking, so a
pipeline gives the same examples for the same seed whatever `num_parallel_calls` does, and a fresh
mask every time an example is seen (RoBERTa's dynamic masking).
"""
import math
import numbers

import keras
import tensorflow as tf

from keras_bertfam.preprocessing.corpus import split_sentences
from keras_bertfam.preprocessing.errors import KeepsTFErrors, check_text_batch
from keras_bertfam.preprocessing.finetuning import (
    GROUP_BY_LENGTH_BATCHES,
    ReturnsModelInputs,
    _cut_to_longest,
    _merge_batches,
    as_segments,
    check_flag,
    check_pad_to_multiple_of,
    check_segment_ids,
    longest_first,
    no_autograph,
    preset_preprocessor,
    trace_key,
    traced_once,
    width_multiple,
)
from keras_bertfam.preprocessing.masking import TokenMasker, _Masker
from keras_bertfam.preprocessing.packing import (
    DocumentPacker,
    NextSentencePairer,
    SegmentPacker,
)
from keras_bertfam.preprocessing.tokenizers import check_text_items, require_special_tokens

AUTOTUNE = tf.data.AUTOTUNE
# Instances made from one document come out together; BERT's create_pretraining_data and
# fairseq shuffle them over the corpus. A buffer of this many instances does it in the pipeline.
DEFAULT_SHUFFLE_BUFFER = 1024


# keras-hub's `MaskedLMPreprocessor` arguments that are our maskers' own (the same names and
# meanings): a pretraining preprocessor takes them for its masker (`masker_with`).
MASKING_ARGS = ("mask_selection_rate", "mask_selection_length", "mask_token_rate",
                "random_token_rate")


def _predictions(sequence_length, rate):
    """BERT's max_predictions_per_seq for a rate: ceil(rate · length), at least 1 (None for a
    rate that is not a number: the masker names it)."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real):
        return None
    return max(1, math.ceil(sequence_length * rate))


def default_masker(tokenizer, sequence_length, mask_selection_rate=0.15, seed=None,
                   mask_selection_length=None, **kwargs):
    """BERT's masking for this tokenizer: 15%, 80/10/10, at most ceil(0.15 · length) predictions
    (20 at length 128, as BERT's max_predictions_per_seq), never a special token."""
    require_special_tokens(tokenizer, ["mask"], "Masked-language-model pretraining")
    if mask_selection_length is None:
        mask_selection_length = _predictions(sequence_length, mask_selection_rate) or 1
    return TokenMasker(
        vocabulary_size=tokenizer.vocabulary_size(),
        mask_selection_rate=mask_selection_rate,
        mask_token_id=tokenizer.mask_token_id,
        mask_selection_length=mask_selection_length,
        unselectable_token_ids=tokenizer.special_token_ids,
        padding_token_id=tokenizer.pad_token_id,
        seed=seed,
        **kwargs,
    )


def masker_with(masker, sequence_length, args, who):
    """`masker` (a `_Masker`: token, whole-word, n-gram, span masking) rebuilt with keras-hub's
    masking arguments `args` (`MASKING_ARGS`) set; its kind and other settings kept. Its number
    of predictions follows a new `mask_selection_rate` where it was the rate's default
    (ceil(rate · sequence_length)) and `args` set none. A masker of another kind (XLNet's
    `PermutationMasker`) is refused naming the argument."""
    if not isinstance(masker, _Masker):
        given = ", ".join(f"{k}={v!r}" for k, v in args.items())
        raise ValueError(
            f"{who} got {given}: its masker ({type(masker).__name__}) takes other arguments "
            f"(keras-hub's masking arguments set a token, word, n-gram or span masker's).")
    config = masker.get_config()
    if "mask_selection_rate" in args and "mask_selection_length" not in args and \
            config["mask_selection_length"] == _predictions(sequence_length,
                                                            config["mask_selection_rate"]):
        length = _predictions(sequence_length, args["mask_selection_rate"])
        args = dict(args, **({"mask_selection_length": length} if length else {}))
    return type(masker).from_config(dict(config, **args))


def deserialize_stage(stage):
    """A masker / pairer, or its serialized config (from `get_config`, a preset or a `.keras`
    file) -> the object; None stays None."""
    if isinstance(stage, dict):
        return keras.saving.deserialize_keras_object(stage)
    return stage


# Tokenizer kind -> how the word maskers find word starts (`masking.word_continuation_table`).
_WORD_STYLES = {"wordpiece": "wordpiece", "sentencepiece": "sentencepiece", "byte_pair": "bpe"}


def word_masking_args(tokenizer):
    """`vocabulary` and `word_style` for a word-level masker (whole words, n-grams, spans) from
    the tokenizer actually used: a style hard-coded per family silently finds no word starts
    (hence no masks) when that family is given another kind of vocabulary."""
    kind = getattr(tokenizer, "kind", None)
    if kind not in _WORD_STYLES:
        raise ValueError(
            f"Word-level masking needs a WordPiece, SentencePiece or byte-level BPE tokenizer "
            f"to find word starts; got {type(tokenizer).__name__}. Pass masker= explicitly.")
    return {"vocabulary": tokenizer.get_vocabulary(), "word_style": _WORD_STYLES[kind]}


def _check_not_empty(ds, name):
    """A corpus without documents is an error when the pipeline is built, not 0 batches: a known
    cardinality of 0, or (unknown cardinality) no first element."""
    cardinality = int(ds.cardinality())
    empty = cardinality == 0 or (
        cardinality == tf.data.UNKNOWN_CARDINALITY and next(iter(ds.take(1)), None) is None)
    if empty:
        raise ValueError(
            f"{name} got a corpus with no documents (an empty dataset): nothing to pretrain on, "
            "it would give 0 batches. Expected a dataset (or list) of at least one string; check "
            "the corpus path and any filter upstream.")


# What a pretraining task's fit and its preprocessor take as raw text
RAW_TEXT = ("raw text: a list or 1-D array of strings, one document each (a document's sentences "
            "joined into one string), or a tf.data.Dataset of strings")


def check_texts(texts, name):
    """In-memory raw text for pretraining: a list or 1-D array of strings, one document each.
    A tuple of columns, a dict or table of columns (was "'dict' object has no attribute
    'dtype'"), lists of sentences (TensorFlow's "Can't convert non-rectangular Python
    sequence") and a 2-D array (a graph error in the epoch's pipeline) are refused by name
    (`check_text_batch`, the fine-tuning preprocessors' check)."""
    if isinstance(texts, tuple):
        raise ValueError(f"{name} got a tuple of {len(texts)} columns: pretraining is "
                         f"self-supervised (no labels, no text pairs); it takes {RAW_TEXT}.")
    check_text_batch(texts, name, RAW_TEXT)
    if isinstance(texts, list):
        check_text_items(texts, name)  # None, numbers: named by index


def _shuffled_by_tensor_seed(ds, buffer_size, seed):
    """`ds.shuffle(buffer_size)` seeded by an int64 tensor (inside a `tf.data` function), the
    same whatever the global seed: the graph-level seed is 1 while the op is made. (TF's
    `get_seed` compares `(global seed, seed)` with `(0, 0)` in Python, which fails on a
    tensor when the global seed is 0: `keras.utils.set_random_seed(0)`.)"""
    graph = tf.compat.v1.get_default_graph()
    saved = graph.seed
    graph.seed = 1
    try:
        return ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=False)
    finally:
        graph.seed = saved


def _end_mark(spec):
    """`(True, zeros)`, the zeros of the structure of `spec` (a dimension of unknown size: 0)."""
    zeros = tf.nest.map_structure(
        lambda s: tf.zeros([0 if d is None else d for d in s.shape], s.dtype), spec)
    return tf.data.Dataset.from_tensors((tf.constant(True), zeros))


def _end_marked(batches):
    """`(False, batch)` for each batch of `batches`, then `(True, zeros)`: the end of an epoch
    in a pipeline of many (`prepare_epochs(end_marks=True)`)."""
    @tf.autograph.experimental.do_not_convert
    def unmarked(*batch):
        return tf.constant(False), batch if len(batch) > 1 else batch[0]

    return batches.map(unmarked).concatenate(_end_mark(batches.element_spec))


class PretrainingPreprocessor(KeepsTFErrors, keras.layers.Layer):
    """Shared base: tokenizer + packing + masking; TF tensors in, TF tensors out.

    `group_by_length=True` (training only; HF `Trainer`'s `group_by_length`): `prepare` takes
    `group_by_length_batches` (50) consecutive batches at a time, sorts their examples by real
    token count (longest first), cuts them into batches of `batch_size` again and cuts each
    batch to its longest example, rounded up to a multiple of `pad_to_multiple_of` ("auto": 8
    on JAX, where each new width compiles the train step again, else 1). The examples and
    their masks are the ones drawn without it (masking runs before, at `sequence_length`);
    what changes is which examples share a batch, and the padding columns no step computes.
    BERT's NSP pairs of IMDB reviews at length 128 are 83% real tokens at a fixed width and
    99% grouped (the 10% short pairs and each document's last pair group together).

    `prepare(ds, training, batch_size=None)` ignores `batch_size` (see
    `FinetuningPreprocessor.prepare`): its batches are the constructor's `batch_size`.
    """

    raw_inputs = RAW_TEXT  # named by the errors of raw text in another shape

    group_by_length_batches = GROUP_BY_LENGTH_BATCHES
    # Whether `get_config` records the masker (XLNet's is made from its other arguments and the
    # tokenizer's ids, which a config read before the tokenizer's vocabulary would not have).
    masker_in_config = True
    # The [B, sequence_length] inputs a cut shortens; the rest ([B, P] positions) index into them.
    sequence_keys = ("token_ids", "segment_ids", "padding_mask")

    def __init__(self, tokenizer, sequence_length=128, masker=None, batch_size=32, seed=None,
                 group_by_length=False, pad_to_multiple_of="auto", **kwargs):
        # keras-hub's masking arguments (`MASKING_ARGS`): the masker's, not saved apart from it
        masking = {k: kwargs.pop(k) for k in MASKING_ARGS if k in kwargs}
        super().__init__(**kwargs)
        self.group_by_length = check_flag("group_by_length", group_by_length)
        self.pad_to_multiple_of = check_pad_to_multiple_of(pad_to_multiple_of)
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        if not isinstance(sequence_length, int) or sequence_length < 4:
            raise ValueError(f"sequence_length must be an int >= 4, got {sequence_length!r}.")
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.seed = seed
        require_special_tokens(tokenizer, ["cls", "sep", "pad"], type(self).__name__)
        masker = deserialize_stage(masker)
        if masker is None:
            masker = default_masker(tokenizer, sequence_length, seed=seed, **masking)
        elif masking:
            masker = masker_with(masker, sequence_length, masking, type(self).__name__)
        self.masker = masker
        self.built = True

    @property
    def packer(self):
        """The `SegmentPacker` of `[CLS] A [SEP] (B [SEP])`, made from the tokenizer's special
        ids when they are first needed or change: a tokenizer restored from a `.keras` file gets
        its vocabulary, so its ids, after this layer is constructed (a packer made at
        construction padded with None: `load_model` then `fit` on raw text failed with "None
        values not supported")."""
        tok = self.tokenizer
        ids = (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
        truncate = getattr(self, "truncate", "round_robin")
        packer = self.__dict__.get("_segment_packer")
        if packer is None or (packer.start_value, packer.end_value, packer.pad_value) != ids \
                or packer.truncate != truncate:
            packer = SegmentPacker(self.sequence_length, start_value=ids[0], end_value=ids[1],
                                   pad_value=ids[2], truncate=truncate)
            object.__setattr__(self, "_segment_packer", packer)
        return packer

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """This preprocessor on a preset's tokenizer (keras-hub's `Preprocessor.from_preset`)."""
        return preset_preprocessor(cls, preset, **kwargs)

    @property
    def sequence_length(self):
        return self._sequence_length

    @sequence_length.setter
    def sequence_length(self, value):
        # Fixed at construction: the packer, pairer and the masker's default number of
        # predictions were all built for it (keras-hub's setter moves only the packer).
        if getattr(self, "_sequence_length", value) != value:
            raise ValueError(
                f"{type(self).__name__}.sequence_length is fixed at construction "
                f"({self._sequence_length}; got {value!r}): its packing and masking were built "
                "for it. Make a new preprocessor with sequence_length= instead.")
        self._sequence_length = value

    def _mask(self, token_ids, segment_ids, padding_mask, seed=None):
        masked = self.masker(token_ids, seed=seed)
        x = {
            "token_ids": masked["token_ids"],
            "segment_ids": tf.cast(segment_ids, tf.int32),
            "padding_mask": tf.cast(padding_mask, tf.int32),
            "mask_positions": tf.cast(masked["mask_positions"], tf.int32),  # the model's dtype
        }
        return x, masked["mask_ids"], masked["mask_weights"]

    def _documents(self, texts):
        """Strings [B] -> ragged ids [B, (S sentences), (W tokens)]."""
        sentences = split_sentences(texts)
        return sentences.with_flat_values(self.tokenizer(sentences.flat_values))

    # === Epoch-keyed pipelines (a resumed fit reads where the run stopped) ===
    # While `prepare_epochs` builds one epoch's pipeline: that epoch's number and the batches
    # to skip at its start (int64 tensors of the epoch function); None otherwise.
    _epoch = None
    _skip = None

    def _key(self, *parts):
        """A [2] int64 stateless key: this preprocessor's seed with `parts` (an epoch, an
        index, a salt) folded in."""
        seed = self.seed if self.seed is not None else getattr(self.masker, "seed", 0)
        key = tf.constant([int(seed), 0], tf.int64)
        for part in parts:
            key = tf.random.experimental.stateless_fold_in(key, tf.cast(part, tf.int64))
        return key

    def _seeded_map(self, ds, fn, salt, parallel=True, last=False):
        """`ds.map(fn(element, seed=s))`. Run by run (`prepare`): s drawn from
        `Dataset.random(self.seed)`, new draws at every repetition. Epoch by epoch
        (`prepare_epochs`): s = (seed, epoch, element index, salt), so an epoch's elements
        depend on nothing before it, and the pipeline's last map (`last`), when no regrouping
        follows it, skips the epoch's first `_skip` elements before mapping them."""
        calls = AUTOTUNE if parallel else None
        fn = self._traced(fn)
        if self._epoch is None:
            draws = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True)
            draws = draws.map(no_autograph(lambda s: tf.stack([s, tf.constant(salt, tf.int64)])))
            zipped = tf.data.Dataset.zip((ds, draws))
            return zipped.map(no_autograph(lambda x, s: fn(x, seed=s)), num_parallel_calls=calls)
        epoch = self._epoch
        indexed = ds.enumerate()
        if last and self._skip is not None and not self.group_by_length:
            indexed, self._skip = indexed.skip(self._skip), None
        return indexed.map(no_autograph(lambda i, x: fn(x, seed=self._key(epoch, i, salt))),
                           num_parallel_calls=calls)

    def _traced(self, fn):
        """`fn` (a method of this preprocessor, or the preprocessor itself: its call) as a
        `tf.function` made once per preprocessor (and `trace_key`: the tokenizer, the settings
        and the stages), for `Dataset.map`. A map traces its function again for every new
        pipeline (each `prepare`, each fit's): the tokenizer's, pairer's and masker's graphs
        were traced anew each time (XLNet's `prepare`: ~1 s of CPU a call on 4 short texts);
        a map of this traces a call of it, and its graph once. No AutoGraph: plain TF ops
        (loops are `tf.while_loop`s). The functions take their seed as an argument: `seed` is
        read by the pipeline around them (its draws, its shuffles), so a new seed (the CLI's, at
        each checkpoint chunk) does not trace them again."""
        key = trace_key(self, id(self.masker), id(getattr(self, "pairer", None)),
                        unread=("seed",))
        return traced_once(self, key, getattr(fn, "__name__", "call"), fn)

    def prepare_epochs(self, ds, epochs, shuffle_batch_size=None, checked=False,
                       end_marks=False):
        """The training pipeline epoch by epoch: `epochs` is a dataset of `(epoch, skip)` int64
        pairs, each giving that epoch's batches (order, pairs, blocks and masks drawn from
        `(seed, epoch)` alone) without its first `skip`. A fit resumed at epoch k, batch b reads
        from there and prepares nothing before it but the instances (pairs, blocks) of epoch
        k's first b batches, on which the batches' boundaries depend; where each batch is its
        own strings (`packing="segments"`), not even those. The draws differ from `prepare`'s,
        not their distribution. `shuffle_batch_size`: `ds` holds single examples, shuffled
        (from `(seed, epoch)`) and batched by that many every epoch (a fit on in-memory text).
        `checked`: `batches_per_epoch` checked `ds` already (a task's `fit`), so an input of
        unknown length is not read again for its first element (each read opens an iterator:
        a reshuffling input draws a new order). `end_marks`: elements `(False, batch)`, each
        epoch's batches followed by `(True, zeros)` (its end, `_end_marked`), and `(True, zeros)`
        for ever after the last epoch: one pipeline, opened once, for every epoch of a fit
        whose epochs' lengths are not known beforehand (`Task._epoch_keyed`)."""
        strings = self._batched_strings(ds, check_empty=not checked)  # checked here, eagerly
        if shuffle_batch_size:
            count = int(ds.cardinality())

        # Not converted by AutoGraph: `prepare` has no tensor-dependent Python control flow
        # (its map functions are converted by their own `map`), and converting it and
        # everything it calls cost a fifth of a tiny pretraining fit's CPU (test_resume's NSP
        # fit: 7.2-8.0 -> 4.8-7.0 s, the same weights; BUILD.md, "One pipeline a fit").
        @tf.autograph.experimental.do_not_convert
        def one_epoch(epoch, skip):
            self._epoch, self._skip = epoch, skip
            try:
                batched = strings
                if shuffle_batch_size:
                    key = tf.random.experimental.stateless_fold_in(self._key(5), epoch)
                    seed = tf.random.stateless_uniform([], key, minval=None, maxval=None,
                                                       dtype=tf.int64)
                    batched = _shuffled_by_tensor_seed(ds, count, seed)
                    batched = batched.batch(shuffle_batch_size)
                batches = self.prepare(batched, training=True)
                if self._skip is not None:  # not skipped before a map: skipped whole
                    batches = batches.skip(self._skip)
                return _end_marked(batches) if end_marks else batches
            finally:  # (the class's None again: not a setting of `trace_key`)
                self.__dict__.pop("_epoch", None)
                self.__dict__.pop("_skip", None)

        run = epochs.flat_map(one_epoch)
        if end_marks:  # past the last epoch: ends only (the reader of a finished fit reads none)
            run = run.concatenate(_end_mark(run.element_spec[1]).repeat())
        return run.prefetch(AUTOTUNE)

    def batches_per_epoch(self, ds, shuffle_batch_size=None):
        """Checks `ds` as `prepare_epochs` takes it (strings, at least one) and returns how many
        batches an epoch of `prepare_epochs(ds, ..., shuffle_batch_size=...)` gives, counted
        without building the pipeline where `prepare` makes one batch of each input batch
        (`_batches_of`) and the input's length is known; None where it is not known before the
        epoch is read (pairs and blocks: as many as the documents make; a stream). A `fit`
        takes its steps an epoch (the schedule's total steps) from it and builds the pipeline
        once. A subclass whose `prepare` does not say (`_batches_of` defined beside it) is
        counted on its `prepare`'s pipeline, built for that."""
        strings = self._batched_strings(ds)  # checked here, eagerly
        if shuffle_batch_size:
            strings = ds.batch(shuffle_batch_size)
        owner = next(c for c in type(self).__mro__ if "prepare" in c.__dict__)
        if "_batches_of" not in owner.__dict__:
            n = int(self.prepare(strings, training=True).cardinality())
        else:
            n = self._batches_of(int(strings.cardinality()))
        return n if n is not None and n > 0 else None

    def _batches_of(self, input_batches):
        """The batches `prepare(training=True)` makes of `input_batches` (a count, or tf.data's
        -1 / -2: infinite / unknown), or None where that depends on the input's content.
        Defined beside each `prepare` (`batches_per_epoch`); kept equal to its pipeline's
        cardinality by test_preprocessors."""
        return None

    def _shuffled(self, instances, training):
        """Seeded instance shuffle before batching (training only; `shuffle_buffer=0`: off)."""
        if not training or not self.shuffle_buffer:
            return instances
        if self._epoch is not None:
            key = tf.random.experimental.stateless_fold_in(self._key(4), self._epoch)
            seed = tf.random.stateless_uniform([], key, minval=None, maxval=None,
                                               dtype=tf.int64)
            return _shuffled_by_tensor_seed(instances, self.shuffle_buffer, seed)
        return instances.shuffle(self.shuffle_buffer, seed=self.seed,
                                 reshuffle_each_iteration=True)

    def _batched_instances(self, instances, training):
        """Instances -> batches of `batch_size`, shuffled in training. In training an epoch's
        last partial batch is dropped unless it is the epoch's only batch (BERT's pretraining
        input drops it too): pairs and blocks are drawn anew each epoch, so the last batch's
        size changes every epoch, and each new size compiles the train step again on JAX and
        TPUs. Nothing is lost for good: the next epoch reshuffles and redraws."""
        batches = self._shuffled(instances, training).batch(self.batch_size)
        if not training:
            return batches
        size = self.batch_size

        def keep(index, batch):
            first = tf.nest.flatten(batch)[0]
            rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
            return (index == 0) | (tf.cast(rows, tf.int64) == size)

        unindexed = no_autograph(lambda index, batch: batch)
        return batches.enumerate().filter(no_autograph(keep)).map(unindexed)

    def _grouped(self, batches, training):
        """Prepared batches regrouped by length and cut (`group_by_length`; class docstring)."""
        if not (training and self.group_by_length):
            return batches
        size, multiple = self.batch_size, width_multiple(self.pad_to_multiple_of)

        def merged(*batch):  # K batches [K, B, ...] -> K·B examples, longest first
            return longest_first(tf.nest.map_structure(_merge_batches, batch))

        def cut(x, *rest):
            keys = [k for k in self.sequence_keys if k in x]
            return (dict(x, **_cut_to_longest({k: x[k] for k in keys}, multiple)), *rest)

        return (batches.batch(self.group_by_length_batches)
                .map(no_autograph(merged), num_parallel_calls=AUTOTUNE)
                .flat_map(no_autograph(
                    lambda *e: tf.data.Dataset.from_tensor_slices(e).batch(size)))
                .map(no_autograph(cut), num_parallel_calls=AUTOTUNE))

    def _batched_strings(self, ds, check_empty=True):
        if self._epoch is not None:  # inside `prepare_epochs`: checked and batched already
            return ds
        if not isinstance(ds, tf.data.Dataset):
            check_texts(ds, type(self).__name__)
            if hasattr(ds, "__len__") and len(ds) == 0:
                _check_not_empty(tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string)),
                                 type(self).__name__)
            ds = tf.data.Dataset.from_tensor_slices(ds)
        spec = ds.element_spec
        if isinstance(spec, tuple):
            raise ValueError(
                f"{type(self).__name__} takes a dataset of raw strings (self-supervised: no "
                f"labels), got elements of structure {spec}."
            )
        if spec.dtype != tf.string:
            raise TypeError(f"{type(self).__name__} takes strings, got {spec.dtype.name}.")
        if check_empty:
            _check_not_empty(ds, type(self).__name__)
        return ds.batch(self.batch_size) if spec.shape.rank == 0 else ds

    def get_config(self):
        config = super().get_config()
        config.update(
            tokenizer=keras.saving.serialize_keras_object(self.tokenizer),
            sequence_length=self.sequence_length,
            batch_size=self.batch_size,
            seed=self.seed,
        )
        if self.masker_in_config:
            config["masker"] = keras.saving.serialize_keras_object(self.masker)
        if self.group_by_length or self.pad_to_multiple_of != "auto":
            config.update(group_by_length=self.group_by_length,
                          pad_to_multiple_of=self.pad_to_multiple_of)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskedLMPreprocessor(ReturnsModelInputs, PretrainingPreprocessor):
    """Strings -> masked-LM examples (BERT's MLM, RoBERTa's objective).

    `packing="segments"` (default): each string (or pair of strings) is one example,
    `[CLS] A [SEP] (B [SEP])`, truncated round-robin to `sequence_length` (longer text is cut: the
    tail is dropped). `packing="full_sentences"` / `"doc_sentences"`: each string is a document;
    its sentences fill blocks of `sequence_length` (RoBERTa's FULL-/DOC-SENTENCES; nothing is cut,
    long sentences are split). `packing="token_blocks"`: the documents' tokens cut into full
    blocks wherever `sequence_length` falls (fairseq's break mode "none", HF `run_mlm.py`'s
    grouped texts; no padding but the batch's last block). Blocks are shuffled in a buffer of
    `shuffle_buffer` blocks (training; 0: keep the document order) and rebatched to `batch_size`
    (in training, an epoch's last partial batch is dropped unless it is the epoch's only one).

    Returns `(x, mask_ids, mask_weights)` with x = {token_ids, segment_ids, padding_mask,
    mask_positions}: keras-hub's format. A new mask is drawn every time an example is seen.
    `segment_ids="auto"` (default): no `segment_ids` when the task's or the preset's backbone
    takes none (RoBERTa's, DistilBERT's: keras-hub's `RobertaMaskedLMPreprocessor`'s keys;
    `ReturnsModelInputs`), else returned; True / False: always / never.
    `global_attention_mask="auto"`: a Longformer preset's gives one, all zeros (`MaskedLM`'s:
    no global token), for a model of one's own over its `backbone.input`.

    keras-hub's arguments: `truncate` ("round_robin", or "waterfall": the first segment keeps
    what fits; `packing="segments"`), `mask_selection_rate`, `mask_selection_length`,
    `mask_token_rate`, `random_token_rate` (the masker's: `MASKING_ARGS`).
    """

    def __init__(self, tokenizer, sequence_length=128, masker=None, packing="segments",
                 batch_size=32, seed=None, shuffle_buffer=DEFAULT_SHUFFLE_BUFFER,
                 truncate="round_robin", segment_ids="auto", global_attention_mask="auto",
                 **kwargs):
        super().__init__(tokenizer, sequence_length, masker, batch_size, seed, **kwargs)
        self.segment_ids = check_segment_ids(segment_ids)
        self.global_attention_mask = check_segment_ids(global_attention_mask,
                                                       "global_attention_mask")
        self.shuffle_buffer = shuffle_buffer
        if packing != "segments" and packing not in DocumentPacker.MODES:
            raise ValueError(f"packing must be 'segments' or one of {DocumentPacker.MODES}, "
                             f"got {packing!r}.")
        if truncate not in ("round_robin", "waterfall"):
            raise ValueError(f"truncate must be 'round_robin' or 'waterfall', got {truncate!r}.")
        if truncate != "round_robin" and packing != "segments":
            raise ValueError(f"truncate={truncate!r} is for packing='segments' (each string an "
                             f"example, cut to sequence_length); packing={packing!r} cuts "
                             "documents into blocks and truncates nothing.")
        self.packing = packing
        self.truncate = truncate

    @property
    def document_packer(self):
        """The `DocumentPacker` of `packing` (None for "segments"), made from the tokenizer's
        ids when first needed or changed (see `packer`)."""
        if self.packing == "segments":
            return None
        tok = self.tokenizer
        ids = (tok.cls_token_id, tok.sep_token_id)
        packer = self.__dict__.get("_document_packer")
        if packer is None or (packer.start_value, packer.end_value) != ids:
            packer = DocumentPacker(self.sequence_length, mode=self.packing, start_value=ids[0],
                                    end_value=ids[1], separator_value=ids[1])
            object.__setattr__(self, "_document_packer", packer)
        return packer

    def call(self, x, y=None, sample_weight=None, seed=None):
        if y is not None or sample_weight is not None:
            # keras-hub's example maps its preprocessor over a dataset of (first, second):
            # tf.data passes the second texts as y, which keras-hub drops (the pair lost).
            given = "y" if y is not None else "sample_weight"
            raise ValueError(
                f"{type(self).__name__} makes its own labels (the masked token ids) and "
                f"weights; got {given}={y if y is not None else sample_weight!r:.80}. For a "
                "text pair, pass x=(first, second): `ds.map(preprocessor)` over a dataset of "
                "(first, second) passes the second texts as y; map "
                "`lambda first, second: preprocessor(x=(first, second))` instead.")
        segments = as_segments(x, type(self).__name__, RAW_TEXT)
        segments = tuple(self.tokenizer(s) for s in segments)
        token_ids, segment_ids, padding_mask = self.packer(segments)
        return self._mask(token_ids, segment_ids, padding_mask, seed=seed)

    def _mask(self, token_ids, segment_ids, padding_mask, seed=None):
        x, mask_ids, mask_weights = super()._mask(token_ids, segment_ids, padding_mask, seed)
        return self.model_inputs(x), mask_ids, mask_weights

    def _blocks(self, texts):
        """Strings [B] (documents) -> ragged blocks [N, (T)] of `packing`."""
        return self.document_packer(self._documents(texts))

    def _pack_blocks(self, blocks, seed=None):
        token_ids = blocks.to_tensor(self.tokenizer.pad_token_id,
                                     shape=[None, self.sequence_length])
        padding_mask = tf.ones_like(blocks, tf.int32).to_tensor(0, shape=[None, self.sequence_length])
        return self._mask(token_ids, tf.zeros_like(token_ids), padding_mask, seed=seed)

    def _batches_of(self, input_batches):
        if self.packing == "segments" and not self.group_by_length:
            return input_batches  # one batch of each input batch (its strings, masked)
        return None  # blocks (as many as the text fills), regrouped batches

    def prepare(self, ds, training=True, batch_size=None):
        ds = self._batched_strings(ds)
        if self.packing == "segments":
            batches = self._seeded_map(ds, self, salt=1, last=True)
        else:
            blocks = ds.map(self._traced(self._blocks), num_parallel_calls=AUTOTUNE)
            blocks = self._batched_instances(blocks.unbatch(), training)
            batches = self._seeded_map(blocks, self._pack_blocks, salt=1, last=True)
        return self._grouped(batches, training).prefetch(AUTOTUNE)

    def get_config(self):
        config = dict(super().get_config(), packing=self.packing,
                      shuffle_buffer=self.shuffle_buffer, **self.segment_ids_config())
        if self.truncate != "round_robin":
            config["truncate"] = self.truncate
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SentencePairPreprocessor(PretrainingPreprocessor):
    """Documents -> MLM + sentence-pair examples: BERT's NSP (default) or ALBERT's SOP.

    Each string is a document; `split_sentences` cuts it, the pairer (`NextSentencePairer` or
    `SentenceOrderPairer`) makes `[CLS] A [SEP] B [SEP]` instances (BERT's
    create_instances_from_document), which are shuffled in a buffer of `shuffle_buffer` instances
    (training; BERT shuffles all instances of its input; 0 keeps a document's pairs together),
    rebatched to `batch_size` (in training, an epoch's last partial batch is dropped unless it
    is the epoch's only one), packed and masked.

    Returns `(x, {"mask_ids", "mask_weights", "pair_labels"})`.
    """

    def __init__(self, tokenizer, sequence_length=128, masker=None, pairer=None, batch_size=32,
                 seed=None, short_seq_prob=0.1, shuffle_buffer=DEFAULT_SHUFFLE_BUFFER, **kwargs):
        super().__init__(tokenizer, sequence_length, masker, batch_size, seed, **kwargs)
        self.shuffle_buffer = shuffle_buffer
        self.short_seq_prob = short_seq_prob
        self.pairer = deserialize_stage(pairer) or NextSentencePairer(sequence_length,
                                                                       short_seq_prob, seed=seed)

    def no_batch_hint(self):
        """Why data may give no batch (a task's `fit` says it when none came), or None."""
        pairer = self.pairer
        if getattr(pairer, "single_sentence", None) != "skip":
            return None
        return (f"{type(pairer).__name__} makes no example of a document of one sentence "
                "(single_sentence='skip'): pass documents (strings) of two or more sentences, "
                f"or pairer={type(pairer).__name__}({pairer.sequence_length}, "
                "single_sentence='random_document').")

    def instances(self, texts, seed=None):
        """Strings [B] -> (segment_a [N, (T)], segment_b [N, (T)], labels [N])."""
        return self.pairer(self._documents(texts), seed=seed)

    def call(self, instances, seed=None):
        """(segment_a, segment_b, labels) -> (x, y): pack and mask a batch of instances."""
        segment_a, segment_b, labels = instances
        token_ids, segment_ids, padding_mask = self.packer((segment_a, segment_b))
        x, mask_ids, mask_weights = self._mask(token_ids, segment_ids, padding_mask, seed=seed)
        return x, {"mask_ids": mask_ids, "mask_weights": mask_weights,
                   "pair_labels": tf.cast(labels, tf.int32)}

    def _batches_of(self, input_batches):
        return None  # as many pairs as the documents' sentences make

    def prepare(self, ds, training=True, batch_size=None):
        ds = self._batched_strings(ds)
        pairs = self._seeded_map(ds, self.instances, salt=2).unbatch()
        pairs = self._batched_instances(pairs, training)
        return self._grouped(self._seeded_map(pairs, self, salt=1, last=True),
                             training).prefetch(AUTOTUNE)

    def get_config(self):
        return dict(super().get_config(), short_seq_prob=self.short_seq_prob,
                    shuffle_buffer=self.shuffle_buffer,
                    pairer=keras.saving.serialize_keras_object(self.pairer))
