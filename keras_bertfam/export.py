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
  contexts are read in strided windows), plus the token span; MLM top-k at the input's [MASK]
  tokens for MaskedLM, BERT / ALBERT (+ NSP / SOP probabilities), SpanBERT (+ SBO top-k), XLNet
  (`<mask>`, with `perm_mask` / `target_mapping` as HF's `XLNetLMHeadModel`) and a Distiller
  (its student); ELECTRA's per-token `replaced_probabilities` and its generator's top-k;
  `sequence_output` / `pooled_output` for a backbone. Each task's docstring says what it returns.
- `token_ids`: the same outputs from packed int32 `token_ids`, `segment_ids`, `padding_mask`
  ([B, T], or [B, C, T] for multiple choice), except those that need the strings (QA's
  `answer_*`).

Tokenization (keras-hub WordPiece: `NormalizeUTF8`, `RegexSplitWithOffsets`,
`FastWordpieceTokenizeWithOffsets`) and `SegmentPacker` (round-robin in core TF) keep the graph
inside core TensorFlow + the 35 ops of tf-text 2.12.1, the set stock TF Serving 2.12-2.19 links.

Backends: export traces the model with TensorFlow, so it needs `KERAS_BACKEND=tensorflow`. A model
trained under JAX or PyTorch is exported by saving it (`task.save_to_preset(dir)`: backend-neutral
weights) and running `keras-bertfam export --task dir --output out/1`, which loads it under
TensorFlow. (Rebuilding the model under another backend inside one process is not possible: Keras
fixes its backend at import.)
"""
import os
import subprocess
import sys
import tempfile

import keras

# The op types tf-text registers, by release (TF Serving links tf-text 2.12.1 in 2.12-2.19).
TF_TEXT_2_12_OPS = frozenset("""
CaseFoldUTF8 ConstrainedSequence FastBertNormalize FastWordpieceTokenizeWithOffsets
FindSourceOffsets MaxSpanningTree NormalizeUTF8 NormalizeUTF8WithOffsetsMap PhraseTokenize
RegexSplitWithOffsets RougeL SentenceFragments SentenceFragmentsV2 SentencepieceDetokenizeOp
SentencepieceIdToStringOp SentencepieceOp SentencepieceStringToIdOp SentencepieceTokenizeOp
SentencepieceTokenizeWithOffsetsOp SentencepieceVocabSizeOp SplitMergeTokenizeWithOffsets
TFText>BoiseTagsToOffsets TFText>ByteSplitByOffsets TFText>ByteSplitWithOffsets
TFText>FastSentencepieceDetokenize TFText>FastSentencepieceTokenize TFText>FastWordpieceDetokenize
TFText>NgramsStringJoin TFText>OffsetsToBoiseTags TFText>PhraseDetokenize
TFText>WhitespaceTokenizeWithOffsetsV2 TokenizerFromLogits UnicodeScriptTokenizeWithOffsets
WhitespaceTokenizeWithOffsets WordpieceTokenizeWithOffsets
""".split())
TF_TEXT_2_20_OPS = TF_TEXT_2_12_OPS | {
    "TFText>RoundRobinGenerateMasks", "TFText>RoundRobinTrim", "TFText>Utf8Binarize"}
TF_TEXT_OPS = {"2.12": TF_TEXT_2_12_OPS, "2.20": TF_TEXT_2_20_OPS, "2.21": TF_TEXT_2_20_OPS}


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
                       tokenizer=None, preprocessor=None):
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

    Returns: the signature names.
    """
    _require_tensorflow()
    import tensorflow as tf

    from keras_bertfam.preprocessing.packing import SegmentPacker

    if os.path.isdir(export_dir) and os.listdir(export_dir):
        raise FileExistsError(f"{export_dir!r} is not empty; export into a new version directory.")
    student = getattr(model, "student", None)
    if isinstance(student, keras.Model) and hasattr(student, "serving_outputs"):
        # A Distiller's product is its student (a MaskedLM): serve that, not the teacher.
        preprocessor = preprocessor or getattr(model, "preprocessor", None)
        model = student
    preprocessor = preprocessor or getattr(model, "preprocessor", None)
    tokenizer = tokenizer or getattr(preprocessor, "tokenizer", None)
    backbone = getattr(model, "backbone", model)
    is_task = model is not backbone
    if include_preprocessing and tokenizer is None:
        raise ValueError(
            "A string signature needs a tokenizer: attach a preprocessor (from_preset does) or "
            "pass tokenizer=, or export with include_preprocessing=False."
        )
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
    if hasattr(tokenizer, "rebuild_resource"):  # SentencePiece; see its docstring
        tokenizer.rebuild_resource()
    # A task's own inputs (a Longformer task derives global_attention_mask in its graph)
    feature_names = [n for n in backbone.input if not is_task or n in model.input]
    choices = is_task and len(model.input["token_ids"].shape) == 3
    text_inputs = model.serving_inputs if is_task else ("text",)

    def outputs_of(features):
        # raw strings (for tasks that read their inputs' text, e.g. QA answers) stay strings
        features = {k: v if v.dtype == tf.string else tf.cast(v, tf.int32)
                    for k, v in features.items()}
        if not is_task:
            out = dict(backbone(features, training=False))
            out["padding_mask"] = features["padding_mask"]
            return out
        inputs = model.serving_features(features, special)
        return model.serving_outputs(inputs, model.serving_call(inputs))

    ids_shape = [None, None, None] if choices else [None, None]
    ids_spec = {n: tf.TensorSpec(ids_shape, tf.int32, name=n) for n in feature_names}
    serve_ids = tf.function(outputs_of, input_signature=[ids_spec])

    module = tf.Module()
    module.model_variables = [getattr(v, "value", v) for v in model.variables]
    signatures = {"token_ids": serve_ids.get_concrete_function()}
    if include_preprocessing:
        base = getattr(preprocessor, "packer", None)
        config = base.get_config() if isinstance(base, SegmentPacker) else dict(
            start_value=special["cls"], end_value=special["sep"], pad_value=special["pad"])
        config = {k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")}
        config.update(sequence_length=sequence_length, return_dict=False)
        packer = SegmentPacker(**config)

        def pack(segments):
            custom = model.serving_pack(segments, sequence_length, special) if is_task else None
            if custom is not None:
                return {k: tf.cast(custom[k], tf.int32) for k in feature_names}
            token_ids, segment_ids, padding_mask = packer(tuple(segments))
            features = {"token_ids": token_ids, "segment_ids": segment_ids,
                        "padding_mask": tf.cast(padding_mask, tf.int32)}
            # A bare Longformer backbone: no global attention (zeros)
            return {k: tf.cast(features.get(k, tf.zeros_like(token_ids)), tf.int32)
                    for k in feature_names}

        mask_token = getattr(tokenizer, "mask_token", None)

        def tokenize(texts):
            # A literal mask token in the text (e.g. "[MASK]") becomes its id, as in HF's
            # tokenizers: split on it, tokenize the pieces, put the id back between them.
            if mask_token is None or special["mask"] is None:
                return tokenizer(texts)
            pieces = tf.strings.split(texts, sep=mask_token)  # [B, (P)]
            tokens = tokenizer(pieces.flat_values)  # [N, (W)]
            dtype = tokens.dtype
            is_last = tf.equal(tf.ragged.range(pieces.row_lengths()).flat_values,
                               tf.gather(pieces.row_lengths(), pieces.value_rowids()) - 1)
            marks = tf.RaggedTensor.from_row_lengths(
                tf.fill([tf.reduce_sum(tf.cast(~is_last, tf.int64))],
                        tf.cast(special["mask"], dtype)),
                tf.cast(~is_last, tf.int64))  # [N, (0 or 1)]
            joined = tf.concat([tokens, marks], axis=1)  # [N, (W + 0/1)]
            return tf.RaggedTensor.from_row_lengths(joined, pieces.row_lengths()).merge_dims(1, 2)

        def serve_text(*texts):
            if is_task:
                own = model.serving_strings(texts, tokenizer, sequence_length, outputs_of)
                if own is not None:
                    return own
            if choices:  # prompt [B], choices [B, C] -> (B, C, T)
                prompt, options = texts
                num = tf.shape(options)[1]
                repeated = tf.reshape(tf.repeat(prompt[:, None], num, axis=1), [-1])
                features = pack([tokenize(repeated), tokenize(tf.reshape(options, [-1]))])
                features = {k: tf.reshape(v, [-1, num, sequence_length])
                            for k, v in features.items()}
            else:
                features = pack([tokenize(t) for t in texts])
            return outputs_of(features)

        specs = [tf.TensorSpec([None, None] if (choices and n == "choices") else [None],
                               tf.string, name=n) for n in text_inputs]
        signatures["serving_default"] = tf.function(
            serve_text, input_signature=specs).get_concrete_function()
        vocab = _vocabulary_file(tokenizer)
        if vocab is not None:
            module.vocabulary = tf.saved_model.Asset(vocab)
        # SentencePiece (ALBERT, XLNet) captures a tf-text model resource: the SavedModel must
        # track it, or saving fails with "references an 'untracked' resource".
        sentence_piece = getattr(tokenizer, "_sentence_piece", None)
        if sentence_piece is not None:
            module.sentence_piece = sentence_piece
    else:
        signatures["serving_default"] = signatures["token_ids"]
    module.serve_token_ids = serve_ids
    tf.saved_model.save(module, export_dir, signatures=signatures)
    return sorted(signatures)


def _vocabulary_file(tokenizer):
    """The tokenizer's files written to a temporary dir (copied into the export's assets/)."""
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if isinstance(vocabulary, str) and os.path.exists(vocabulary):
        return vocabulary
    if hasattr(tokenizer, "get_vocabulary"):
        folder = tempfile.mkdtemp(prefix="kb_export_")
        path = os.path.join(folder, "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(tokenizer.get_vocabulary()) + "\n")
        return path
    return None


# === Op audit ===
def list_ops(export_dir):
    """Every op type in the SavedModel: nodes of each meta graph and of every library function.

    Returns `{op_type: sorted names of the graphs / functions using it}`.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(export_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
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


def audit_ops(export_dir, tf_text="2.12.1", raise_on_error=True):
    """Checks that every op of the SavedModel is core TensorFlow or in the target tf-text release.

    Args:
        tf_text: the tf-text release the server links ("2.12.1": TF Serving 2.12-2.19; "2.20.0":
            2.20 on), or None for core TensorFlow only.
    Returns: `{"ops": {op: "core" | "tf-text" | "UNSUPPORTED"}, "unsupported": {op: functions}}`.
    Raises: `UnsupportedOpsError` naming each op outside the set and where it is used.
    """
    allowed_text = frozenset()
    if tf_text is not None:
        key = ".".join(str(tf_text).split(".")[:2])
        if key not in TF_TEXT_OPS:
            raise ValueError(f"Unknown tf-text release {tf_text!r}; known: 2.12.x, 2.20.x, 2.21.x.")
        allowed_text = TF_TEXT_OPS[key]
    core = core_tensorflow_ops()
    used = list_ops(export_dir)
    kinds, unsupported = {}, {}
    for op, where in used.items():
        if op in core:
            kinds[op] = "core"
        elif op in allowed_text:
            kinds[op] = "tf-text"
        else:
            kinds[op] = "UNSUPPORTED"
            unsupported[op] = where
    if unsupported and raise_on_error:
        lines = "\n".join(f"  {op} (in {', '.join(w[:3])})" for op, w in unsupported.items())
        raise UnsupportedOpsError(
            f"{export_dir} uses {len(unsupported)} op(s) outside core TensorFlow + tf-text "
            f"{tf_text}; a TF Serving build linking that tf-text fails with 'Op type not "
            f"registered':\n{lines}"
        )
    return {"ops": kinds, "unsupported": unsupported}
