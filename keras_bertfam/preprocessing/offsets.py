"""WordPiece tokenization with character offsets into the *original* text (for span-extraction QA).

Our `WordPieceTokenizer` normalizes whole strings (HF's cleaning, lowercasing, NFD, accent
stripping) before keras-hub splits them into words, so the offsets tf-text would report are
offsets into the normalized text, which can be shorter or longer than the original (a dropped
zero-width character, a decomposed accent, `İ` lowercasing to two characters). Here the order is
reversed, with the same ids:

1. split the original text into words with byte offsets (whitespace is HF's: `\\t \\n \\r` and
   `\\p{Zs}`; punctuation and CJK characters are words of their own, keras-hub's patterns);
2. normalize each word alone (`bert_normalize`) and WordPiece it with tf-text's
   `FastWordpieceTokenizer.tokenize_with_offsets` (offsets within the normalized word);
3. map each piece back exactly: the word is normalized one character at a time (HF's
   normalization is per character), so each normalized character knows the original character it
   came from; a piece spans from the original character of its first normalized character to
   that of its last (a dropped zero-width character or a stripped combining accent at a piece's
   edge is outside it, as in HF's fast tokenizer).

Offsets are in Unicode characters (Python `str` indices), `[start, end)`. Everything is TF ops,
vectorized over the batch.
"""
import tensorflow as tf
import tensorflow_text as tf_text

from keras_bertfam.preprocessing.tokenizers import bert_normalize

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


def tokenize_with_offsets(tokenizer, texts):
    """Strings [B] -> (ids [B, (T)], starts [B, (T)], ends [B, (T)]) with character offsets.

    The ids equal `tokenizer(texts)`'s (tested against HF `BertTokenizerFast`, whose offsets the
    starts/ends equal on accented and odd characters).
    """
    if getattr(tokenizer, "kind", None) != "wordpiece":
        raise NotImplementedError(
            f"Character offsets are implemented for WordPiece tokenizers; got "
            f"{type(tokenizer).__name__}."
        )
    texts = tf.convert_to_tensor(texts)
    if texts.dtype != tf.string:
        raise TypeError(f"tokenize_with_offsets takes strings, got {texts.dtype.name}.")
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
    # [B, (W), (P)] -> [B, (T)]
    nested = words.with_flat_values(ids)
    token_ids = nested.merge_dims(1, 2)
    return (token_ids, token_ids.with_flat_values(starts), token_ids.with_flat_values(ends))
