"""Tokenizers: keras-hub's WordPiece / SentencePiece / byte-level BPE with our special-token contract.

Every tokenizer here is a keras-hub tokenizer (tf-text kernels underneath) that also knows its
special tokens by role (`cls_token_id`, `sep_token_id`, `pad_token_id`, `mask_token_id`,
`unk_token_id`), checks that the vocabulary has them, and always returns TensorFlow tensors (a
`tf.RaggedTensor` of ids for a batch of strings), eagerly or inside `tf.data`.
"""
import json
import os
import re

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from keras_hub.src.tokenizers import word_piece_tokenizer as _hub_wordpiece
from keras_hub.src.utils import tensor_utils
from tensorflow_text.python.ops import regex_split_ops

from keras_bertfam import preset_hooks
from keras_bertfam.preprocessing.errors import KeepsTFErrors
from keras_bertfam.preprocessing.ragged import keep_values, merge_rows, row_ids, rows_and_index
from keras_bertfam.user_warnings import warn

# HF's BasicTokenizer._clean_text: every whitespace character becomes a space (tab, newline and
# carriage return count as whitespace), then U+FFFD and all "other" characters (\p{C}: control,
# format, private use, unassigned) vanish. HF's whitespace is Unicode's White_Space less the
# controls it drops (\x0b, \x0c, \x1c-\x1f, U+0085): \t \n \r and \p{Z}, the Zs spaces and
# the line / paragraph separators U+2028 (Zl) / U+2029 (Zp).
_WHITESPACE = r"[\t\n\r\p{Z}]"
_DROP_CHARS = r"[\x{FFFD}\p{C}]"


def bert_normalize(texts, lowercase, strip_accents=None):
    """HF BERT normalization in TF ops, so that ids match `BertTokenizer(Fast)` exactly.

    keras-hub's own `lowercase=True` path applies NFKC case folding, which changes characters HF
    keeps (`ß` -> `ss`, `½` -> `1⁄2`, `´` -> ` ́`); measured on 5,008 IMDB reviews it disagreed
    with HF on 28. Here: clean text, lowercase, NFD, drop non-spacing marks (Mn), as HF does;
    measured on all 33,530 texts of the default corpus, the ids equal HF's on every one.
    """
    texts = tf.strings.regex_replace(texts, _WHITESPACE, " ")
    texts = tf.strings.regex_replace(texts, _DROP_CHARS, "")
    if lowercase:
        # ICU lowercases a word-final Σ to ς; HF lowercases per character (σ).
        texts = tf.strings.regex_replace(texts, "Σ", "σ")
        texts = tf.strings.lower(texts, encoding="utf-8")
    if strip_accents or (strip_accents is None and lowercase):
        texts = tf_text.normalize_utf8(texts, "NFD")
        texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
    return texts


class _SpecialTokens(KeepsTFErrors):
    """Special tokens by role on top of keras-hub's mechanism (a token named explicitly checked
    up front; one left at its `optional_defaults` token may be absent, and what needs it says
    so), TF outputs, TensorFlow errors' messages kept on every backend (`KeepsTFErrors`)."""

    ROLES = ("cls", "sep", "pad", "mask", "unk")
    # {role: token}: a role left at this default token is optional (see
    # `_declare_special_tokens`): keras-hub's generic tokenizers need no special tokens.
    optional_defaults = {}

    def __setattr__(self, name, value):
        # A vocabulary is data, not state: Keras' tracker (and TensorFlow's) would wrap its list
        # or dict (and BPE's merges) and visit every one of its 30k-250k strings each time a
        # tokenizer is built or loaded.
        if name in ("vocabulary", "merges", "_token_to_id_map", "_id_to_token_map"):
            return object.__setattr__(self, name, value)
        return super().__setattr__(name, value)

    def _declare_special_tokens(self, vocabulary, tokens, optional=()):
        """Registers `{role: token}` as keras-hub special tokens; names every missing one. A role
        without a token has `*_token` and `*_token_id` None.

        A token of an `optional` role (or of a role left at its `optional_defaults` token) that
        the vocabulary lacks leaves the role unset (its `*_token` and `*_token_id` are None), as
        keras-hub's tokenizers need no special tokens; what needs the role refuses it then,
        naming it (`require_special_tokens`). A token named otherwise must be there."""
        optional = set(optional) | {role for role, token in self.optional_defaults.items()
                                    if tokens.get(role) == token}
        if vocabulary is not None:
            vocab = set(read_vocabulary(vocabulary))
            tokens = {role: None if role in optional and token not in vocab else token
                      for role, token in tokens.items()}
            missing = [t for t in tokens.values() if t is not None and t not in vocab]
            if missing:
                raise ValueError(
                    f"The vocabulary lacks the special token(s) {missing}; the pretraining "
                    f"objectives need {sorted(t for t in tokens.values() if t)}. Add them (our "
                    "vocabulary training reserves them) or name the vocabulary's own tokens with "
                    "cls_token= / sep_token= / pad_token= / mask_token= / unk_token=."
                )
        for role, token in tokens.items():
            if token is not None:
                self._add_special_token(token, f"{role}_token")
            else:
                object.__setattr__(self, f"{role}_token", None)
                object.__setattr__(self, f"{role}_token_id", None)

    def _drop_traced_calls(self):
        """Forgets `call`'s traced functions: they captured the tables of the vocabulary (or
        model) they were traced with, which a setter of a new one replaces."""
        self.__dict__.pop("_eager_tokenize_by_rank", None)

    def resource_generation(self):
        """A key of the TF resources a traced function of this tokenizer captures: it changes
        when they are rebuilt (SentencePiece's model: see `live_sentence_piece`), so that callers
        caching traced functions trace anew. Checks them first. 0: no such resources."""
        return 0

    def call(self, inputs, *args, training=None, **kwargs):
        if isinstance(inputs, (list, tuple, np.ndarray)):
            inputs = python_texts_to_tensor(inputs, type(self).__name__)
        if isinstance(inputs, tf.RaggedTensor):
            # as keras-hub's: words of sentences (a ragged batch) -> one more ragged dimension
            return inputs.with_flat_values(self(inputs.flat_values))
        if not isinstance(inputs, (tf.Tensor, str, bytes)) and not hasattr(inputs, "__array__"):
            # a generator, a set, a dict, None: TensorFlow's "Attempt to convert a value"
            raise TypeError(
                f"{type(self).__name__} takes texts (a string, a list or array of strings, a "
                f"string tensor), got a {type(inputs).__name__}: {inputs!r:.80}.")
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"The tokenizer takes strings, got a tensor of {inputs.dtype.name}.")
        # keras-hub returns Python lists when called eagerly; we keep TF tensors (tf.data style).
        if inputs.shape.rank is None:  # (in a graph) tf-text's kernels need a static rank
            return self.tokenize(inputs)
        # One traced function per input rank, called eagerly and in graphs alike: a graph that
        # tokenizes (a model's train step or predict function on raw text, a tf.data map, a
        # functional model's symbolic build) calls it, its own trace of the tokenizer made once
        # (a triplet siamese's step on three encoders traced BPE's ~650 ops three times, and
        # every new model or pipeline again). The rank stays static: tf-text's kernels need it,
        # and a shape-relaxed retrace would lose it. A string goes as a batch of one (every
        # tokenize reads it so, and takes the row back): a text and a batch trace once.
        self.resource_generation()  # a rebuilt resource drops the functions of the old one
        functions = self.__dict__.setdefault("_eager_tokenize_by_rank", {})
        text = inputs.shape.rank == 0
        if text:
            inputs = inputs[tf.newaxis]
        rank = inputs.shape.rank
        if rank not in functions:
            spec = tf.TensorSpec([None] * rank, inputs.dtype)
            # Plain TF ops: AutoGraph would only parse and rewrite ours and tf-text's Python.
            functions[rank] = tf.function(self.tokenize, input_signature=[spec],
                                          autograph=False)
        tokens = functions[rank](inputs)
        return tokens[0] if text else tokens

    def detokenize(self, inputs):
        """keras-hub's, refusing ids outside the vocabulary when called eagerly (keras-hub's
        WordPiece turned id 99999999 into '##'). In a graph the ids come from a model's output
        over this vocabulary."""
        if tf.executing_eagerly():
            ids = inputs
            if not isinstance(ids, (tf.Tensor, tf.RaggedTensor)):
                ids = tf.ragged.constant(ids) if isinstance(ids, (list, tuple)) else \
                    tf.convert_to_tensor(ids)
            flat = (ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids).numpy().ravel()
            size = self.vocabulary_size()
            bad = (flat < 0) | (flat >= size)
            if bad.any():
                raise ValueError(
                    f"Token id {flat[bad.argmax()].item()} is outside the vocabulary: "
                    f"{type(self).__name__} has ids 0 to {size - 1}.")
        return super().detokenize(inputs)

    @classmethod
    def from_preset(cls, preset, **kwargs):
        return preset_hooks.call("load_tokenizer", preset, **kwargs)


def check_text_items(texts, who):
    """Every leaf of (nested) Python lists of texts is a string: names the first that is not
    (None or a number: a missing value in a column) by its index."""
    def walk(items, where):
        for i, t in enumerate(items):
            if isinstance(t, (list, tuple, np.ndarray)) and not (
                    isinstance(t, np.ndarray) and t.ndim == 0):
                walk(t, where + [i])
            elif not isinstance(t, (str, bytes, np.str_, np.bytes_)):
                index = str(i) if not where else "".join(f"[{j}]" for j in where + [i])
                raise ValueError(
                    f"{who} got a list of texts whose item {index} is {t!r} "
                    f"({type(t).__name__}): expected a string. Drop or fill missing texts first.")
    walk(texts, [])


def python_texts_to_tensor(texts, who):
    """Python lists (or an object array) of texts -> a string tensor; rows of different lengths
    (words of sentences) -> a RaggedTensor, as keras-hub's tokenizers take them."""
    if isinstance(texts, np.ndarray) and texts.dtype != object:
        return tf.convert_to_tensor(texts)
    if len(texts) == 0:
        return tf.constant([], tf.string)
    check_text_items(texts, who)
    try:
        return tf.convert_to_tensor(texts)
    except ValueError:  # non-rectangular
        return tf.ragged.constant(texts, dtype=tf.string)


