"""Tokenization with character offsets into the *original* text (for span-extraction QA).

Offsets are in Unicode characters (Python `str` indices), `[start, end)`, as HF's fast tokenizers
report them (`return_offsets_mapping=True`); the ids are the tokenizer's own. Everything is TF ops,
vectorized over the batch, with no state (it runs in `tf.data` and in exported SavedModels).

WordPiece (BERT). Our `WordPieceTokenizer` normalizes whole strings (HF's cleaning,
lowercasing, NFD, accent stripping) before keras-hub splits them into words, so the offsets
tf-text would report are offsets into the normalized text, which can be shorter or longer than
the original (a dropped zero-width character, a decomposed accent, `İ` lowercasing to two
characters). Here the order is reversed, with the same ids:

1. split the original text into words with byte offsets (whitespace is HF's: `\\t \\n \\r` and
   `\\p{Zs}`; punctuation and CJK characters are words of their own, keras-hub's patterns);
2. normalize each word alone (`bert_normalize`) and WordPiece it with tf-text's
   `FastWordpieceTokenizer.tokenize_with_offsets` (offsets within the normalized word);
3. map each piece back exactly: the word is normalized one character at a time (HF's
   normalization is per character), so each normalized character knows the original character it
   came from; a piece spans from the original character of its first normalized character to
   that of its last (a dropped zero-width character or a stripped combining accent at a piece's
   edge is outside it, as in HF's fast tokenizer).

Byte-level BPE (RoBERTa, Longformer). No normalization, so offsets come from lengths alone:

1. the tokenizer's own pre-split and merges (`BytePairTokenizer.split_and_merge`, the ids'
   source); the words concatenate back to the text, so each word starts where the words
   before it end;
2. a piece is a substring of its word's byte-to-symbol mapping (one symbol per byte), so it
   covers as many bytes of the word as it has symbols;
3. as HF's `ByteLevel(trim_offsets=True)` (RoBERTa's fast tokenizer, the one HF's QA pipelines
   read): leading and trailing spaces (`Ġ`) are cut off a piece's span, so `Ġworld` starts at
   `w` and a piece of spaces only is empty, at its end;
4. bytes to characters within the word: a piece starts at the character holding its first
   byte and ends after the character holding its last, so the pieces of one multi-byte
   character (an emoji, a CJK character) all span that whole character, as in HF.

keras-hub's pre-split (and so the BPE tokenizer) drops a literal `६` (U+0966, its look-ahead
marker) and reads `ĴA`, `ĴB`, ... as the special tokens they stand for internally: on such text
the ids differ from HF's, and the words no longer concatenate back to it, so the offsets after
it are off too.
"""
import tensorflow as tf
import tensorflow_text as tf_text

from keras_bertfam.preprocessing.tokenizers import bert_normalize, merge_rows

_WHITESPACE = r"[\t\n\r\p{Zs}]"
_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|[\p{P}]"
_CJK = (r"[\x{4E00}-\x{9FFF}]|[\x{3400}-\x{4DBF}]|[\x{20000}-\x{2A6DF}]|[\x{2A700}-\x{2B73F}]"
        r"|[\x{2B740}-\x{2B81F}]|[\x{2B820}-\x{2CEAF}]|[\x{F900}-\x{FAFF}]|[\x{2F800}-\x{2FA1F}]")
_SPLIT = "|".join([_WHITESPACE, _PUNCTUATION, _CJK])
_KEEP = "|".join([_PUNCTUATION, _CJK])


def _char_index(strings, byte_offsets):
    """Characters in `strings[:byte_offsets]` (same shapes)."""
    return tf.strings.length(tf.strings.substr(strings, tf.zeros_like(byte_offsets),
                                               byte_offsets), unit="UTF8_CHAR")


def _strings(texts):
    texts = tf.convert_to_tensor(texts)
    if texts.dtype != tf.string:
        raise TypeError(f"tokenize_with_offsets takes strings, got {texts.dtype.name}.")
    return texts


def _per_text(words, pieces, starts, ends):
    """The pieces [N, (P)] of the N words of texts [B, (W)] and their M flat offsets ->
    (ids, starts, ends), each [B, (T)]."""
    token_ids = merge_rows(words.with_flat_values(pieces))
    return token_ids, token_ids.with_flat_values(starts), token_ids.with_flat_values(ends)


def tokenize_with_offsets(tokenizer, texts):
    """Strings [B] -> (ids [B, (T)], starts [B, (T)], ends [B, (T)]) with character offsets.

    For WordPiece and byte-level BPE tokenizers (see the module docstring for how each maps its
    pieces back to the original text). The ids equal `tokenizer(texts)`'s and the offsets HF's
    fast tokenizers' (tested against `BertTokenizerFast` and `RobertaTokenizerFast` with
    `trim_offsets=True` on accented, CJK, emoji, whitespace and special-token text).
    """
    kind = getattr(tokenizer, "kind", None)
    if kind == "wordpiece":
        return _wordpiece_offsets(tokenizer, _strings(texts))
    if kind == "byte_pair":
        return _byte_pair_offsets(tokenizer, _strings(texts))
    raise NotImplementedError(
        f"Character offsets are implemented for WordPiece and byte-level BPE tokenizers; got "
        f"{type(tokenizer).__name__}."
    )


