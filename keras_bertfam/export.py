"""SavedModel export for TF Serving, with string-in signatures, and an audit of the ops it uses.

```python
kb.export.export_saved_model(task, "out/my_model/1")   # versioned dir, as TF Serving expects
kb.export.audit_ops("out/my_model/1", tf_text="2.12.1")  # raises if an op would not load
```

Signatures:
- `serving_default`: raw `tf.string` [B] per segment (`text`; `text_a`, `text_b` for the pair
  pretrainers; `question`, `context`; `prompt` and `choices` [B, C] for multiple choice) ->
  the task's named outputs (`Task.serving_outputs`): logits / probabilities / labels for the
  classifiers; for QA the answer as `answer_text` and `answer_start` / `answer_end` in Unicode
  characters of the original context (as HF's offsets and `QuestionAnswerer.answer`; long
  contexts are read in strided windows), plus the token span and the SQuAD v2 `null_score`
  (`handle_impossible_answer=True`: the empty answer where it wins, as `answer()`); MLM top-k
  at the input's [MASK] tokens for MaskedLM, BERT / ALBERT (+ NSP / SOP probabilities), SpanBERT
  (+ SBO top-k), XLNet (`<mask>`, with `perm_mask` / `target_mapping` as HF's
  `XLNetLMHeadModel`) and a Distiller (its student); ELECTRA's per-token
  `replaced_probabilities` and its generator's top-k; `sequence_output` / `pooled_output` for a
  backbone. Each task's docstring says what it returns.
- `token_ids`: the same outputs from packed int32 `token_ids`, `segment_ids`, `padding_mask`
  ([B, T], or [B, C, T] for multiple choice), except those that need the strings (QA's
  `answer_*`); QA's `null_score` is then each row's (window's), the minimum of which over an
  example's windows is the string signature's.

Both check their inputs in the graph: a malformed request (a scalar or a matrix where a batch of
strings is expected, segments of different counts, no choices, rank-1 or zero-length token ids,
ids out of range) fails with an InvalidArgumentError naming the input and what was expected; an
empty batch gives outputs with no row. Invalid UTF-8 is read as U+FFFD (one a sequence), as
WordPiece and SentencePiece tokenizers read it in `predict`, and QA's `answer()`.

Tokenization (keras-hub WordPiece: `NormalizeUTF8`, `RegexSplitWithOffsets`,
`FastWordpieceTokenizeWithOffsets`) and `SegmentPacker` (round-robin in core TF) keep the graph
inside core TensorFlow + the 35 ops of tf-text 2.12.1, the set stock TF Serving 2.12-2.19 links.

Backends: export traces the model with TensorFlow, so it needs `KERAS_BACKEND=tensorflow`. A model
trained under JAX or PyTorch is exported by saving it (`task.save_to_preset(dir)`: backend-neutral
weights) and running `keras-bertfam export --task dir --output out/1`, which loads it under
TensorFlow. (Rebuilding the model under another backend inside one process is not possible: Keras
fixes its backend at import.)
"""
import functools
import os
import shutil
import subprocess
import sys
import tempfile

import keras

from keras_bertfam import atomic

_REGISTRY = os.path.join(os.path.dirname(__file__), "serving_registry")