def read_vocabulary(vocabulary):
    """A vocabulary given as a list of tokens or a one-token-per-line file."""
    if isinstance(vocabulary, str):
        if not os.path.exists(vocabulary):
            raise FileNotFoundError(f"Vocabulary file {vocabulary!r} does not exist.")
        with open(vocabulary, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    return list(vocabulary)


def require_special_tokens(tokenizer, roles, objective):
    """A clear error when `objective` needs special tokens (`roles`: "cls", "sep", "pad",
    "mask") the tokenizer's vocabulary does not have: keras-hub's custom vocabularies may lack
    them, which is fine for tokenizing, not for packing or masking."""
    # The token names the role; its id may still be unknown (a `.keras` file's tokenizer gets
    # its vocabulary after the layers that hold it are built).
    absent = [role for role in roles if getattr(tokenizer, f"{role}_token", None) is None
              and getattr(tokenizer, f"{role}_token_id", None) is None]
    if absent:
        names = " and ".join(f"a {role} token" for role in absent)
        example = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]",
                   **getattr(tokenizer, "optional_defaults", {})}  # the tokenizer's defaults
        raise ValueError(
            f"{objective} needs {names}, and the vocabulary of this "
            f"{type(tokenizer).__name__} has none. Add "
            f"{', '.join(repr(example[r]) for r in absent)} to the vocabulary, or name the "
            f"vocabulary's own token{'s' if len(absent) > 1 else ''} with "
            f"{', '.join(f'{r}_token=' for r in absent)} when building the tokenizer.")


def regex_split(text, delimiter, keep, offsets=False):
    """`tf_text.regex_split` (the same kernel and words) for [N] or ragged [N, (W)] strings,
    without validating the row splits the kernel itself made: tf-text's validated
    `RaggedTensor`s build 12 assert `tf.cond`s a call, most of a tokenizer's trace. With
    `offsets`, of [N] strings: (words, byte starts, byte ends), each [N, (W)], as
    `tf_text.regex_split_with_offsets`."""
    if isinstance(text, tf.RaggedTensor) and not offsets:
        return text.with_flat_values(regex_split(text.flat_values, delimiter, keep))
    if text.shape.rank != 1:
        return (tf_text.regex_split_with_offsets if offsets else tf_text.regex_split)(
            text, delimiter, keep)
    words, starts, ends, splits = regex_split_ops.gen_regex_split_ops.regex_split_with_offsets(
        text, f"({delimiter})".encode(), f"({keep})".encode())
    rows = [tf.RaggedTensor.from_row_splits(v, splits, validate=False)
            for v in (words, starts, ends)]
    return tuple(rows) if offsets else rows[0]


# GPT-2's pre-split, as HF's `ByteLevel` pre-tokenizer: its regex
# `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` with Oniguruma's `\s`
# (Unicode's White_Space: \t-\r, U+0085 and \p{Z}; RE2's `\s` is ASCII). RE2 has no lookahead:
# `_split_for_bpe` does the `\s+(?!\S)` part (a whitespace run before a word gives up its last
# character) and this pattern the rest.
_BPE_SPACE = r"[\t-\r\x{85}\p{Z}]"
_BPE_WORD = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\t-\r\x{85}\p{Z}\p{L}\p{N}]+|"
             + _BPE_SPACE + "+")


def valid_utf8(texts):
    """Strings -> the same, each invalid UTF-8 sequence replaced by U+FFFD (TensorFlow's
    replacement: one per maximal invalid subpart, as Python's `bytes.decode("utf-8",
    "replace")`). What byte-level BPE splits (`_split_for_bpe`), the text offsets index
    (`offsets.tokenize_with_offsets`), and what `QuestionAnswerer.answer` and the exported QA
    signature cut an answer from."""
    return tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=0xFFFD)


def _restore_nul(words):
    """[N] words -> the same, each byte 0xFF NUL again (`_split_for_bpe`)."""
    chars = tf.strings.bytes_split(words)
    return tf.strings.reduce_join(chars.with_flat_values(tf.where(
        tf.equal(chars.flat_values, b"\xff"), b"\x00", chars.flat_values)), axis=-1)


def _split_for_bpe(inputs, unsplittable_tokens, add_prefix_space=False, prefixed=False):
    """[B] strings -> [B, (W)] words as HF's byte-level BPE tokenizers (`RobertaTokenizerFast`,
    GPT-2's) split them, with no Python per text and no row-split checks.

    As HF: the text is cut at its special tokens first (each a word of its own; the longest where
    two start at one place), and each part between them is split alone, so a whitespace run that
    ends a part ("a  <mask>", "x  ") is one word. With `add_prefix_space`, a space is put before
    each part that does not start with one (HF's `ByteLevel(add_prefix_space=True)`): none before
    a special token, the empty text or " x". Within a part, GPT-2's `\\s+(?!\\S)`: a whitespace
    run before a word gives its last character up, to start the word if it is " ". (keras-hub's
    `split_strings_for_bpe`, which this replaced, put a space before the whole text, split "  "
    into two words, and dropped U+096C "६", its stand-in for the lookahead.)

    With `prefixed`, also returns which of the words ([N], bool) start with an added space.
    Bytes that are not UTF-8 are read as U+FFFD (`valid_utf8`), as the exported signatures and
    the offsets read them (HF's tokenizers take Python strings: decoded with "replace")."""
    inputs = valid_utf8(inputs)
    # tf-text's regex split stops at NUL (the rest of the text was lost): NUL goes through it as
    # the byte 0xFF, which valid UTF-8 never holds and RE2 reads as U+FFFD (a symbol, as NUL:
    # neither space, letter nor number), then is itself again in the words (`_restore_nul`).
    with_nul = inputs
    inputs = tf.strings.regex_replace(inputs, r"\x00", tf.constant(b"\xff"))
    has_nul = tf.reduce_any(tf.not_equal(inputs, with_nul))
    tokens = list(unsplittable_tokens or ())
    parts, which = _cut_at_tokens(inputs, tokens)  # [B, (S)]
    special = which.flat_values >= 0
    text = parts.flat_values  # [S]
    added = ~special & tf.not_equal(tf.strings.substr(text, 0, 1), " ")
    if add_prefix_space:
        text = tf.where(added, tf.strings.join([" ", text]), text)
    # A special token goes through the split as "x" (one word), then becomes itself again.
    text = tf.where(special, "x", text)
    # Whitespace runs and the text between them: a run followed by more of its part gives up its
    # last character, which starts the next chunk if it is " " and is a word of its own if not.
    chunks = regex_split(text, _BPE_SPACE + "+", _BPE_SPACE + "+")  # [S, (K)]
    chunk = chunks.flat_values
    part, index = rows_and_index(chunks.row_splits)
    follow = tf.strings.regex_full_match(chunk, _BPE_SPACE + "+") & tf.not_equal(
        index + 1, tf.gather(chunks.row_splits[1:], part))
    last = tf.where(follow, tf.strings.regex_replace(chunk, f"^{_BPE_SPACE}*({_BPE_SPACE})$",
                                                     r"\1"), "")
    head = tf.where(follow, tf.strings.regex_replace(chunk, _BPE_SPACE + "$", ""), chunk)
    joins = tf.equal(last, " ")
    joined = tf.concat([[False], joins], 0)[:-1]  # after a joining run: in its part
    head = tf.where(joined, tf.strings.join([" ", head]), head)
    keep = tf.stack([tf.not_equal(head, ""), follow & ~joins], axis=1)  # [K, 2]
    pieces = tf.boolean_mask(tf.stack([head, last], axis=1), keep)  # [F]
    piece_splits = tf.gather(tf.concat([[0], tf.cumsum(tf.reduce_sum(
        tf.cast(keep, chunks.row_splits.dtype), axis=1))], 0), chunks.row_splits)  # [S + 1]
    words = regex_split(pieces, _BPE_WORD, _BPE_WORD)  # [F, (W)]
    word_splits = tf.gather(words.row_splits, piece_splits)  # [S + 1]: each part's words
    values = tf.cond(has_nul, lambda: _restore_nul(words.flat_values),
                     lambda: words.flat_values)
    if tokens:
        part_of_word = row_ids(word_splits)
        values = tf.where(tf.gather(special, part_of_word), tf.gather(
            tokens, tf.maximum(tf.gather(which.flat_values, part_of_word), 0)), values)
    words = tf.RaggedTensor.from_row_splits(values, tf.gather(word_splits, parts.row_splits),
                                            validate=False)  # [B, (W)]
    if not prefixed:
        return words
    first = tf.gather(word_splits, tf.where(added & add_prefix_space)[:, 0])  # their first words
    return words, tf.scatter_nd(first[:, None], tf.ones_like(first, tf.bool),
                                tf.shape(values, out_type=first.dtype))


def _cut_at_tokens(texts, tokens, ids=None, offsets=False):
    """[N] texts (valid UTF-8) -> ([N, (S)] parts, [N, (S)] ids): each text cut at the `tokens`
    in it as HF finds its added tokens (the leftmost first; the longest where two start at one
    place), a token's part with its id from `ids` (default: its index in `tokens`), other parts
    -1; no empty parts. With `offsets`, also each part's byte start and end in its text
    ([N, (S)] each). A NUL is read as any other character: tf-text's regex split stops at one
    (the text after it was lost), so it goes through the split as the byte 0xFF, which valid
    UTF-8 never holds, and is NUL again in the parts (`_restore_nul`)."""
    ids = tf.range(max(len(tokens), 1)) if ids is None else ids
    if not tokens:
        parts = keep_values(tf.RaggedTensor.from_tensor(texts[:, None]), texts != "")
        part_ids = parts.with_flat_values(tf.fill(tf.shape(parts.flat_values),
                                                  tf.constant(-1, ids.dtype)))
        if not offsets:
            return parts, part_ids
        return (parts, part_ids, parts.with_flat_values(tf.zeros_like(parts.flat_values, tf.int64)),
                parts.with_flat_values(tf.cast(tf.strings.length(parts.flat_values), tf.int64)))
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]), reverse=True)
    pattern = "|".join(re.escape(tokens[i]) for i in order)
    scanned = tf.strings.regex_replace(texts, r"\x00", tf.constant(b"\xff"))
    parts, *bounds = regex_split(scanned, pattern, pattern, offsets=True) if offsets else \
        (regex_split(scanned, pattern, pattern),)
    values = parts.flat_values
    values = tf.cond(tf.reduce_any(tf.not_equal(scanned, texts)), lambda: _restore_nul(values),
                     lambda: values)
    parts = parts.with_flat_values(values)
    is_token = tf.equal(values[:, None], [tokens[i] for i in order])  # (S, T)
    token_id = tf.gather(tf.gather(ids, order), tf.argmax(is_token, axis=1))
    return (parts, parts.with_flat_values(
        tf.where(tf.reduce_any(is_token, axis=1), token_id, tf.constant(-1, ids.dtype))),
        *bounds)