def _wordpiece_offsets(tokenizer, texts):
    texts = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                         replacement_char=0xFFFD)
    # tf-text's regex split stops at NUL; \x01 is dropped by the normalization just as NUL is.
    texts = tf.strings.regex_replace(texts, r"\x00", "\x01")
    words, w_start, w_end = tf_text.regex_split_with_offsets(texts, _SPLIT, _KEEP)  # [B, (W)]
    row_texts = tf.gather(texts, words.value_rowids())  # [N] the text of each word
    word_start = _char_index(row_texts, w_start.flat_values)  # [N] chars

    # Normalize character by character (HF's normalization is per character once Σ is handled),
    # so that each normalized character knows the original character it came from.
    chars = tf.strings.unicode_split(words.flat_values, "UTF-8")  # [N, (C)]
    norm_chars = bert_normalize(chars.flat_values, tokenizer.bert_lowercase)  # [K]
    normalized = tf.strings.reduce_join(chars.with_flat_values(norm_chars), axis=1)  # [N]
    produced = tf.strings.length(norm_chars, unit="UTF8_CHAR")  # [K] chars each one became
    cum = tf.cumsum(produced)  # [K] normalized-char end of each original char (global)
    word_base = tf.gather(tf.concat([[0], cum], 0), chars.row_starts())  # [N]

    tokenizer._maybe_initialized_tf()
    ids, p_start, p_end = tokenizer._fast_word_piece.tokenize_with_offsets(normalized)  # [N, (P)]
    word_of_piece = ids.value_rowids()  # [M]
    piece_words = tf.gather(normalized, word_of_piece)
    start = _char_index(piece_words, tf.cast(p_start.flat_values, tf.int32))  # [M] in the word
    end = _char_index(piece_words, tf.cast(p_end.flat_values, tf.int32))
    base = tf.gather(word_base, word_of_piece)
    # the original character holding normalized char g is the first k with cum[k] > g
    first_char = tf.searchsorted(cum, base + start, side="right", out_type=tf.int32)
    last_char = tf.searchsorted(cum, base + end - 1, side="right", out_type=tf.int32)
    char_base = tf.gather(tf.cast(chars.row_starts(), tf.int32), word_of_piece)
    word_offset = tf.gather(word_start, word_of_piece)
    starts = word_offset + first_char - char_base
    ends = word_offset + last_char - char_base + 1
    return _per_text(words, ids, starts, ends)


_SPACE = "\u0120"  # Ġ, GPT-2's symbol for the space byte


def _byte_pair_offsets(tokenizer, texts):
    words, pieces = tokenizer.split_and_merge(texts)  # [B, (W)], [N, (P)]
    flat_words = words.flat_values
    # 1. the words concatenate back to the text: each starts where the ones before it end
    before = tf.cumsum(tf.strings.length(flat_words, unit="UTF8_CHAR"), exclusive=True)  # [N]
    word_start = before - tf.gather(before, tf.gather(words.row_starts(), words.value_rowids()))
    # 2. bytes of the word each piece covers: one per symbol; a word of one piece (a special
    # token written in the text among them) is covered whole
    symbols = pieces.flat_values  # [M]
    size = tf.strings.length(symbols, unit="UTF8_CHAR")
    word_of_piece = pieces.value_rowids()
    word = tf.gather(flat_words, word_of_piece)
    before = tf.cumsum(size, exclusive=True)
    start = before - tf.gather(before, tf.gather(pieces.row_starts(), word_of_piece))
    whole = tf.equal(tf.gather(pieces.row_lengths(), word_of_piece), 1)
    end = tf.where(whole, tf.strings.length(word), start + size)
    # 3. HF's trim_offsets: leading and trailing spaces are not part of the span
    lead = size - tf.strings.length(tf.strings.regex_replace(symbols, f"^{_SPACE}+", ""),
                                    unit="UTF8_CHAR")
    trail = size - tf.strings.length(tf.strings.regex_replace(symbols, f"{_SPACE}+$", ""),
                                     unit="UTF8_CHAR")
    start = tf.minimum(start + lead, end)
    end = tf.maximum(end - trail, start)
    # 4. bytes -> characters: from the character holding the first byte to after the one
    # holding the last; an empty span sits where it ends
    char_end = _char_index(word, end)
    char_start = tf.where(start < end, _char_index(word, start + 1) - 1, char_end)
    base = tf.gather(word_start, word_of_piece) - int(bool(tokenizer.add_prefix_space))
    ids = pieces.with_flat_values(
        tf.cast(tokenizer.token_to_id_map.lookup(symbols), tokenizer.compute_dtype))
    # the prefix space is not in the text: a span over it starts at 0
    return _per_text(words, ids, tf.maximum(base + char_start, 0), tf.maximum(base + char_end, 0))