def _read_list(name):
    with open(os.path.join(_REGISTRY, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


def _read_core_registry(version):
    """`{op type: frozenset(attr names)}` of a TensorFlow release's core registry (shipped)."""
    ops = {}
    for line in _read_list(f"tf-{version}-core-ops.txt"):
        op, _, attrs = line.partition(" ")
        ops[op] = frozenset(a for a in attrs.strip().split(",") if a)
    return ops


# The op types tf-text registers, by release (TF Serving links tf-text 2.12.1 in 2.12-2.19 and
# 2.20.0 from 2.20 on; 2.20 and 2.21 register the same 38), read from the lists shipped in
# keras_bertfam/serving_registry/.
TF_TEXT_2_12_OPS = frozenset(_read_list("tf-text-2.12.1-ops.txt"))
TF_TEXT_2_20_OPS = frozenset(_read_list("tf-text-2.21.1-ops.txt"))
TF_TEXT_OPS = {"2.12": TF_TEXT_2_12_OPS, "2.20": TF_TEXT_2_20_OPS, "2.21": TF_TEXT_2_20_OPS}
# The core TensorFlow registries shipped (op types and their attr names). A server's core is at
# least the TensorFlow its tf-text was built for: tf-text 2.12.x -> TF 2.12.1.
CORE_REGISTRIES = ("2.12.1",)
_TF_FOR_TF_TEXT = {"2.12": "2.12.1"}


@functools.lru_cache(maxsize=None)
def core_registry(version):
    """`{op type: frozenset(attr names)}` of TensorFlow `version`'s core ops (shipped lists)."""
    if version not in CORE_REGISTRIES:
        raise ValueError(f"No core op list for TensorFlow {version!r}; shipped: "
                         f"{', '.join(CORE_REGISTRIES)} (or tensorflow=None: the running one).")
    return _read_core_registry(version)


def tf_text_ops(release):
    """The op set of a tf-text release ("2.12.1", "2.20"; by major.minor), or None for one the
    audit does not know."""
    return TF_TEXT_OPS.get(".".join(str(release).split(".")[:2]))


class UnsupportedOpsError(ValueError):
    """The SavedModel uses ops the target TF Serving does not register."""


def _require_tensorflow():
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "SavedModel export traces the model with TensorFlow and needs KERAS_BACKEND=tensorflow "
            f"(the backend is {keras.backend.backend()!r}). Save the model with "
            "save_to_preset(dir) and run `keras-bertfam export --task dir --output out/1`, which "
            "loads it under TensorFlow."
        )


# === Export ===
def export_saved_model(model, export_dir, include_preprocessing=True, sequence_length=None,
                       tokenizer=None, preprocessor=None, target_tensorflow="2.12.1",
                       dynamic_padding=True, handle_impossible_answer=None,
                       null_score_diff_threshold=None):
    """Writes a SavedModel of a task or backbone to `export_dir` (use a versioned `.../1`).

    Args:
        model: a `kb.tasks.Task` or a backbone.
        export_dir: output directory (must not exist or be empty).
        include_preprocessing: `serving_default` takes raw strings (tokenizer + packer inside the
            graph). False: `serving_default` takes packed token ids (as the `token_ids` signature).
        sequence_length: packed length of the string signature; defaults to the preprocessor's,
            else the backbone's `max_sequence_length`.
        tokenizer: defaults to the task's `preprocessor.tokenizer`; needed for strings and for
            tasks that read special tokens (MLM: [MASK]).
        preprocessor: where to take the tokenizer and packing from (default: the task's own;
            useful to export a bare backbone with its task's preprocessing).
        dynamic_padding: True (default): the string signature pads each request to its longest
            text (at most `sequence_length`), so per-position outputs have that many positions
            (the first ones of the fixed-length result; XLNet, padded on the left, keeps the last
            ones). 2.6x the batch-32 throughput of False on Rotten Tomatoes sentences
            (`bench/bench_serving.py`). False: always `sequence_length` positions.
        target_tensorflow: the oldest TensorFlow the SavedModel must load in (a shipped registry,
            "2.12.1": TF Serving 2.12-2.19): node attrs that release does not define are removed
            where they hold their default (`strip_unknown_attrs`), so the export passes
            `audit_ops` strictly. None: written as the running TensorFlow writes it.
        handle_impossible_answer, null_score_diff_threshold: a `QuestionAnswerer`'s string
            signature answers as `answer()` with these options (default False and 0.0): with
            `handle_impossible_answer=True`, `answer_text` "" and `answer_start` =
            `answer_end` = -1 where the example's `null_score` (also an output) beats its best
            span's score by more than the threshold. Other models take neither.

    Returns: the signature names.
    """
    _require_tensorflow()
    import tensorflow as tf

    from keras_bertfam.preprocessing.packing import SegmentPacker

    if not isinstance(export_dir, (str, os.PathLike)) or not os.fspath(export_dir):
        raise ValueError(f"export_dir={export_dir!r}: expected a directory path (a new or empty "
                         "version directory, e.g. 'serving/my_model/1').")
    export_dir = os.fspath(export_dir)
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise FileExistsError(f"{export_dir!r} is a file; export into a new version directory.")
    if os.path.isdir(export_dir) and os.listdir(export_dir):
        raise FileExistsError(f"{export_dir!r} is not empty; export into a new version directory.")
    parent = os.path.dirname(os.path.abspath(export_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"export_dir={export_dir!r}: {parent!r} is a file, not a "
                                 "directory; export under a directory.")
    from keras_bertfam.models.backbone import Backbone
    from keras_bertfam.tasks.task import Task

    if not isinstance(model, (Task, Backbone)):
        raise TypeError(f"export_saved_model exports a kb.tasks task or a kb.models backbone; "
                        f"got {type(model).__name__} {model!r:.80}.")
    for name, flag in (("include_preprocessing", include_preprocessing),
                       ("dynamic_padding", dynamic_padding)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r}: expected True or False.")
    import numpy as np

    if sequence_length is not None and (isinstance(sequence_length, bool) or not isinstance(
            sequence_length, (int, np.integer)) or sequence_length <= 0):
        raise ValueError(f"sequence_length={sequence_length!r}: expected a positive integer (the "
                         "packed length of the string signature), or None for the default.")
    student = getattr(model, "student", None)
    if isinstance(student, keras.Model) and hasattr(student, "serving_outputs"):
        # A Distiller's product is its student (a MaskedLM): serve that, not the teacher.
        preprocessor = preprocessor or getattr(model, "preprocessor", None)
        model = student
    preprocessor = preprocessor or getattr(model, "preprocessor", None)
    tokenizer = tokenizer or getattr(preprocessor, "tokenizer", None)
    backbone = getattr(model, "backbone", model)
    is_task = model is not backbone
    # a task's options for its string signature (QA's "no answer"), checked by the task
    string_options = {k: v for k, v in (("handle_impossible_answer", handle_impossible_answer),
                                        ("null_score_diff_threshold", null_score_diff_threshold))
                      if v is not None}
    if string_options and not is_task:
        raise ValueError(f"A backbone's export takes no {', '.join(string_options)} (an option "
                         "of a QuestionAnswerer's string signature).")
    string_options = model.serving_options(**string_options) if is_task else {}
    if handle_impossible_answer and not include_preprocessing:
        raise ValueError("handle_impossible_answer=True sets the string signature's answers; "
                         "with include_preprocessing=False there is none (the token_ids "
                         "signature scores packed windows).")
    if include_preprocessing and tokenizer is None:
        raise ValueError(
            "A string signature needs a tokenizer: attach a preprocessor (from_preset does) or "
            "pass tokenizer=, or export with include_preprocessing=False."
        )
    # the check a task makes of its preprocessor's tokenizer when built, for a tokenizer= given
    from keras_bertfam.tasks.task import _backbones, check_tokenizer_fits

    check_tokenizer_fits(tokenizer, (_backbones(model) if is_task else None) or [backbone],
                         served=True)
    # XLNet's relative positions have no maximum length
    max_length = getattr(backbone, "max_sequence_length", None)
    sequence_length = sequence_length or getattr(preprocessor, "sequence_length", None) or max_length
    if sequence_length is None:
        raise ValueError("Pass sequence_length= (the packed length of the string signature).")
    sequence_length = int(sequence_length)
    if max_length is not None and sequence_length > max_length:
        raise ValueError(f"sequence_length={sequence_length} exceeds the backbone's "
                         f"max_sequence_length={max_length}.")
    special = {r: getattr(tokenizer, f"{r}_token_id", None) for r in ("cls", "sep", "pad", "mask")}
    # A task's own inputs (a Longformer task derives global_attention_mask in its graph)
    feature_names = [n for n in backbone.input if not is_task or n in model.input]
    choices = is_task and len(model.input["token_ids"].shape) == 3
    text_inputs = model.serving_inputs if is_task else ("text",)

    def run(features):
        # raw strings (for tasks that read their inputs' text, e.g. QA answers) stay strings
        features = {k: v if v.dtype == tf.string else tf.cast(v, tf.int32)
                    for k, v in features.items()}
        if not is_task:
            out = dict(backbone(features, training=False))
            out["padding_mask"] = features["padding_mask"]
            return out
        inputs = model.serving_features(features, special)
        return model.serving_outputs(inputs, model.serving_call(inputs))

    def outputs_of(features):
        return _on_at_least_one_row(features, run)

    ids_shape = [None, None, None] if choices else [None, None]
    ids_spec = {n: tf.TensorSpec(ids_shape, tf.int32, name=n) for n in feature_names}
    # Both signatures without AutoGraph: their code (and the tasks' serving_* methods, tokenizers
    # and layers they call) is plain TF / keras.ops, with no Python control flow on tensors, as
    # the library's other tf.functions (autograph=False). AutoGraph converted every function
    # they reach, once per process: test_export spent ~10 s of CPU in it (828 conversions).
    serve_ids = tf.function(
        lambda features: outputs_of(_checked_ids(features, backbone, len(ids_shape))),
        input_signature=[ids_spec], autograph=False)

    module = tf.Module()
    module.model_variables = [getattr(v, "value", v) for v in model.variables]
    # The tf.functions themselves (token_ids and the string signature), not concrete functions
    # traced here: saving traces the functions it tracks again under its save context, so a
    # concrete function from outside would be a second copy of the token_ids graph (twice the
    # tracing, and twice the graph in the SavedModel). Traced under the save context, the string
    # signature's call to serve_ids is that same traced token_ids function: the model's graph is
    # traced and saved once (QA's answers, which read the strings, trace it themselves).
    signatures = {"token_ids": serve_ids}
    if include_preprocessing:
        base = getattr(preprocessor, "packer", None)
        config = base.get_config() if isinstance(base, SegmentPacker) else dict(
            start_value=special["cls"], end_value=special["sep"], pad_value=special["pad"])
        config = {k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")}
        config.update(sequence_length=sequence_length, return_dict=False)
        packer = SegmentPacker(**config)

        side = getattr(model, "serving_padding_side", "right") if is_task else "right"

        def pack(segments):
            custom = model.serving_pack(segments, sequence_length, special) if is_task else None
            if custom is not None:
                features = {k: tf.cast(custom[k], tf.int32) for k in feature_names}
            else:
                token_ids, segment_ids, padding_mask = packer(tuple(segments))
                features = {"token_ids": token_ids, "segment_ids": segment_ids,
                            "padding_mask": tf.cast(padding_mask, tf.int32)}
                # A bare Longformer backbone: no global attention (zeros)
                features = {k: tf.cast(features.get(k, tf.zeros_like(token_ids)), tf.int32)
                            for k in feature_names}
            return trim_padding(features, side) if dynamic_padding else features

        # a literal "[MASK]" is the mask id for a fill-mask task only: elsewhere text, as in
        # the task's preprocessor (served outputs equal `predict`'s)
        reads_masks = is_task and model.serving_reads_mask_tokens
        mask_token = getattr(tokenizer, "mask_token", None) if reads_masks else None
        # a tokenizer whose training-time graph is not servable gives a stateless one (BPE)
        run_tokenizer = getattr(tokenizer, "serving_tokenize", tokenizer)

        def tokenize_text(texts):
            if mask_token is None or special["mask"] is None:
                return run_tokenizer(texts)
            return _join_at_mask_tokens(texts, mask_token, special["mask"], run_tokenizer)

        def tokenize(texts):  # as the task's preprocessor (a TokenClassifier: word by word)
            if not is_task:
                return tokenize_text(texts)
            return model.serving_tokenize(texts, tokenizer, tokenize_text)

        def serve_text(*texts):
            texts = _checked_texts(texts, text_inputs, choices)
            if is_task:
                trimmed = ((lambda f: outputs_of(trim_padding(f, side))) if dynamic_padding
                           else outputs_of)
                own = model.serving_strings(texts, tokenizer, sequence_length, trimmed,
                                            **string_options)
                if own is not None:
                    return own
            texts = [_clean_text(t, sequence_length, tokenizer) for t in texts]
            if choices:  # prompt [B], choices [B, C] -> (B, C, T)
                prompt, options = texts
                num = tf.shape(options)[1]
                repeated = tf.reshape(tf.repeat(prompt[:, None], num, axis=1), [-1])
                features = pack([tokenize(repeated), tokenize(tf.reshape(options, [-1]))])
                rows = tf.shape(prompt)[0]  # (not -1: no choices would make it 1)
                features = {k: tf.reshape(v, [rows, num, tf.shape(v)[-1]])
                            for k, v in features.items()}
            else:
                features = pack([tokenize(t) for t in texts])
            # the token_ids function (its checks hold for packed features): one model graph
            return serve_ids(features)

        specs = [tf.TensorSpec([None, None] if (choices and n == "choices") else [None],
                               tf.string, name=n) for n in text_inputs]
        signatures["serving_default"] = tf.function(serve_text, input_signature=specs,
                                                    autograph=False)
        vocab, scratch = _vocabulary_file(tokenizer)
        if vocab is not None:
            module.vocabulary = tf.saved_model.Asset(vocab)
        # Resources the tokenizer's graph reads (SentencePiece's model, BPE's tables): the
        # SavedModel must track them, or saving fails with "references an 'untracked' resource".
        if hasattr(tokenizer, "serving_resources"):
            module.tokenizer_resources = list(tokenizer.serving_resources())
    else:
        signatures["serving_default"] = signatures["token_ids"]
        scratch = None
    module.serve_token_ids = serve_ids
    try:
        tf.saved_model.save(module, export_dir, signatures=signatures)
    finally:
        if scratch is not None:  # the vocabulary is in the export's assets/ now
            shutil.rmtree(scratch, ignore_errors=True)
    if target_tensorflow is not None:
        strip_unknown_attrs(export_dir, target_tensorflow)
    return sorted(signatures)


# Characters kept per position of a text before tokenizing: sequence_length tokens never need
# more unless the text is mostly characters that tokenize to nothing (below; a WordPiece word
# over 100 characters is one [UNK], so a text of such words is cut after half its positions).
CHARACTERS_PER_POSITION = 50
# For a tokenizer that normalizes them away (WordPiece, SentencePiece), whitespace, control and
# format characters (zero-width), combining marks and U+FFFD count 1/SILENT_PER_CHARACTER of a
# character towards the cut: a text of 800 spaces (or zero-width characters, or a combining
# accent repeated) before its words at sequence_length=16 is served as `predict` reads it, not as
# empty (up to SILENT_PER_CHARACTER * 800 such characters, then the cut), and a text of nothing
# else keeps SILENT_PER_CHARACTER times the characters: still a bound on the work. Measured
# (2 shared cores; the cut and WordPiece, a batch of 32, sequence_length=512): 1 MB texts of
# words 0.86 s (0.28 s with every character counted), 1 MB of spaces 2.1 s (0.63 s); 1 KB
# reviews, which are never cut, skip the count (5 ms, as before). Byte-level BPE reads every
# character (a space is a token): no such weight.
SILENT_PER_CHARACTER = 4
_SILENT = r"[\s\p{Z}\p{Cc}\p{Cf}\p{Mn}\p{Me}\x{FFFD}]"


def _clean_text(texts, sequence_length, tokenizer=None):
    """Invalid UTF-8 bytes become U+FFFD (which BERT's normalization drops, as HF's), and each
    text is cut to `CHARACTERS_PER_POSITION * sequence_length` characters before tokenizing, so a
    1 MB request costs what a long review costs; for a WordPiece or SentencePiece `tokenizer`,
    characters it reads as nothing count `1 / SILENT_PER_CHARACTER` (at most
    `SILENT_PER_CHARACTER` times as many characters kept). The bytes are cut first (4 per
    character, UTF-8's most): a character split there lies past the characters kept."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.tokenizers import valid_utf8

    characters = CHARACTERS_PER_POSITION * sequence_length
    weighted = getattr(tokenizer, "kind", None) in ("wordpiece", "sentencepiece")
    most = characters * (SILENT_PER_CHARACTER if weighted else 1)
    texts = valid_utf8(tf.strings.substr(texts, 0, 4 * most))
    texts = tf.strings.substr(texts, 0, most, unit="UTF8_CHAR")
    if not weighted:
        return texts
    shape, texts = tf.shape(texts), tf.reshape(texts, [-1])  # (multiple choice's [B, C])
    # only texts longer than `characters` can be cut (the others, most, skip the count)
    long = tf.where(tf.strings.length(texts, unit="UTF8_CHAR") > characters)[:, 0]
    cut = _weighted_cut(tf.gather(texts, long), characters)
    texts = tf.tensor_scatter_nd_update(texts, long[:, None], cut)
    return tf.reshape(texts, shape)


def _weighted_cut(texts, characters):
    """`_clean_text`'s cut of texts [B] (valid UTF-8) where silent characters weigh less."""
    import tensorflow as tf

    # each silent character one byte, 0x01; a character starts at any other byte but UTF-8's
    # continuation bytes, and weighs SILENT_PER_CHARACTER (a silent one: 1)
    marks = tf.strings.regex_replace(texts, _SILENT, "\x01")
    data = tf.cast(tf.io.decode_raw(tf.strings.reduce_join(marks), tf.uint8), tf.int32)  # [N]
    starts = (data < 0x80) | (data >= 0xC0)
    weight = tf.where(tf.equal(data, 1), 1, tf.where(starts, SILENT_PER_CHARACTER, 0))
    lengths = tf.strings.length(marks)  # [B] bytes
    row = tf.repeat(tf.range(tf.size(lengths)), lengths)  # [N] the text of each byte
    total = tf.cumsum(tf.cast(weight, tf.int64))
    first = tf.cumsum(lengths, exclusive=True)  # [B] each text's first byte
    spent = total - tf.gather(tf.concat([[0], total], 0), tf.gather(first, row))
    kept = tf.math.unsorted_segment_sum(  # [B] characters
        tf.cast(starts & (spent <= characters * SILENT_PER_CHARACTER), tf.int32), row,
        tf.size(lengths))
    return tf.strings.substr(texts, tf.zeros_like(kept), kept, unit="UTF8_CHAR")


def _checked_texts(texts, names, choices):
    """The string signature's inputs, checked in the graph before anything reads them: each a
    vector of strings [B] (`choices` [B, C]: C >= 1 choices unless B = 0), all with the same B.
    A violation fails the request with an InvalidArgumentError naming the input and what was
    expected (they met TensorFlow's errors inside the tokenizer and packer)."""
    import tensorflow as tf

    ranks = [2 if choices and name == "choices" else 1 for name in names]
    shapes = [_assert_rank(text, rank, f"string signature: {name} must be " + (
        "a matrix of strings [batch, choices]" if rank == 2 else "a vector of strings [batch]"))
              for text, rank, name in zip(texts, ranks, names)]
    checks = list(shapes)
    with tf.control_dependencies(shapes):  # the shapes are read once they hold
        counts = [tf.shape(text)[0] for text in texts]
        what = "rows" if choices else "strings"
        for name, count in zip(names[1:], counts[1:]):
            checks.append(tf.debugging.Assert(tf.equal(count, counts[0]), [
                f"string signature: {names[0]} and {name} must have the same number of {what}; "
                "got", counts[0], "and", count], name=f"check_{name}_count"))
        if choices:
            shape = tf.shape(texts[list(names).index("choices")])
            checks.append(tf.debugging.Assert((shape[0] == 0) | (shape[1] > 0), [
                "string signature: choices must hold at least one choice per prompt (a [batch, "
                "choices] matrix of strings); got shape", shape], name="check_choices"))
    with tf.control_dependencies(checks):
        return [tf.identity(text) for text in texts]


def _assert_rank(value, rank, message):
    """An in-graph check that `value` has `rank` axes (`message`, then its shape, if not).
    Neither `tf.debugging.assert_rank` nor `tf.rank`: both read the rank the signature declares,
    which a request need not have (a loaded signature and TF Serving pass a scalar on to the
    graph), and are folded to constants. The shape read at run time, padded with -1s, tells."""
    import tensorflow as tf

    shape = tf.shape(value)
    padded = tf.concat([shape, tf.fill([rank + 1], -1)], 0)
    ok = tf.reduce_all(padded[:rank] >= 0) & tf.equal(padded[rank], -1)
    return tf.debugging.Assert(ok, [f"{message}; got shape", shape], name="check_rank")


def _on_at_least_one_row(features, run):
    """`run(features)` (the model and its serving outputs) for a batch of any size: an empty
    batch gives outputs with no row, as every model's from a batch of one row of padding
    (zeros) less that row, so no output meets an empty axis (multiple choice's labels, an
    argmax, on no choice). The leading axes of the features but their positions (the batch; multiple
    choice's choices) that are empty get one row, and the outputs lose it again."""
    import tensorflow as tf

    ids = features["token_ids"]
    lead = ids.shape.rank - 1
    sizes = tf.shape(ids)[:-1]
    extra = tf.cast(tf.equal(sizes, 0), tf.int32)  # [lead]
    padded = {}
    for key, value in features.items():
        paddings = tf.concat([tf.stack([tf.zeros_like(extra), extra], 1),
                              tf.zeros([value.shape.rank - lead, 2], tf.int32)], 0)
        padded[key] = tf.pad(value, paddings,
                             constant_values="" if value.dtype == tf.string else 0)
    return {k: v[tuple(slice(0, sizes[i]) for i in range(min(lead, v.shape.rank)))]
            for k, v in run(padded).items()}


def _join_at_mask_tokens(texts, mask_token, mask_id, tokenize):
    """`tokenize(texts)` where a literal mask token in a text ("[MASK]") becomes `mask_id`, as in
    HF's tokenizers: each text split on the mask token, its pieces tokenized, the id put back
    between them. Flat values and row splits (`preprocessing.ragged`)."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.ragged import merge_rows, rows_and_index

    pieces = tf.strings.split(texts, sep=mask_token)  # [B, (P)]
    tokens = tokenize(pieces.flat_values)  # [N, (W)]
    row, index = rows_and_index(pieces.row_splits)
    followed = tf.cast(index < tf.gather(pieces.row_splits, row + 1) - 1, tf.int64)  # not last
    marks = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(followed)], tf.cast(mask_id, tokens.dtype)), followed,
        validate=False)  # [N, (0 or 1)]
    joined = tf.concat([tokens, marks], axis=1)  # [N, (W + 0/1)]
    return merge_rows(tf.RaggedTensor.from_row_splits(joined, pieces.row_splits, validate=False))


def trim_padding(features, side="right"):
    """Packed features of a batch -> the same, cut to the batch's longest row (its most real
    positions by `padding_mask`): every non-string feature of rank >= 2 loses its last axis'
    all-padding columns, at the end (`side="right"`) or at the start ("left": XLNet)."""
    import tensorflow as tf

    mask = features["padding_mask"]
    full = tf.shape(mask)[-1]
    longest = tf.reduce_max(tf.reduce_sum(tf.reshape(mask, [-1, full]), axis=-1))
    length = tf.clip_by_value(longest, 1, full)  # an empty batch keeps one position
    begin = full - length if side == "left" else 0
    out = {}
    for key, value in features.items():
        if value.dtype == tf.string or value.shape.rank < 2:
            out[key] = value
        else:
            out[key] = value[..., begin:begin + length]
    return out


def _checked_ids(features, backbone, rank=2):
    """The `token_ids` signature's inputs, checked in the graph: `rank` axes ([B, T], or
    [B, C, T] for multiple choice) and at least one position, the same shape for every
    feature, ids in [0, vocabulary_size), segment ids in [0, num_segments), a 0/1 padding mask,
    and no more positions than the backbone's `max_sequence_length`. A violation fails the
    request with an InvalidArgumentError naming the feature, the bound and the offending value.
    (A Longformer's global tokens a row are checked in its own graph, for every signature and
    for the global attention a task derives: `kb.models.longformer.check_global_tokens`.)"""
    import tensorflow as tf

    ids = features["token_ids"]
    layout = "a [batch, length] int32 matrix" if rank == 2 else (
        "a [batch, choices, length] int32 tensor")
    first = _assert_rank(ids, rank, f"token_ids signature: token_ids must be {layout}")
    with tf.control_dependencies([first]):  # what follows reads the axes
        checks = [first, tf.debugging.Assert(tf.shape(ids)[-1] > 0, [
            "token_ids signature: token_ids must have at least one position; got shape",
            tf.shape(ids)], name="check_positions")]
        checks += [_assert_rank(value, rank, f"token_ids signature: {name} must be {layout}")
                   for name, value in features.items() if name != "token_ids"]
        if rank == 3:
            shape = tf.shape(ids)
            checks.append(tf.debugging.Assert((shape[0] == 0) | (shape[1] > 0), [
                "token_ids signature: token_ids must hold at least one choice per example; got "
                "shape", shape], name="check_choices"))
    with tf.control_dependencies(checks):  # the values, once the shapes hold
        return _checked_values(features, backbone)


def _checked_values(features, backbone):
    """`_checked_ids`' checks of the values."""
    import tensorflow as tf

    ids = features["token_ids"]
    checks = []
    for name, value in features.items():
        checks.append(tf.debugging.assert_equal(
            tf.shape(value), tf.shape(ids),
            message=f"token_ids signature: {name} must have the shape of token_ids"))
    vocabulary_size = getattr(backbone, "vocabulary_size", None)

    def in_range(name, low, high):
        value = features[name]
        none = tf.equal(tf.size(value), 0)
        low_value = tf.reduce_min(value)
        high_value = tf.reduce_max(value)
        ok = none | ((low_value >= low) & (high_value < high))
        checks.append(tf.debugging.Assert(ok, [
            f"token_ids signature: {name} must be in [{low}, {high}); got values from",
            low_value, "to", high_value], name=f"check_{name}"))

    if vocabulary_size:
        in_range("token_ids", 0, int(vocabulary_size))
    num_segments = getattr(backbone, "segment_id_count", getattr(backbone, "num_segments", None))
    if "segment_ids" in features and num_segments:
        in_range("segment_ids", 0, int(num_segments))
    if "padding_mask" in features:
        in_range("padding_mask", 0, 2)
    if "global_attention_mask" in features:  # Longformer: the backbone's graph checks that a
        in_range("global_attention_mask", 0, 2)  # row's global tokens fit max_global_tokens
    max_length = getattr(backbone, "max_sequence_length", None)
    if max_length:
        length = tf.shape(ids)[-1]
        checks.append(tf.debugging.Assert(length <= int(max_length), [
            f"token_ids signature: at most {int(max_length)} positions (the backbone's "
            "max_sequence_length); got", length], name="check_length"))
    with tf.control_dependencies(checks):
        return {k: tf.identity(v) for k, v in features.items()}


def _vocabulary_file(tokenizer):
    """The tokenizer's vocabulary file (copied into the export's assets/), written to a new
    temporary dir unless it is a file already. -> (path or None, the dir written or None)."""
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if isinstance(vocabulary, str) and os.path.exists(vocabulary):
        return vocabulary, None
    if hasattr(tokenizer, "get_vocabulary"):
        folder = tempfile.mkdtemp(prefix="kb_export_")
        path = os.path.join(folder, "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(tokenizer.get_vocabulary()) + "\n")
        return path, folder
    return None, None


# === Op audit ===
def list_ops(export_dir):
    """Every op type in the SavedModel: nodes of each meta graph and of every library function.

    Returns `{op_type: sorted names of the graphs / functions using it}`.
    """
    proto = _read_saved_model(export_dir)
    used = {}
    for meta in proto.meta_graphs:
        graph = meta.graph_def
        functions = {fn.signature.name for fn in graph.library.function}
        for node in graph.node:
            used.setdefault(node.op, set()).add("<graph>")
        for fn in graph.library.function:
            for node in fn.node_def:
                used.setdefault(node.op, set()).add(fn.signature.name)
        for name in functions:  # calls to library functions are not ops
            used.pop(name, None)
        for grad in graph.library.gradient:
            used.pop(grad.gradient_func, None)
    return {op: sorted(where) for op, where in sorted(used.items())}


_CORE_OPS = None


def core_tensorflow_ops():
    """Op types TensorFlow itself registers, read in a fresh process that loads no tf-text."""
    global _CORE_OPS
    if _CORE_OPS is None:
        code = (
            # Keras (imported by TensorFlow) imports scikit-learn, pandas and matplotlib when
            # installed, and TensorFlow JAX (tf.lite), each guarded: none registers an op, and
            # leaving them out starts the probe ~2 s of CPU sooner (the same 1,910 ops on 2.21)
            "import sys\n"
            "sys.modules.update(dict.fromkeys(('sklearn', 'pandas', 'matplotlib', 'jax')))\n"
            "from tensorflow.python.client import pywrap_tf_session as c\n"
            "from tensorflow.core.framework import op_def_pb2\n"
            "ops = op_def_pb2.OpList()\n"
            "ops.ParseFromString(c.TF_GetBuffer(c.TF_GetAllOpList()))\n"
            "print('\\n'.join(sorted(o.name for o in ops.op)))\n"
        )
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=300, check=True).stdout
        _CORE_OPS = frozenset(out.split())
        if len(_CORE_OPS) < 1000:  # TF registers ~1900; fewer means the probe went wrong
            raise RuntimeError(f"Read only {len(_CORE_OPS)} core TensorFlow ops.")
    return _CORE_OPS


def _node_attrs(export_dir):
    """Yields `(op type, attr names, where)` for every node of the SavedModel."""
    proto = _read_saved_model(export_dir)
    for meta in proto.meta_graphs:
        graph = meta.graph_def
        for node in graph.node:
            yield node.op, list(node.attr), "<graph>"
        for fn in graph.library.function:
            for node in fn.node_def:
                yield node.op, list(node.attr), fn.signature.name


def _read_saved_model(export_dir):
    """The SavedModel proto of `export_dir`; an error naming the directory or file when it is
    not a SavedModel's (a missing directory or saved_model.pb, a damaged or empty file)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    if not isinstance(export_dir, (str, os.PathLike)) or not os.fspath(export_dir):
        raise TypeError(f"export_dir={export_dir!r}: expected the path of a SavedModel directory "
                        "(one holding saved_model.pb).")
    path = os.path.join(export_dir, "saved_model.pb")
    if not os.path.isfile(path):
        what = ("does not exist" if not os.path.exists(export_dir) else
                "is not a directory" if not os.path.isdir(export_dir) else
                "has no saved_model.pb")
        raise FileNotFoundError(f"{os.fspath(export_dir)!r} {what}: expected a SavedModel "
                                "directory (one holding saved_model.pb, as export_saved_model "
                                "writes).")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        data = f.read()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"{path!r} ({len(data)} bytes) is not a SavedModel proto ({e}): a "
                         "damaged or truncated file?") from None
    if not proto.meta_graphs:
        raise ValueError(f"{path!r} ({len(data)} bytes) holds no meta graph: an empty or "
                         "truncated SavedModel, not one export_saved_model wrote.")
    return proto


# Attrs newer TensorFlow writes that only name things for debugging (no effect on the kernel).
_INFORMATIONAL_ATTRS = frozenset({"debug_name"})


def strip_unknown_attrs(export_dir, tensorflow="2.12.1"):
    """Removes from every node the attrs TensorFlow `tensorflow`'s op definition lacks and that
    either hold the running TensorFlow's default value or only name things for debugging
    (`debug_name`, which TF 2.21 writes on every `VarHandleOp` and older model servers refuse:
    tensorflow/serving#1757), so a server of that release reads the graph as written. Attrs starting with "_" are TensorFlow's own annotations
    (not checked against op definitions) and stay. An attr the target lacks whose value is not
    the default changes the op's meaning and is kept (the audit reports it).

    Returns: `{op type: sorted attr names removed}`.
    """
    from tensorflow.python.framework import op_def_registry

    if tensorflow is None:
        raise ValueError("strip_unknown_attrs(tensorflow=None): expected the target release "
                         f"whose op definitions to keep ({', '.join(CORE_REGISTRIES)}); the "
                         "running TensorFlow reads every attr it writes.")
    target = core_registry(tensorflow)
    proto = _read_saved_model(export_dir)
    removed = {}

    def strip(node):
        known = target.get(node.op)
        if known is None:
            return
        op_def = op_def_registry.get(node.op)
        defaults = {a.name: a.default_value for a in op_def.attr
                    if a.HasField("default_value")} if op_def is not None else {}
        for name in list(node.attr):
            if name.startswith("_") or name in known:
                continue
            if name in _INFORMATIONAL_ATTRS or (
                    name in defaults and node.attr[name] == defaults[name]):
                del node.attr[name]
                removed.setdefault(node.op, set()).add(name)

    for meta in proto.meta_graphs:
        for node in meta.graph_def.node:
            strip(node)
        for fn in meta.graph_def.library.function:
            for node in fn.node_def:
                strip(node)
    if removed:  # written beside it, then renamed over it: a failed write loses nothing
        atomic.write_file(os.path.join(export_dir, "saved_model.pb"),
                          lambda f: f.write(proto.SerializeToString()), mode="wb")
    return {op: sorted(names) for op, names in sorted(removed.items())}


def audit_ops(export_dir, tf_text="2.12.1", tensorflow="auto", raise_on_error=True):
    """Checks the SavedModel against the target server's op registry: every op type must be a
    core op of the target TensorFlow or an op of the target tf-text, and every attr of a core op
    must be one the target's op definition has (an unknown attr is refused by older servers and
    ignored, with a log line, by 2.12.1; attrs starting with "_" are annotations, not checked).

    Args:
        tf_text: the tf-text release the server links ("2.12.1": TF Serving 2.12-2.19; "2.20.0":
            2.20 on), or None for core TensorFlow only.
        tensorflow: the target's core TensorFlow: a shipped registry ("2.12.1"), None for the
            TensorFlow running the audit, or "auto": 2.12.1 for tf-text 2.12.x (what TF Serving
            2.12 links), else the running one.
    Returns: `{"ops": {op: "core" | "tf-text" | "UNSUPPORTED"}, "unsupported": {op: functions},
        "unknown_attrs": {op: attr names}, "tensorflow": the core registry checked}`.
    Raises: `UnsupportedOpsError` naming each op or attr outside the target and where it is used.
    """
    allowed_text = frozenset()
    if tf_text is not None:
        allowed_text = tf_text_ops(tf_text)
        if allowed_text is None:
            raise ValueError(f"Unknown tf-text release {tf_text!r}; known: 2.12.x, 2.20.x, 2.21.x.")
    if tensorflow == "auto":
        tensorflow = _TF_FOR_TF_TEXT.get(".".join(str(tf_text).split(".")[:2])) if tf_text else None
    if tensorflow is None:
        core = dict.fromkeys(core_tensorflow_ops())  # attrs not checked: the running TF's own
        target_name = "the running TensorFlow"
    else:
        core = core_registry(tensorflow)
        target_name = f"TensorFlow {tensorflow}"
    used = list_ops(export_dir)
    kinds, unsupported, unknown_attrs = {}, {}, {}
    for op, where in used.items():
        if op in core:
            kinds[op] = "core"
        elif op in allowed_text:
            kinds[op] = "tf-text"
        else:
            kinds[op] = "UNSUPPORTED"
            unsupported[op] = where
    if tensorflow is not None:
        attr_where = {}
        for op, attrs, where in _node_attrs(export_dir):
            known = core.get(op)
            if known is None:
                continue
            for name in attrs:
                if not name.startswith("_") and name not in known:
                    unknown_attrs.setdefault(op, set()).add(name)
                    attr_where.setdefault(op, set()).add(where)
        unknown_attrs = {op: sorted(names) for op, names in sorted(unknown_attrs.items())}
    if (unsupported or unknown_attrs) and raise_on_error:
        lines = [f"  {op} (in {', '.join(w[:3])})" for op, w in unsupported.items()]
        lines += [f"  {op} attr(s) {', '.join(names)} (in {', '.join(sorted(attr_where[op])[:3])})"
                  for op, names in unknown_attrs.items()]
        raise UnsupportedOpsError(
            f"{export_dir} uses {len(unsupported)} op(s) outside {target_name} core + tf-text "
            f"{tf_text} (a server with that registry fails with 'Op type not registered') and "
            f"{len(unknown_attrs)} op(s) with attrs that registry does not define (older servers "
            "refuse them; kb.export.strip_unknown_attrs removes those at their default):\n"
            + "\n".join(lines)
        )
    return {"ops": kinds, "unsupported": unsupported, "unknown_attrs": unknown_attrs,
            "tensorflow": tensorflow}