def _id_rows(ids):
    """[S] ids, -1 for none -> [S, (0 or 1)]; [S, n] rows, first the id -> [S, (0 or 1), n]."""
    present = (ids if ids.shape.rank == 1 else ids[:, 0]) >= 0
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(ids, present),
                                            tf.cast(present, tf.int64), validate=False)


# tf-text's WordPiece model (a flatbuffer) of each vocabulary, built once per process: every
# WordPieceTokenizer built it again (a task's `from_preset`, `load_model`, a preset's tokenizer;
# 30,522 BERT tokens: ~0.05 s to build, then tf-text made its 1.85 MB into a tensor through a
# Python list of ints). The few most recent vocabularies are kept.
_WORDPIECE_MODELS = {}
_WORDPIECE_MODELS_KEPT = 4


def _wordpiece_model(vocabulary, suffix_indicator, unknown_token):
    """The model bytes `tf_text.FastWordpieceTokenizer` builds for keras-hub's WordPiece
    (`no_pretokenization=True, support_detokenization=True`, tf-text's default 100 bytes a
    word), from the cache when this vocabulary and these options were built before."""
    from tensorflow_text.core.pybinds import pywrap_fast_wordpiece_tokenizer_model_builder

    key = (tuple(vocabulary), suffix_indicator, unknown_token)
    model = _WORDPIECE_MODELS.pop(key, None)
    if model is None:
        model = pywrap_fast_wordpiece_tokenizer_model_builder.build_fast_wordpiece_model(
            list(key[0]), 100, suffix_indicator, unknown_token, True, True)
    _WORDPIECE_MODELS[key] = model  # the most recent last
    while len(_WORDPIECE_MODELS) > _WORDPIECE_MODELS_KEPT:
        del _WORDPIECE_MODELS[next(iter(_WORDPIECE_MODELS))]
    return model


class WordPieceTokenizer(_SpecialTokens, keras_hub.tokenizers.WordPieceTokenizer):
    """BERT's WordPiece, giving exactly HF `BertTokenizer`'s ids.

    Args:
        vocabulary: a `vocab.txt` path or a list of tokens.
        lowercase: lowercase (uncased models).
        strip_accents: drop accents (NFD, then the non-spacing marks); None (HF's default):
            when `lowercase`.
        cls_token ... unk_token: the vocabulary's special tokens.
        added_tokens: tokens of the vocabulary found whole in a text before it is normalized
            and split (HF's added tokens of `normalized=False`: `add_special_tokens`'s), each
            giving its own id wherever it occurs.
        normalized_added_tokens: the same, found in the normalized text (lowercased and
            accent-stripped as this tokenizer does, as is the token: HF's `add_tokens`).
        split_on_cjk: CJK characters are words of their own (HF's `tokenize_chinese_chars`).
        suffix_indicator: the prefix of a word's non-initial pieces ("##").
        split: split texts into words first (False: each input is one word, keras-hub's).

    Example:
    >>> tok = WordPieceTokenizer(vocabulary="vocab.txt", lowercase=True)  # doctest: +SKIP
    >>> tok(["Does BERT know Snuffleupagus?"])  # doctest: +SKIP
    <tf.RaggedTensor [[2515, 14324, 2113, 1055, 11231, 20031, 6279, 8490, 2271, 1029]]>
    """

    kind = "wordpiece"
    # keras-hub's WordPieceTokenizer needs no special tokens (its guides train vocabularies with
    # "[START]" / "[END]"): a default token the vocabulary lacks leaves its role unset.
    optional_defaults = dict(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]")

    def __init__(
        self,
        vocabulary=None,
        lowercase=False,
        strip_accents=None,
        sequence_length=None,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        added_tokens=(),
        normalized_added_tokens=(),
        split_on_cjk=True,
        suffix_indicator="##",
        split=True,
        **kwargs,
    ):
        self.bert_lowercase = lowercase
        self.bert_strip_accents = strip_accents
        self.added_tokens = list(added_tokens or ())
        self.normalized_added_tokens = list(normalized_added_tokens or ())
        tokens = dict(cls=cls_token, sep=sep_token, pad=pad_token, mask=mask_token, unk=unk_token)
        self._declare_special_tokens(vocabulary, tokens)
        added = self.added_tokens + self.normalized_added_tokens
        if added and vocabulary is not None:
            vocab = set(read_vocabulary(vocabulary))
            missing = [t for t in added if t not in vocab]
            if missing:
                raise ValueError(f"The added token(s) {missing} are not in the vocabulary: each "
                                 "added token is one of its tokens.")
        kwargs.pop("_allow_python_workflow", None)
        if kwargs.get("oov_token", unk_token) != unk_token:
            raise ValueError(f"oov_token={kwargs['oov_token']!r} differs from "
                             f"unk_token={unk_token!r}; they name the same token.")
        kwargs.pop("oov_token", None)
        super().__init__(
            vocabulary=vocabulary,
            sequence_length=sequence_length,
            lowercase=False,  # done by bert_normalize, HF's way
            strip_accents=False,
            oov_token=unk_token,
            split_on_cjk=split_on_cjk,
            suffix_indicator=suffix_indicator,
            split=split,
            _allow_python_workflow=False,
            **kwargs,
        )

    def _set_vocabulary_tf(self):
        """keras-hub's tf-text tokenizer, from the cached model of this vocabulary (keras-hub's
        own construction where tf-text's model builder is not where 2.21 has it).

        With added tokens, the text between them is WordPieced by a model without the added
        tokens at the end of the vocabulary (after its last other token), as HF's model has
        only its own vocabulary: "ZZQ" is "z ##z ##q" when "zzq" is an added token found
        only as written (the full model would make it "zzq" once lowercased)."""
        self._drop_traced_calls()

        def build(vocabulary):
            model = _wordpiece_model(vocabulary, self.suffix_indicator, self.oov_token)
            return tf_text.FastWordpieceTokenizer(
                model_buffer=tf.constant(np.frombuffer(model, np.uint8)),
                token_out_type=self.compute_dtype)

        try:
            self._fast_word_piece = build(self.vocabulary)
        except ImportError:  # pragma: no cover - another tf-text layout
            super()._set_vocabulary_tf()
            self._text_word_piece = self._fast_word_piece
            return
        added = set(self.added_tokens) | set(self.normalized_added_tokens)
        base = 1 + max((i for i, t in enumerate(self.vocabulary) if t not in added), default=-1)
        self._text_word_piece = self._fast_word_piece if base == len(self.vocabulary) else \
            build(self.vocabulary[:base])

    def tokenize(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"The tokenizer takes strings, got a tensor of {inputs.dtype.name}.")
        # Bytes that are not UTF-8 are U+FFFD, which the normalization drops (HF reads the
        # text decoded with "replace"; an invalid byte was a word's [UNK] here)
        inputs = valid_utf8(inputs)
        if not (self.added_tokens or self.normalized_added_tokens):
            return super().tokenize(bert_normalize(inputs, self.bert_lowercase,
                                                   self.bert_strip_accents))
        self._maybe_initialized_tf()
        tokens = self._tokenize_with_added(tf.reshape(inputs, [-1]))  # (N, (T))
        for axis in reversed(range(1, inputs.shape.rank)):  # a dense batch of rank > 1
            tokens = tf.RaggedTensor.from_uniform_row_length(
                tokens, tf.shape(inputs, out_type=tokens.row_splits.dtype)[axis])
        if self.sequence_length:
            tokens = tokens.to_tensor(shape=tokens.shape[:-1] + [self.sequence_length])
        return tokens[0] if inputs.shape.rank == 0 else tokens

    def _tokenize_with_added(self, texts):
        """[N] texts -> [N, (T)] ids, as HF's tokenizer with added tokens: the text is cut at
        its `added_tokens` (the longest where two start at one place), each part between them
        normalized, cut at its `normalized_added_tokens` (normalized themselves), and each part
        between those WordPieced alone; every added token gives its id."""
        def ids_of(tokens):
            return tf.constant([self.token_to_id(t) for t in tokens] or [0], self.compute_dtype)

        # tf-text's regex split stops at a NUL (the text after it was lost); \x01 is dropped by
        # the normalization just as NUL is
        texts = tf.strings.regex_replace(texts, r"\x00", "\x01")
        raw, raw_id = _cut_at_tokens(texts, self.added_tokens, ids_of(self.added_tokens))
        text = bert_normalize(raw.flat_values, self.bert_lowercase, self.bert_strip_accents)
        text = tf.where(raw_id.flat_values >= 0, "", text)
        parts, part_id = _cut_at_tokens(text, self.normalized_added_tokens_as_found(),
                                        ids_of(self.normalized_added_tokens))
        words = self._wordpiece(tf.where(part_id.flat_values >= 0, "", parts.flat_values))
        tokens = tf.concat([words, _id_rows(part_id.flat_values)], axis=1)  # (R, (T))
        tokens = tf.RaggedTensor.from_row_splits(tokens, parts.row_splits, validate=False)
        tokens = tf.concat([tokens.merge_dims(1, 2), _id_rows(raw_id.flat_values)], axis=1)
        return tf.RaggedTensor.from_row_splits(tokens, raw.row_splits,
                                               validate=False).merge_dims(1, 2)

    def normalized_added_tokens_as_found(self):
        """`normalized_added_tokens` normalized as this tokenizer normalizes a text (Python
        strings): what is found in the normalized text."""
        if not self.normalized_added_tokens:
            return []
        with tf.init_scope():  # Python strings (a tf.data function traces this too)
            return [t.decode() for t in bert_normalize(
                tf.constant(self.normalized_added_tokens), self.bert_lowercase,
                self.bert_strip_accents).numpy()]

    def word_split_patterns(self):
        """(delimiters, kept delimiters) of the split of a normalized text into words:
        whitespace and punctuation, CJK characters as words of their own with `split_on_cjk`
        (keras-hub's patterns)."""
        if self.split_on_cjk:
            return (_hub_wordpiece.WHITESPACE_PUNCTUATION_AND_CJK_REGEX,
                    _hub_wordpiece.PUNCTUATION_AND_CJK_REGEX)
        return _hub_wordpiece.WHITESPACE_AND_PUNCTUATION_REGEX, _hub_wordpiece.PUNCTUATION_REGEX

    def _wordpiece(self, text):
        """[N] normalized texts -> [N, (T)] ids: split into words (`word_split_patterns`), then
        WordPiece; keras-hub's ops (`_tokenize_tf`)."""
        if self.split_on_cjk:
            text = tf.strings.regex_replace(text, _hub_wordpiece.CJK_REGEX, r" \0 ")
        return merge_rows(self._text_word_piece.tokenize(
            regex_split(text, *self.word_split_patterns())))

    @tensor_utils.preprocessing_function
    def _tokenize_tf(self, inputs):
        """keras-hub's `_tokenize_tf` (split on whitespace and punctuation, CJK characters as
        words, then WordPiece) with the same ops, but tf-text's split is not followed by
        validated `RaggedTensor`s: their asserts (12 `tf.cond`s) were most of a tokenizer's
        graph-building time, and their row splits come from the split kernel itself."""
        inputs = tf.convert_to_tensor(inputs) if not isinstance(inputs, tf.RaggedTensor) \
            else inputs
        if (not self.split or self.lowercase or self.strip_accents or inputs.shape.rank not in (0, 1)
                or self._special_tokens_for_splitting() or isinstance(inputs, tf.RaggedTensor)):
            return super()._tokenize_tf(inputs)  # cases this library never builds: keras-hub's
        self._maybe_initialized_tf()
        tokens = self._wordpiece(inputs[None] if inputs.shape.rank == 0 else inputs)
        if self.sequence_length:
            tokens = tokens.to_tensor(shape=[tokens.shape[0], self.sequence_length])
        if inputs.shape.rank == 0:
            tokens = tf.squeeze(tokens, 0)
        return tokens

    def get_config(self):
        config = super().get_config()
        for key in ("strip_accents", "oov_token", "special_tokens", "special_tokens_in_strings"):
            config.pop(key, None)
        config["lowercase"] = self.bert_lowercase
        config["strip_accents"] = self.bert_strip_accents
        config["split_on_cjk"] = self.split_on_cjk  # keras-hub's get_config leaves it out
        config.update(added_tokens=list(self.added_tokens),
                      normalized_added_tokens=list(self.normalized_added_tokens))
        config.update({f"{r}_token": getattr(self, f"{r}_token", None) for r in self.ROLES})
        return config


class Tokenizer:
    """`Tokenizer.from_preset(preset)`: the preset's own tokenizer (WordPiece, SentencePiece or
    byte-level BPE), whichever family the preset is."""

    def __new__(cls, *args, **kwargs):
        raise TypeError(
            "Tokenizer is a namespace: use Tokenizer.from_preset(...) or a concrete tokenizer "
            "(WordPieceTokenizer, SentencePieceTokenizer, BytePairTokenizer, XLNetTokenizer)."
        )

    from_preset = staticmethod(_SpecialTokens.from_preset)  # the one preset loader


def train_word_piece_vocabulary(
    documents,
    vocabulary_size,
    lowercase=True,
    output_file=None,
    reserved_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    strip_accents=None,
):
    """Learns a WordPiece vocabulary from a `tf.data.Dataset` of strings (or a list of strings).

    Uses tf-text's BERT vocabulary learner through keras-hub on HF-normalized text. The reserved
    tokens come first, in order, so `[PAD]` is id 0 as in BERT. Returns the token list (and
    writes it, one token a line, to `output_file` when given). A corpus too small for
    `vocabulary_size` gives fewer tokens, with a warning naming the size reached.
    `strip_accents` as `WordPieceTokenizer`'s (None: when `lowercase`).
    """
    if isinstance(documents, (list, tuple)):
        documents = tf.data.Dataset.from_tensor_slices(list(documents))
    if not isinstance(documents, tf.data.Dataset):
        raise TypeError("documents must be a tf.data.Dataset of strings or a list of strings.")
    normalized = documents.batch(256).map(tf.autograph.experimental.do_not_convert(  # plain ops
        lambda t: bert_normalize(t, lowercase, strip_accents))).unbatch()
    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        normalized,
        vocabulary_size,
        lowercase=False,
        strip_accents=False,
        reserved_tokens=list(reserved_tokens),
    )
    if len(vocabulary) < vocabulary_size:
        warn(
            f"train_word_piece_vocabulary: the corpus gave {len(vocabulary)} tokens, fewer than "
            f"vocabulary_size={vocabulary_size} (every word piece it holds is in). A backbone "
            f"built for this vocabulary takes vocabulary_size={len(vocabulary)}.")
    if output_file:
        with open(output_file, "w", encoding="utf-8") as f:
            f.write("\n".join(vocabulary) + "\n")
    return vocabulary


# === Byte-level BPE (RoBERTa) ===

ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _read_bpe_vocabulary(vocabulary):
    """vocab.json path or {token: id} dict -> dict."""
    if isinstance(vocabulary, str):
        if not os.path.exists(vocabulary):
            raise FileNotFoundError(f"BPE vocabulary file {vocabulary!r} does not exist.")
        with open(vocabulary, encoding="utf-8") as f:
            return json.load(f)
    if not isinstance(vocabulary, dict):
        raise TypeError(f"A BPE vocabulary is a vocab.json path or a dict, got {type(vocabulary)}.")
    return dict(vocabulary)


def _read_bpe_merges(merges):
    """merges.txt path or list -> list of "a b" rules (the "#version" header dropped). No rule
    at all (keras-hub's table then failed with TensorFlow's "Could not find device for node
    HashTableV2") or a rule that is not two pieces is refused, naming it and where it is."""
    source = f"the merges file {merges!r}" if isinstance(merges, str) else "merges"
    if isinstance(merges, str):
        if not os.path.exists(merges):
            raise FileNotFoundError(f"BPE merges file {merges!r} does not exist.")
        with open(merges, encoding="utf-8") as f:
            merges = [line.rstrip("\n") for line in f]
    rules = [m for m in merges if m and not m.startswith("#version")]
    if not rules:
        raise ValueError(f"BytePairTokenizer got no merge rules in {source}: expected GPT-2 / "
                         f"RoBERTa merges, one rule \"a b\" (two pieces and a space) per line.")
    bad = next((i for i, m in enumerate(rules) if not isinstance(m, str) or
                len(m.split(" ")) != 2), None)
    if bad is not None:
        raise ValueError(f"BytePairTokenizer: merge rule {bad} of {source} is {rules[bad]!r}: "
                         f"expected two pieces separated by one space, e.g. \"Ġ t\".")
    return rules


UNKNOWN_PIECE = (
    "BytePairTokenizer: the piece {piece} (GPT-2's byte symbols) is not in the vocabulary, and "
    "the vocabulary has no unknown token to map it to (unk_token, default '<unk>', is not in "
    "it). Expected a vocabulary holding every piece the merges make and all 256 byte symbols "
    "(RoBERTa's and GPT-2's do), or one with an unknown token.")


class BytePairTokenizer(_SpecialTokens, keras_hub.tokenizers.BytePairTokenizer):
    """RoBERTa's (GPT-2's) byte-level BPE, giving HF `RobertaTokenizer`'s ids (Liu et al. 2019).

    keras-hub's TF implementation (GPT-2's pre-split regex, byte-to-unicode table, merge ranks)
    with RoBERTa's special tokens by role: `<s>` (cls), `</s>` (sep), `<pad>`, `<mask>`, `<unk>`.
    Special tokens written in the text are kept whole and split the text, as HF does. No prefix
    space is added (HF's `add_prefix_space=False` default): a text's first word is encoded
    without `Ġ`. With `add_prefix_space=True`, as HF's fast tokenizer, a space goes before each
    part of the text between special tokens that does not start with one ("x<s>y" is "Ġx <s>
    Ġy"; "" is no token, " x" is "Ġx", "<mask> is" is "<mask> Ġis").

    Args:
        vocabulary: a `vocab.json` path or a `{token: id}` dict.
        merges: a `merges.txt` path or a list of "a b" merge rules.
        add_prefix_space: encode the first word as if a space preceded it.
        cls_token ... unk_token: the vocabulary's special tokens.
        added_tokens: more tokens of the vocabulary kept whole and splitting the text, as the
            special tokens (HF's added tokens: `add_tokens`, `add_special_tokens`).

    Example:
    >>> tok = BytePairTokenizer("vocab.json", "merges.txt")  # doctest: +SKIP
    >>> tok(["Hello world"])  # doctest: +SKIP
    <tf.RaggedTensor [[31414, 232]]>
    """

    kind = "byte_pair"
    # keras-hub's BytePairTokenizer example builds a vocabulary of merges' parts only.
    optional_defaults = {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>"}
    # RoBERTa packs a pair as `<s> A </s></s> B </s>` (HF's `build_inputs_with_special_tokens`).
    pair_separators = 2

    def __init__(
        self,
        vocabulary=None,
        merges=None,
        sequence_length=None,
        add_prefix_space=False,
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        mask_token="<mask>",
        unk_token="<unk>",
        added_tokens=(),
        **kwargs,
    ):
        self.added_tokens = list(added_tokens or ())
        if vocabulary is not None:
            vocabulary = _read_bpe_vocabulary(vocabulary)
            missing = [t for t in self.added_tokens if t not in vocabulary]
            if missing:
                raise ValueError(f"The added token(s) {missing} are not in the vocabulary: each "
                                 "added token is one of its tokens.")
        spaced = [t for t in self.added_tokens if " " in t]
        if spaced:  # keras-hub's cache of merged words joins their pieces with " "
            raise ValueError(f"The added token(s) {spaced} contain a space: BytePairTokenizer "
                             "cannot keep such a token whole.")
        if merges is not None:
            merges = _read_bpe_merges(merges)
        tokens = dict(cls=cls_token, sep=sep_token, pad=pad_token, mask=mask_token, unk=unk_token)
        # Byte-level BPE never produces an unknown token, and only masked-LM pretraining needs
        # the mask token: a vocabulary without them (keras-hub's RoBERTa examples) tokenizes,
        # fine-tunes and predicts; the MLM preprocessors refuse it, naming the token.
        self._declare_special_tokens(None if vocabulary is None else list(vocabulary), tokens,
                                     optional=("unk", "mask"))
        kwargs.pop("_allow_python_workflow", None)
        kwargs.pop("unsplittable_tokens", None)
        super().__init__(
            vocabulary=vocabulary,
            merges=merges,
            sequence_length=sequence_length,
            add_prefix_space=add_prefix_space,
            unsplittable_tokens=[t for t in tokens.values() if t is not None]
            + self.added_tokens,
            _allow_python_workflow=False,
            **kwargs,
        )

    def set_vocabulary_and_merges(self, vocabulary, merges):
        super().set_vocabulary_and_merges(vocabulary, merges)
        self._drop_traced_calls()

    def tokenize(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"The tokenizer takes strings, got a tensor of {inputs.dtype.name}.")
        return super().tokenize(inputs)

    @tensor_utils.preprocessing_function
    def _tokenize_tf(self, inputs):
        """keras-hub's cached tokenize (merged words kept in its `MutableHashTable`), with two
        changes: the words come from `_split_for_bpe` (HF's words where keras-hub's differed:
        texts starting with a space or a special token, the empty text, whitespace runs before a
        special token; and keras-hub's pre-split built ~2,000 ops of row-split checks a trace: 2 s
        of every tf.data pipeline's trace) and only a batch's distinct unseen words go through
        the merge loop (keras-hub merges every occurrence: a cold 3,000-sentence batch took 5.7 s
        instead of 1.5)."""
        self._maybe_initialized_tf()
        inputs = tf.convert_to_tensor(inputs)
        unbatched = inputs.shape.rank == 0
        if unbatched:
            inputs = tf.expand_dims(inputs, 0)
        if inputs.shape.rank > 1:
            raise ValueError("`tokenize()` inputs should be a string, list of strings, or "
                             f"string tensor with rank < 2. Received: {inputs}")
        words = _split_for_bpe(inputs, self.unsplittable_tokens,
                               self.add_prefix_space)  # [B, (W)]
        distinct, index = tf.unique(words.flat_values)
        cached = self.cache.lookup(distinct)  # special tokens are in it: themselves
        unseen = tf.equal(cached, "") & tf.not_equal(distinct, "")

        def merge_unseen():
            self._bpe_merge_and_update_cache_tf(tf.boolean_mask(distinct, unseen))
            return self.cache.lookup(distinct)

        merged = tf.cond(tf.reduce_any(unseen), merge_unseen, lambda: cached)
        pieces = tf.strings.split(tf.gather(merged, index), sep=" ")  # [N, (P)]
        if self.compute_dtype != tf.string:
            pieces = pieces.with_flat_values(self.piece_ids(pieces.flat_values))
        tokens = merge_rows(words.with_flat_values(pieces))
        if self.sequence_length:
            output_shape = tokens.shape.as_list()
            output_shape[-1] = self.sequence_length
            tokens = tokens.to_tensor(shape=output_shape)
        if unbatched:
            tokens = tf.squeeze(tokens, 0)
            tf.ensure_shape(tokens, shape=[self.sequence_length])
        return tokens

    def _bpe_merge_tf(self, words):
        """keras-hub's merge loop, the same merges on dense [words, symbols] tensors: ragged
        words [W, (S)] of GPT-2 byte symbols -> their pieces [W, (S')]. Every step merges, in
        each word that still has a rule's pair, the first pair of the lowest rank (keras-hub's
        step: one pair a word a step); a word without one leaves the working set, which also
        narrows to its longest word. With keras-hub's ragged step the traced tokenizer was
        1,486 ops (1.1-2.5 s in every preprocessor's trace); with this one 647 (0.4-0.6 s)."""
        none = tf.constant(self.merge_ranks_lookup_default, tf.int64)
        lengths = words.row_lengths()  # [W]
        # Two empty columns at least: a word of one symbol (or none) has no pair to rank.
        dense = tf.pad(words.to_tensor(""), [[0, 0], [0, 2]])  # [W, L]
        width = tf.shape(dense, out_type=tf.int64)[1]

        def step(done, lengths, index, work, length):  # the working set: rows `index` of W
            column = tf.range(tf.shape(work, out_type=tf.int64)[1])[tf.newaxis, :]
            pairs = tf.strings.join([work[:, :-1], work[:, 1:]], separator=" ")
            rank = tf.cast(self.merge_ranks.lookup(pairs), tf.int64)
            rank = tf.where(column[:, :-1] < (length - 1)[:, tf.newaxis], rank, none)
            best = tf.argmin(rank, axis=1)[:, tf.newaxis]  # the first of the lowest rank
            found = tf.reduce_min(rank, axis=1) < none
            merged = tf.strings.join([tf.gather(work, best, batch_dims=1),
                                      tf.gather(work, best + 1, batch_dims=1)])
            # The pair becomes one symbol; the symbols after it move one to the left.
            source = tf.minimum(column + tf.cast(column > best, tf.int64), column[:, -1:])
            moved = tf.where(column == best, merged, tf.gather(work, source, batch_dims=1))
            # A word without a pair leaves the set as it is; the others go on merged.
            finished = tf.where(~found)[:, 0]
            rows = tf.gather(index, finished)[:, tf.newaxis]
            done = tf.tensor_scatter_nd_update(done, rows, tf.pad(
                tf.gather(work, finished), [[0, 0], [0, width - tf.shape(work, tf.int64)[1]]]))
            lengths = tf.tensor_scatter_nd_update(lengths, rows, tf.gather(length, finished))
            going = tf.where(found)[:, 0]
            length = tf.gather(length, going) - 1
            keep = tf.reduce_max(tf.concat([length, [0]], 0)) + 2
            return done, lengths, tf.gather(index, going), tf.gather(moved, going)[:, :keep], length

        done, lengths, *_ = tf.while_loop(
            lambda done, lengths, index, work, length: tf.size(index) > 0, step,
            [dense, lengths, tf.range(tf.shape(lengths, out_type=tf.int64)[0]), dense, lengths],
            shape_invariants=[dense.shape, lengths.shape, tf.TensorShape([None]),
                              tf.TensorShape([None, None]), tf.TensorShape([None])])
        return tf.RaggedTensor.from_tensor(done, lengths=lengths)

    def piece_ids(self, pieces):
        """BPE pieces (a string tensor) -> their ids. A piece the vocabulary lacks (a vocabulary
        without some of the 256 byte symbols, or a merge whose result it lacks, as keras-hub's
        docstring vocabulary) is the unknown token's id, as HF's `RobertaTokenizer` maps it;
        without an unknown token the tokenizer stops with an InvalidArgumentError naming the
        piece (keras-hub's lookup gives id -1, which flowed on into the embedding gather: an
        error there on TensorFlow, a clamped lookup on JAX)."""
        ids = self.token_to_id_map.lookup(pieces)
        missing = tf.equal(ids, -1)
        if self.unk_token_id is not None:
            return tf.where(missing, tf.cast(self.unk_token_id, ids.dtype), ids)
        first = tf.concat([tf.boolean_mask(pieces, missing)[:1], [""]], 0)[0]
        check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(missing)), [tf.strings.format(
            UNKNOWN_PIECE, first, placeholder="{piece}")])
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    # === Serving (kb.export): no mutable cache in the graph ===
    def serving_resources(self):
        """The lookup tables `serving_tokenize` reads (static hash tables: core TF ops), for the
        SavedModel to track."""
        self._maybe_initialized_tf()
        return [self.byte2unicode, self.token_to_id_map, self.merge_ranks]

    def serving_tokenize(self, inputs):
        """The same ids as `tokenize`, in core TensorFlow ops with no state. keras-hub's path keeps
        a `MutableHashTable` cache of merged words, which a SavedModel cannot serve (an untracked
        resource; tracked, TF 2.12's loader cannot restore it). Here the pieces come from
        `split_and_merge` (stateless) and map to ids through the vocabulary table."""
        words, pieces = self.split_and_merge(inputs)  # [B, (W)], [N, (P)]
        ids = tf.cast(self.piece_ids(pieces.flat_values), self.compute_dtype)
        return merge_rows(words.with_flat_values(pieces.with_flat_values(ids)))

    def split_and_merge(self, inputs, prefixed=False):
        """Strings [B] -> `(words [B, (W)], pieces [N, (P)])`: HF's pre-split words
        (`_split_for_bpe`: with `add_prefix_space`, a part of the text that does not start with
        " " starts with an added one) and the BPE pieces of each of the N words, as GPT-2's
        printable symbols (one symbol per byte of the word). A special token written in the text
        (`<s>`, `<mask>`, ...) is a word of its own and its one piece is itself. With
        `prefixed`, a third output [N] (bool) tells the words that start with an added space.

        Stateless (no cache written): each request's distinct words (`tf.unique`) go once through
        keras-hub's merge-rank loop. `serving_tokenize` maps the pieces to ids;
        `tokenize_with_offsets` also reads their lengths for character offsets."""
        self._maybe_initialized_tf()
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"The tokenizer takes strings, got a tensor of {inputs.dtype.name}.")
        words = _split_for_bpe(inputs, self.unsplittable_tokens, self.add_prefix_space,
                               prefixed)  # (B, (W))
        if prefixed:
            words, added = words
        distinct, index = tf.unique(words.flat_values)  # (U,), (N,)
        special = tf.zeros_like(distinct, dtype=tf.bool)
        for token in self.unsplittable_tokens or ():
            special |= tf.equal(distinct, token)
        # ordinary words: bytes -> GPT-2's printable symbols -> merges
        ordinary = tf.boolean_mask(distinct, ~special)
        merged = self._bpe_merge_tf(self.byte2unicode.lookup(tf.strings.bytes_split(ordinary)))
        # special tokens: one piece each, themselves
        specials = tf.RaggedTensor.from_tensor(tf.boolean_mask(distinct, special)[:, None])
        rows = tf.concat([merged, specials], axis=0)
        num_ordinary = tf.shape(ordinary, out_type=tf.int64)[0]
        special_64 = tf.cast(special, tf.int64)
        order = tf.where(special, num_ordinary + tf.cumsum(special_64) - 1,
                         tf.cumsum(1 - special_64) - 1)  # word u -> its row in `rows`
        pieces = tf.gather(rows, tf.gather(order, index))  # (N, (P))
        return (words, pieces, added) if prefixed else (words, pieces)

    def get_config(self):
        config = super().get_config()
        config.pop("unsplittable_tokens", None)
        config.update({f"{r}_token": getattr(self, f"{r}_token", None) for r in self.ROLES})
        config["added_tokens"] = list(self.added_tokens)
        return config


def _documents_iterator(documents, batch_size=1024):
    """Python strings from a tf.data.Dataset of strings, a list of strings, or any iterable."""
    if isinstance(documents, tf.data.Dataset):
        for batch in documents.batch(batch_size).as_numpy_iterator():
            for text in batch:
                yield text.decode("utf-8")
    elif isinstance(documents, str):
        raise TypeError("documents must be a tf.data.Dataset or an iterable of strings, not a str.")
    else:
        for text in documents:
            yield text.decode("utf-8") if isinstance(text, bytes) else text


def train_byte_pair_vocabulary(
    documents,
    vocabulary_size,
    output_dir=None,
    min_frequency=2,
    special_tokens=ROBERTA_SPECIAL_TOKENS,
):
    """Learns a byte-level BPE vocabulary (RoBERTa / GPT-2 style) from a corpus.

    HF `tokenizers`' `ByteLevelBPETokenizer` trainer (GPT-2's pre-split regex, the 256 byte
    symbols as the base alphabet, no prefix space). The special tokens take the first ids, in
    order: by default `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3 as in RoBERTa (fairseq's
    dictionary), then `<mask>`=4 (RoBERTa puts it last; the id does not matter to the model).

    Args:
        documents: a `tf.data.Dataset` of strings or an iterable of strings.
        vocabulary_size: total size including the special tokens.
        output_dir: if given, writes `vocab.json` and `merges.txt` there (the files HF's
            `RobertaTokenizer` and our `BytePairTokenizer` read).
        min_frequency: pairs seen fewer times are not merged.

    Returns: `(vocabulary, merges)`: a `{token: id}` dict and a list of "a b" rules.
    """
    from tokenizers import ByteLevelBPETokenizer

    if vocabulary_size <= len(special_tokens) + 256:
        raise ValueError(
            f"vocabulary_size={vocabulary_size} leaves no room for merges after the 256 byte "
            f"symbols and {len(special_tokens)} special tokens."
        )
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        _documents_iterator(documents),
        vocab_size=vocabulary_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        show_progress=False,
    )
    model = json.loads(bpe._tokenizer.to_str())["model"]
    vocabulary = dict(model["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        bpe.save_model(output_dir)
    return vocabulary, merges


# === SentencePiece (ALBERT) ===


# `" ".join(text.split())`: Python's whitespace (str.isspace) includes U+001C..U+001F, U+0085.
PYTHON_WHITESPACE = r"[\t-\r\x{1c}-\x{20}\x{85}\p{Z}]"


def albert_normalize(texts, lowercase=True, keep_accents=False):
    """ALBERT's `preprocess_text` (google-research/albert, HF `AlbertTokenizer`) in TF ops.

    Whitespace runs become one space (Python's `str.split`); "``" and "''" become '"'; unless `keep_accents`: NFKD and combining marks (Mn) removed;
    lowercase. The dummy prefix and NFKC are the SentencePiece model's own normalization
    (nmt_nfkc), applied by the model.
    """
    shape = tf.shape(texts)
    texts = tf.strings.strip(tf.strings.regex_replace(texts, PYTHON_WHITESPACE + "+", " "))
    texts = tf.strings.regex_replace(texts, "``|''", '"')
    if not keep_accents:
        texts = tf_text.normalize_utf8(texts, "NFKD")
        texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
    if lowercase:
        texts = tf.strings.regex_replace(texts, "Σ", "σ")  # per character, as Python's lower()
        # tf.strings.lower ends a string at its first NUL: lowercase the parts between NULs.
        # (The NULs go back as tensor values: a string attribute would end at the NUL too.)
        parts = tf.strings.split(tf.reshape(texts, [-1]), "\x00")
        part_row, part_index = rows_and_index(parts.row_splits)
        last = tf.equal(part_index + 1, tf.gather(parts.row_limits(), part_row))
        nul = tf.where(last, "", tf.constant("\x00"))
        texts = tf.strings.reduce_join(parts.with_flat_values(tf.strings.join(
            [tf.strings.lower(parts.flat_values, encoding="utf-8"), nul])), axis=-1)
        texts = tf.reshape(texts, shape)
    return texts


class SentencePieceTokenizer(_SpecialTokens, keras_hub.tokenizers.SentencePieceTokenizer):
    """ALBERT's SentencePiece tokenizer, giving HF `AlbertTokenizer`'s ids (Lan et al. 2020).

    keras-hub's tokenizer (tf-text's SentencePiece kernel) after ALBERT's text preprocessing
    (`albert_normalize`: quotes, NFKD + accent stripping, lowercasing when `lowercase`), with ALBERT's special
    tokens by role: `[CLS]`, `[SEP]`, `<pad>`, `[MASK]`, `<unk>`. Word starts carry `▁`.

    Like the original (and HF's slow, SentencePiece-based `AlbertTokenizer`), a piece ending in
    a digit followed by a comma ("▁1990,") is re-encoded as the number and a separate ",".
    HF's current, tokenizers-based `AlbertTokenizer` does neither that nor SentencePiece's
    tie-breaking between equal-score segmentations ("......"): it can differ on such text.

    Args:
        proto: a SentencePiece model file path or its bytes.
        lowercase: lowercase the text. False by default, as keras-hub's tokenizer (the text goes
            to the SentencePiece model as it is); ALBERT's uncased presets set True.
        keep_accents: keep accents (False: NFKD and drop combining marks, as ALBERT).
        cls_token ... unk_token: the model's special pieces.
        split_user_defined: cut a text at each user-defined piece of the model (SentencePiece's
            `user_defined_symbols`), found as written, and read the text on each side of it as
            a text of its own, as HF's tokenizers read their added tokens (transformers 5 makes
            each user-defined piece one). False (keras-hub's reading): the text is read whole,
            the SentencePiece model finding the pieces in it. A tokenizer loaded from an HF
            directory sets it.

    Example:
    >>> tok = SentencePieceTokenizer("spiece.model")  # doctest: +SKIP
    >>> tok(["The quick brown fox."])  # doctest: +SKIP
    """

    kind = "sentencepiece"
    # keras-hub's SentencePieceTokenizer example trains a model with SentencePiece's defaults
    # (<unk>, <s>, </s>). XLNetTokenizer (its pieces always there) sets none.
    optional_defaults = dict(cls="[CLS]", sep="[SEP]", pad="<pad>", mask="[MASK]")

    def __init__(
        self,
        proto=None,
        lowercase=False,
        keep_accents=False,
        sequence_length=None,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="<pad>",
        mask_token="[MASK]",
        unk_token="<unk>",
        split_user_defined=False,
        **kwargs,
    ):
        self.lowercase = lowercase
        self.keep_accents = keep_accents
        self.split_user_defined = bool(split_user_defined)
        tokens = dict(cls=cls_token, sep=sep_token, pad=pad_token, mask=mask_token, unk=unk_token)
        pieces = None
        if proto is not None:
            import sentencepiece as spm

            data = proto
            if isinstance(proto, str) and os.path.exists(proto):
                with open(proto, "rb") as f:
                    data = f.read()
            elif isinstance(proto, str):
                raise FileNotFoundError(f"SentencePiece model file {proto!r} does not exist.")
            sp = spm.SentencePieceProcessor(model_proto=data)
            pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
            proto = data
        self._declare_special_tokens(pieces, tokens)
        kwargs.pop("_allow_python_workflow", None)
        super().__init__(
            proto=proto, sequence_length=sequence_length, _allow_python_workflow=False, **kwargs
        )
        self._read_proto()

    def set_proto(self, proto):
        super().set_proto(proto)
        self._drop_traced_calls()
        if "tokens_read_alone" in self.__dict__:  # a later set_proto (load_assets)
            self._read_proto()

    def _read_proto(self):
        """What the tokenizer derives from its model, once a model is set (in `__init__`, and
        again at a later `set_proto`): the `tokens_read_alone`."""
        self._set_tokens_read_alone()

    def _set_tokens_read_alone(self):
        object.__setattr__(self, "tokens_read_alone", self._pieces_read_alone())

    def _pieces_read_alone(self, ids=()):
        """The pieces of `ids` and, with `split_user_defined`, the model's user-defined pieces,
        those SentencePiece reads from a text (neither control, unknown nor unused)."""
        if self.proto is None:
            return ()
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2

        model = spm.SentencePieceProcessor(model_proto=self.proto)
        ids = set(ids)
        if self.split_user_defined:
            user = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
            ids.update(i for i, p in enumerate(
                sentencepiece_model_pb2.ModelProto.FromString(self.proto).pieces)
                if p.type == user)
        return tuple(model.id_to_piece(i) for i in sorted(ids)
                     if not (model.is_control(i) or model.is_unknown(i) or model.is_unused(i)))

    def rebuild_resource(self):
        """Rebuilds tf-text's SentencePiece model resource (`live_sentence_piece` does when it is
        gone)."""
        if self.proto is not None:
            self._set_proto_tf(self.proto)
            self._drop_traced_calls()
            object.__setattr__(self, "_generation", self.__dict__.get("_generation", 0) + 1)

    def resource_generation(self):
        self.live_sentence_piece()
        return self.__dict__.get("_generation", 0)

    def live_sentence_piece(self):
        """tf-text's SentencePiece tokenizer, its model resource rebuilt first if it is gone.

        `keras.utils.set_random_seed` (`tf.random.set_seed`) clears TF's eager kernel cache,
        which deletes the resource: a task built before seeding failed at `fit`, `predict` or a
        tokenizer call with "Resource ... SentencepieceResource does not exist" (keras-hub's
        tokenizer does). Every use checks it (one eager op, outside any graph being traced), and
        functions traced with the old one are traced anew (`resource_generation`).
        """
        self._check_vocabulary()
        self._maybe_initialized_tf()
        with tf.init_scope():
            try:
                self._sentence_piece.vocab_size()
            except tf.errors.NotFoundError:
                self.rebuild_resource()
        return self._sentence_piece

    def serving_resources(self):
        """tf-text's SentencePiece model resource, for the SavedModel to track (untracked, saving
        fails with "references an 'untracked' resource")."""
        return [self.live_sentence_piece()]

    def detokenize(self, inputs):
        self.live_sentence_piece()
        return super().detokenize(inputs)

    def tokenize(self, inputs):
        sp = self.live_sentence_piece()
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"The tokenizer takes strings, got a tensor of {inputs.dtype.name}.")
        unbatched = inputs.shape.rank == 0
        if unbatched:
            inputs = inputs[tf.newaxis]
        tokens = self.read_around_tokens(valid_utf8(inputs), lambda texts: self.tokenize_normalized(
            sp, albert_normalize(texts, self.lowercase, self.keep_accents)))  # (B, (P))
        if self.sequence_length:
            tokens = tokens.to_tensor(self.pad_token_id, shape=[None, self.sequence_length])
        return tokens[0] if unbatched else tokens

    # Pieces read alone: cut out of a text as written, the parts between them tokenized as texts
    # of their own, as HF's tokenizers read the text around their added tokens: the model's
    # user-defined pieces with `split_user_defined` (XLNet's, and a tokenizer loaded from an HF
    # directory), none without (keras-hub's tokenizer reads a text whole; ALBERT's special
    # pieces are control pieces, which SentencePiece never reads from a text).
    tokens_read_alone = ()

    def read_around_tokens(self, texts, read, offsets=False):
        """Texts [B] (valid UTF-8) -> ragged [B, (P)] ids: `read` ([S] texts -> [S, (P)] ids) of
        each text, the `tokens_read_alone` cut out of it first (`_cut_at_tokens`: as written,
        before any normalization, as HF finds its added tokens), each one piece, its id, and
        each part between them read as a text of its own. With `offsets`, `read` gives
        `(ids, starts, ends)` in characters of its text, and so does this (a token spans its
        characters)."""
        tokens = list(self.tokens_read_alone)
        if not tokens:
            return read(texts)
        parts, which = _cut_at_tokens(texts, tokens)  # (B, (S))
        kind = which.flat_values
        is_token = kind >= 0
        out = read(tf.where(is_token, "", parts.flat_values))  # (S, (P)): a token's part none
        out = out if offsets else (out,)
        token_ids = tf.constant([self.token_to_id(t) for t in tokens], out[0].dtype)
        alone = [tf.gather(token_ids, tf.maximum(kind, 0))]  # (S,) what a token's part gives
        if offsets:  # characters of the part -> of its text
            length = tf.strings.length(parts.flat_values, unit="UTF8_CHAR")  # (S,)
            before = tf.cumsum(length, exclusive=True)
            start = before - tf.gather(before, tf.gather(parts.row_starts(),
                                                         row_ids(parts.row_splits)))
            out = [out[0]] + [o.with_flat_values(o.flat_values + tf.cast(tf.gather(
                start, row_ids(o.row_splits)), o.dtype)) for o in out[1:]]
            alone += [tf.cast(start, out[1].dtype), tf.cast(start + length, out[2].dtype)]

        def assemble(pieces, token):  # (S, (P)), (S,) -> (B, (T))
            token = tf.RaggedTensor.from_row_lengths(
                tf.boolean_mask(token, is_token), tf.cast(is_token, tf.int64), validate=False)
            return merge_rows(tf.RaggedTensor.from_row_splits(
                tf.concat([pieces, token], axis=1), parts.row_splits, validate=False))

        out = tuple(assemble(o, a) for o, a in zip(out, alone))
        return out if offsets else out[0]

    def tokenize_normalized(self, sp, texts, offsets=False):
        """Normalized texts [B] -> ragged [B, (P)] ids (with `offsets`: `(ids, starts, ends)`,
        the pieces' byte offsets into the texts): tf-text's SentencePiece `sp` and the "1990,"
        fix-up."""
        out = sp.tokenize_with_offsets(texts) if offsets else (sp.tokenize(texts),)
        return self._split_digit_comma(*out)

    def _split_digit_comma(self, ids, starts=None, ends=None):
        """ALBERT's `encode_pieces` fix-up: a piece ending in digit + "," ("▁1990,") is re-encoded
        without its "▁"s and followed by a separate ","; if the piece did not start a word, the
        first new piece loses its "▁" (dropped entirely when it is "▁" alone). Vectorized:
        ragged (B, (P)) ids -> ragged (B, (P')) ids.

        With `starts` / `ends` (the pieces' byte offsets into the tokenized text, as tf-text's
        `tokenize_with_offsets` gives them) it returns `(ids, starts, ends)`: the "," covers the
        piece's last byte and the new pieces their bytes of the number before it."""
        sp = self._sentence_piece
        flat = ids.flat_values  # (N,)
        pieces = sp.id_to_string(flat)  # (N,)
        quirk = tf.strings.regex_full_match(pieces, r"(?s).*\p{Nd},")
        q_index = tf.where(quirk)[:, 0]  # (Q,): the quirk pieces
        q_pieces = tf.gather(pieces, q_index)
        core = tf.strings.regex_replace(tf.strings.regex_replace(q_pieces, ",$", ""), "\u2581", "")
        with_offsets = starts is not None
        if with_offsets:
            sub, sub_start, sub_end = sp.tokenize_with_offsets(core)  # (Q, (k)), bytes of core
        else:
            sub = sp.tokenize(core)  # (Q, (k))
        sub = tf.cast(sub, flat.dtype)
        nonempty = sub.row_lengths() > 0  # (Q,)
        first_id = tf.where(nonempty, tf.gather(tf.pad(sub.flat_values, [[0, 1]]),
                                                sub.row_starts()), 0)  # (Q,)
        first = sp.id_to_string(first_id)
        fix = nonempty & tf.strings.regex_full_match(first, "\u2581.*") & (
            ~tf.strings.regex_full_match(q_pieces, "\u2581.*"))
        stripped = tf.strings.regex_replace(first, "^\u2581", "")
        drop = fix & tf.equal(stripped, "")
        new_first = tf.cast(sp.string_to_id(stripped), flat.dtype)
        keep_head = ~drop & nonempty
        # Each output piece's source, as one index into [the N pieces, the K sub-pieces, Q
        # commas] (plain tensors; ragged concats and gathers made the traced tokenizer 520 ops
        # instead of 272, 2,199 instead of 963 with offsets, and 2-3x as slow to trace). A
        # plain piece stays one piece; a quirk piece becomes [its first sub-piece unless
        # dropped] + its other sub-pieces + [","].
        n = tf.shape(flat, out_type=tf.int64)[0]
        keep = tf.cast(keep_head, tf.int64)
        q_length = keep + tf.maximum(sub.row_lengths() - 1, 0) + 1  # (Q,)
        length = tf.tensor_scatter_nd_add(tf.ones([n], tf.int64), q_index[:, None], q_length - 1)
        end = tf.cumsum(length)  # (N,): where each piece's output ends
        q_start = tf.gather(end - length, q_index)  # (Q,)
        row, index = rows_and_index(sub.row_splits)  # (K,): each sub-piece's quirk piece
        k = tf.size(row, out_type=tf.int64)
        j = index - tf.gather(sub.row_starts(), row)  # its place in the piece
        taken = tf.where((j > 0) | tf.gather(keep_head, row))[:, 0]  # the kept sub-pieces
        plain = tf.where(~quirk)[:, 0]
        sub_position = tf.gather(q_start, row) + tf.where(j > 0, tf.gather(keep, row) + j - 1, 0)
        source = tf.scatter_nd(
            tf.concat([tf.gather(end - 1, plain), tf.gather(sub_position, taken),
                       q_start + q_length - 1], axis=0)[:, None],
            tf.concat([plain, n + taken, n + k + tf.range(tf.size(q_index, out_type=tf.int64))],
                      axis=0),
            tf.reshape(tf.reduce_sum(length), [1]))
        row_splits = tf.cast(tf.gather(tf.pad(end, [[1, 0]]), ids.row_splits),
                             ids.row_splits.dtype)

        def assemble(values, sub_values, comma):  # (N,), (K,), (Q,) -> (B, (P'))
            return tf.RaggedTensor.from_row_splits(
                tf.gather(tf.concat([values, sub_values, comma], axis=0), source), row_splits,
                validate=False)

        head = tf.gather(tf.where(fix, new_first, first_id), row)
        comma_id = tf.fill(tf.shape(q_index), tf.cast(sp.string_to_id(","), flat.dtype))
        new_ids = assemble(flat, tf.where(j == 0, head, sub.flat_values), comma_id)
        if not with_offsets:
            return new_ids
        # The number is the text just before the ",": its pieces' offsets shift there (kept
        # inside the piece, should SentencePiece's own normalization have changed the number).
        q_start_byte = tf.gather(starts.flat_values, q_index)
        q_end = tf.gather(ends.flat_values, q_index)
        base = q_end - 1 - tf.cast(tf.strings.length(core), tf.int64)

        def shifted(sub_offsets):  # (Q, (k)) bytes of core -> (K,) bytes of the text
            return tf.clip_by_value(sub_offsets.flat_values + tf.gather(base, row),
                                    tf.gather(q_start_byte, row), tf.gather(q_end, row) - 1)

        new_starts = assemble(starts.flat_values, shifted(sub_start), q_end - 1)
        new_ends = assemble(ends.flat_values, shifted(sub_end), q_end)
        return new_ids, new_starts, new_ends

    def get_config(self):
        config = super().get_config()
        config.update(lowercase=self.lowercase, keep_accents=self.keep_accents,
                      split_user_defined=self.split_user_defined)
        config.update({f"{r}_token": getattr(self, f"{r}_token", None) for r in self.ROLES})
        return config


def _train_sentencepiece(documents, output_file, lowercase, keep_accents, **trainer_args):
    """The `sentencepiece` trainer on normalized text, one sentence a line; `trainer_args` are the
    recipe's (ids, symbols, sizes). Returns the model's bytes and writes them to `output_file`."""
    import io

    import sentencepiece as spm

    from keras_bertfam.preprocessing.corpus import split_sentences

    if isinstance(documents, tf.data.Dataset):
        ds = documents
    else:
        ds = tf.data.Dataset.from_tensor_slices(list(_documents_iterator(documents)))
    sentences = ds.batch(256).map(tf.autograph.experimental.do_not_convert(  # plain TF ops
        lambda t: albert_normalize(split_sentences(t).flat_values, lowercase, keep_accents)
    )).unbatch()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_documents_iterator(sentences),
        model_writer=model,
        shuffle_input_sentence=True,
        minloglevel=2,
        **trainer_args,
    )
    proto = model.getvalue()
    if output_file is not None:
        with open(output_file, "wb") as f:
            f.write(proto)
    return proto


def train_sentencepiece_model(
    documents,
    vocabulary_size,
    output_file=None,
    lowercase=True,
    keep_accents=False,
    model_type="unigram",
    character_coverage=0.99995,
    user_defined_symbols=(),
    input_sentence_size=1_000_000,
    seed_sentencepiece_size=1_000_000,
    num_threads=2,
):
    """Trains a SentencePiece model on a corpus, with ALBERT's recipe (google-research/albert).

    The `sentencepiece` trainer on ALBERT-normalized text (`albert_normalize`), one sentence per
    line (`split_sentences`), with ALBERT's ids: `<pad>`=0, `<unk>`=1, `[CLS]`=2, `[SEP]`=3,
    `[MASK]`=4 (control symbols, so "[MASK]" written in a text is not the mask piece), no
    BOS/EOS. Word starts carry `▁`; numbers are split from other characters.

    ALBERT's recipe also forced `( ) " - . – £ €` as user-defined symbols; pass them with
    `user_defined_symbols=` to reproduce it, but note that HF's current (tokenizers-based)
    `AlbertTokenizer` segments text around user-defined symbols differently from SentencePiece
    ("legs (for" -> "▁(" + "for" in SentencePiece, "(" + "▁for" in HF): our tokenizer reads
    them as HF's with `split_user_defined=True` (set when loaded from an HF directory), as
    SentencePiece (and keras-hub) without; with the default (none) all agree.

    Args:
        documents: a `tf.data.Dataset` of strings or an iterable of strings.
        vocabulary_size: total number of pieces (30000 in ALBERT).
        output_file: if given, the model is written there (e.g. "spiece.model").
        lowercase, keep_accents: the normalization of the tokenizer that will use the model.
        model_type: "unigram" (ALBERT) or "bpe".

    Returns: the serialized model (bytes), for `SentencePieceTokenizer(proto=...)`.
    """
    return _train_sentencepiece(
        documents, output_file, lowercase, keep_accents,
        vocab_size=vocabulary_size,
        model_type=model_type,
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        user_defined_symbols=list(user_defined_symbols),
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
        seed_sentencepiece_size=seed_sentencepiece_size,
        num_threads=num_threads,
    )


# === SentencePiece (XLNet) ===

# XLNet's pieces (zihangdai/xlnet: `spm_train ... --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>
# --user_defined_symbols=<eop>,...`): <unk>=0, <s>=1, </s>=2, <cls>=3, <sep>=4, <pad>=5, <mask>=6,
# <eod>=7, <eop>=8.
XLNET_CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
XLNET_EXTRA_ROLES = {"bos": "<s>", "eos": "</s>", "eod": "<eod>", "eop": "<eop>"}


class XLNetTokenizer(SentencePieceTokenizer):
    """XLNet's SentencePiece tokenizer, giving HF `XLNetTokenizer`'s ids (Yang et al. 2019).

    The same algorithm as ALBERT's (`SentencePieceTokenizer`): XLNet's `preprocess_text`
    (whitespace runs to one space, "``" / "''" to '"', NFKD and accents dropped unless
    `keep_accents`, lowercase only when `lowercase`: XLNet is cased) and the "1990," fix-up (a
    piece ending in a digit and a comma is re-encoded as the number and a separate ","), both in
    TF ops. What differs is the special pieces: `<cls>`, `<sep>`, `<pad>`, `<mask>`, `<unk>` by
    role, plus `bos_token_id` (`<s>`), `eos_token_id` (`</s>`), `eod_token_id` (`<eod>`, the
    original's end-of-document marker) and `eop_token_id` (`<eop>`) when the model has them.
    XLNet puts `<cls>` at the END of a sequence (`A <sep> B <sep> <cls>`) and pads on the left:
    that is `xlnet_pack`'s job, the tokenizer returns ids without special tokens.

    `<eop>` written in a text (a user-defined piece of XLNet's models) is its id, and the text
    on each side of it is read as a text of its own, as HF's `XLNetTokenizer` reads it ("a <eop>
    b" and "a<eop>b": "▁a", "<eop>", "▁b"); so is every user-defined piece of a model of one's
    own (`split_user_defined`: found as written, before normalization); the control pieces
    (`<cls>`, `<sep>`, `<mask>`, `<eod>`, ...) written in a text are split into pieces (HF reads
    their ids). `keep_accents=True` keeps accents, as the original and transformers 4's
    `XLNetTokenizer` did (transformers 5's strips them whatever its `keep_accents`).

    Args:
        proto: a SentencePiece model file (`spiece.model`) or its bytes.
        lowercase: lowercase the text (False for XLNet's cased models).
        keep_accents: keep accents (False: NFKD and drop combining marks, as XLNet).
        cls_token ... unk_token: the model's special pieces.
        split_user_defined: cut a text at every user-defined piece of the model, as HF's
            `XLNetTokenizer` (True); False cuts at the user-defined special pieces only
            (`<eop>`).

    Example:
    >>> tok = XLNetTokenizer("spiece.model")  # doctest: +SKIP
    >>> tok(["Hello world, in 1990, yes"])  # doctest: +SKIP
    """

    optional_defaults = {}  # its special pieces are the pretraining's: each must be there

    def __init__(
        self,
        proto=None,
        lowercase=False,
        keep_accents=False,
        sequence_length=None,
        cls_token="<cls>",
        sep_token="<sep>",
        pad_token="<pad>",
        mask_token="<mask>",
        unk_token="<unk>",
        split_user_defined=True,
        **kwargs,
    ):
        for role in XLNET_EXTRA_ROLES:
            kwargs.pop(f"{role}_token", None)
        super().__init__(
            proto=proto, lowercase=lowercase, keep_accents=keep_accents,
            sequence_length=sequence_length, cls_token=cls_token, sep_token=sep_token,
            pad_token=pad_token, mask_token=mask_token, unk_token=unk_token,
            split_user_defined=split_user_defined, **kwargs)

    def _read_proto(self):
        self._set_extra_roles()

    def _set_extra_roles(self):
        """`<s>`, `</s>`, `<eod>`, `<eop>` ids (None when the model lacks the piece), and
        `tokens_read_alone` (`_set_tokens_read_alone`)."""
        vocabulary = set(self.get_vocabulary()) if self.proto is not None else set()
        for role, token in XLNET_EXTRA_ROLES.items():
            present = token in vocabulary
            setattr(self, f"{role}_token", token if present else None)
            setattr(self, f"{role}_token_id", self.token_to_id(token) if present else None)
        self._set_tokens_read_alone()

    def _set_tokens_read_alone(self):
        """The special pieces that SentencePiece reads from a text (XLNet's user-defined `<eop>`)
        and, with `split_user_defined` (XLNet's default), every user-defined piece: HF's
        `XLNetTokenizer` reads the text on each side of one as a text of its own ("a <eop>b":
        "▁a", "<eop>", "▁b"; SentencePiece alone "▁a", "▁", "<eop>", "b")."""
        object.__setattr__(self, "tokens_read_alone", self._pieces_read_alone(
            self.special_token_ids if self.proto is not None else ()))

    @property
    def special_token_ids(self):
        ids = set(super().special_token_ids)
        ids.update(getattr(self, f"{r}_token_id") for r in XLNET_EXTRA_ROLES
                   if getattr(self, f"{r}_token_id", None) is not None)
        return sorted(ids)


def train_xlnet_sentencepiece_model(
    documents,
    vocabulary_size,
    output_file=None,
    lowercase=False,
    keep_accents=False,
    user_defined_symbols=("<eop>",),
    character_coverage=0.99995,
    input_sentence_size=1_000_000,
    num_threads=2,
):
    """Trains a SentencePiece unigram model with XLNet's recipe (zihangdai/xlnet README).

    On XLNet-preprocessed text (cased by default), one sentence a line, with XLNet's ids:
    `<unk>`=0, `<s>`=1, `</s>`=2, then the control symbols `<cls>`=3, `<sep>`=4, `<pad>`=5,
    `<mask>`=6, `<eod>`=7 and the user-defined `<eop>`=8. The original also forced
    `. ( ) " - – £ €` as user-defined symbols: pass them in `user_defined_symbols` to reproduce it
    (`XLNetTokenizer` then reads the text around them as HF's tokenizers-based `XLNetTokenizer`
    does, differently from SentencePiece alone, as noted for ALBERT in
    `train_sentencepiece_model`).

    Returns: the serialized model (bytes), for `XLNetTokenizer(proto=...)`.
    """
    return _train_sentencepiece(
        documents, output_file, lowercase, keep_accents,
        vocab_size=vocabulary_size,
        model_type="unigram",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        control_symbols=list(XLNET_CONTROL_SYMBOLS),
        user_defined_symbols=list(user_defined_symbols),
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
        num_threads=num_threads,
    )


# Tasks saved as `.keras` files serialize their preprocessor's tokenizer (its vocabulary travels as
# an asset), so every tokenizer class is registered, under our package name: unregistered, a
# RoBERTa, ALBERT or XLNet task saved with `model.save` could not be loaded back.
for _cls in (WordPieceTokenizer, BytePairTokenizer, SentencePieceTokenizer, XLNetTokenizer):
    if keras.saving.get_registered_object(f"keras_bertfam>{_cls.__name__}") is None:
        keras.saving.register_keras_serializable(package="keras_bertfam")(_cls)
