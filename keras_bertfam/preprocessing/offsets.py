"""Tokenization with character offsets into the *original* text (for span-extraction QA).

Offsets are in Unicode characters (Python `str` indices), `[start, end)`, as HF's fast tokenizers
report them (`return_offsets_mapping=True`); the ids are the tokenizer's own. Everything is TF ops,
vectorized over the batch, with no state (it runs in `tf.data` and in exported SavedModels).

WordPiece (BERT). Our `WordPieceTokenizer` normalizes whole strings (HF's cleaning,
lowercasing, NFD, accent stripping) before keras-hub splits them into words, so the offsets
tf-text would report are offsets into the normalized text, which can be shorter or longer than
the original (a dropped zero-width character, a decomposed accent, `İ` lowercasing to two
characters). Here the tokenizer's own steps run (`_tokenize_with_added`), each with offsets:

1. the text is cut at its `added_tokens` (found as written; each spans its characters);
2. each part between them is normalized one character at a time (`bert_normalize` with the
   tokenizer's `lowercase` and `strip_accents`; HF's normalization is per character), so each
   normalized character knows the original character it came from;
3. each normalized part is cut at its `normalized_added_tokens`, the text between them split
   into words (`word_split_patterns`: whitespace, punctuation, CJK characters with
   `split_on_cjk`) and WordPieced with the tokenizer's model, with tf-text's
   `FastWordpieceTokenizer.tokenize_with_offsets`;
4. a token spans from the original character of its first normalized character to that of its
   last (a dropped zero-width character or a stripped combining accent at a piece's edge is
   outside it, as in HF's fast tokenizer).

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

SentencePiece (ALBERT, XLNet). tf-text's SentencePiece kernel reports byte offsets into its
input, the text after ALBERT's normalization (`albert_normalize`), which differs in length from
the original (whitespace runs, "``" -> '"', NFKD, dropped accents). So, as for WordPiece:

1. normalize the original one character at a time (the normalization is per character but for
   whitespace runs, each becoming one space between words and nothing at either end, and the
   quote pairs, whose '"' comes from the pair's second character, as HF aligns it); the
   characters joined are the normalized text, and each normalized byte knows its original
   character;
2. tokenize it with tf-text's `tokenize_with_offsets`, then ALBERT's "1990," fix-up: the number's
   new pieces span its bytes, the "," its own. XLNet's user-defined pieces (`<eop>`, ...) are
   cut out of the original text before all this, each part between them mapped as a text of its
   own (`SentencePieceTokenizer.read_around_tokens`, the tokenizer's own cut);
3. a piece spans from the original character holding its first byte to the one holding its last,
   less the characters SentencePiece reads as nothing at either edge (the space its `▁` stands
   for, a control or zero-width character, a dropped accent, the first character of a quote
   pair); a piece of such characters only (a lone `▁`) spans the first character of its word.
   This is HF's fast tokenizers' mapping (`AlbertTokenizer`, `XLNetTokenizer`): the `▁` is not
   part of a span, and the pieces of a character that NFKD expands ("½" -> "1⁄2") all span it.

Where our ids differ from HF's (SentencePiece's tie-breaking between equal-score segmentations,
"!!!!" as "!!!" + "!" or "!" + "!!!"; the fix-up, which HF's tokenizers-based tokenizers lack),
each piece spans exactly the original characters it came from. So it does with `keep_accents=True`
on decomposed text ("cafe\u0301"), where the SentencePiece model's NFKC composes a letter and its
combining accent into one character: the piece spans both (HF's, the letter alone).

Byte-level BPE words are split as HF's tokenizers split them (tokenizers.py `_split_for_bpe`:
special tokens first, then the prefix space per part, which the offsets leave out of a piece's
span as HF's `trim_offsets=True` does).
"""
import tensorflow as tf

from keras_bertfam.preprocessing.ragged import merge_rows, row_ids
from keras_bertfam.preprocessing.tokenizers import (
    PYTHON_WHITESPACE,
    _cut_at_tokens,
    _id_rows,
    albert_normalize,
    bert_normalize,
    regex_split,
    valid_utf8,
)


def _char_index(strings, rows, *byte_offsets):
    """Strings [S], the string of each of M offsets ([M] `rows`) and byte offsets ([M] each, not
    negative) -> the characters before each offset in its string, [M] int32 each: `tf.strings.
    length(tf.strings.substr(tf.gather(strings, rows), 0, offsets), unit="UTF8_CHAR")`, the bytes
    that are not UTF-8 continuation bytes (`10xxxxxx`), for any bytes.

    Without a copy of its string for each offset: that gather held a copy of a text for each of
    its words (of a word for each of its pieces), memory quadratic in its length (a 40k-word
    context: gigabytes). Here every byte of the batch is read once, as a byte: a running count
    of the characters started before each byte, read at the offsets."""
    lengths = tf.strings.length(strings)  # [S] bytes
    data = tf.io.decode_raw(tf.strings.reduce_join(strings), tf.uint8)  # [T] the bytes, once
    starts_char = tf.cast((data < 0x80) | (data >= 0xC0), tf.int32)
    before = tf.concat([[0], tf.cumsum(starts_char)], 0)  # [T + 1] characters before byte t
    base = tf.gather(tf.cumsum(lengths, exclusive=True), rows)  # [M] each string's first byte
    limit = base + tf.gather(lengths, rows)  # (substr stops at the string's end)
    first = tf.gather(before, base)
    return [tf.gather(before, tf.minimum(base + tf.cast(b, tf.int32), limit)) - first
            for b in byte_offsets]


def _strings(texts):
    texts = tf.convert_to_tensor(texts)
    if texts.dtype != tf.string:
        raise TypeError(f"tokenize_with_offsets takes strings, got {texts.dtype.name}.")
    # Offsets are characters of a text: bytes that are not UTF-8 are no characters (byte-level
    # BPE tokenized them raw, at offsets no reader of the text could slice by)
    return valid_utf8(texts)


def _per_text(words, pieces, starts, ends):
    """The pieces [N, (P)] of the N words of texts [B, (W)] and their M flat offsets ->
    (ids, starts, ends), each [B, (T)]."""
    token_ids = merge_rows(words.with_flat_values(pieces))
    return token_ids, token_ids.with_flat_values(starts), token_ids.with_flat_values(ends)


@tf.autograph.experimental.do_not_convert  # plain TF ops: nothing for AutoGraph to convert
def tokenize_with_offsets(tokenizer, texts):
    """Strings [B] -> (ids [B, (T)], starts [B, (T)], ends [B, (T)]) with character offsets.

    For WordPiece, byte-level BPE and SentencePiece tokenizers (see the module docstring for how
    each maps its pieces back to the original text). Bytes that are not UTF-8 are read as
    U+FFFD first (`valid_utf8`: the text the offsets index, as the tokenizers read it). The ids
    equal `tokenizer(texts)`'s and the offsets HF's fast tokenizers' (tested against
    `BertTokenizerFast` with added tokens, `RobertaTokenizerFast` with `trim_offsets=True`,
    `AlbertTokenizer` and `XLNetTokenizer` on accented, CJK, emoji, whitespace and
    special-token text).
    """
    kind = getattr(tokenizer, "kind", None)
    if kind == "wordpiece":
        return _wordpiece_offsets(tokenizer, _strings(texts))
    if kind == "byte_pair":
        return _byte_pair_offsets(tokenizer, _strings(texts))
    if kind == "sentencepiece":
        return _sentencepiece_offsets(tokenizer, _strings(texts))
    raise NotImplementedError(
        f"Character offsets are implemented for WordPiece, byte-level BPE and SentencePiece "
        f"tokenizers; got {type(tokenizer).__name__}."
    )


def _wordpiece_offsets(tokenizer, texts):
    tokenizer._maybe_initialized_tf()

    def ids(tokens):
        return tf.constant([tokenizer.token_to_id(t) for t in tokens] or [0], tf.int64)

    # tf-text's regex split stops at NUL; \x01 is dropped by the normalization just as NUL is.
    texts = tf.strings.regex_replace(texts, r"\x00", "\x01")
    # 1. the text cut at its added tokens (as written): parts [B, (S)], byte bounds in the text
    raw, raw_id, raw_start, _ = _cut_at_tokens(texts, tokenizer.added_tokens,
                                               ids(tokenizer.added_tokens), offsets=True)
    raw_id = raw_id.flat_values  # [S]
    part_start, = _char_index(texts, row_ids(raw.row_splits), raw_start.flat_values)  # [S]

    # 2. each other part normalized one character at a time (HF's normalization is per
    # character once Σ is handled), so that each normalized character knows the original
    # character it came from; an added token's part is no normalized text
    chars = tf.strings.unicode_split(raw.flat_values, "UTF-8")  # [S, (C)]
    char_part = row_ids(chars.row_splits)  # [K]
    norm_chars = tf.where(tf.gather(raw_id, char_part) >= 0, "", bert_normalize(
        chars.flat_values, tokenizer.bert_lowercase, tokenizer.bert_strip_accents))  # [K]
    normalized = tf.strings.unsorted_segment_join(norm_chars, char_part, chars.nrows())  # [S]
    cum = tf.cumsum(tf.strings.length(norm_chars, unit="UTF8_CHAR"))  # [K] normalized-char end
    part_base = tf.gather(tf.concat([[0], cum], 0), chars.row_starts())  # [S]

    # 3. each normalized part cut at the normalized added tokens, the text between them split
    # into words and WordPieced, as the tokenizer does: rows [S, (T)] of (id, normalized byte
    # start, end) of the part
    sub, sub_id, sub_start, sub_end = _cut_at_tokens(
        normalized, tokenizer.normalized_added_tokens_as_found(),
        ids(tokenizer.normalized_added_tokens), offsets=True)  # [S, (R)]
    sub_id = sub_id.flat_values
    words, w_start, _ = regex_split(tf.where(sub_id >= 0, "", sub.flat_values),
                                    *tokenizer.word_split_patterns(), offsets=True)  # [R, (W)]
    pieces, p_start, p_end = tokenizer._text_word_piece.tokenize_with_offsets(
        words.flat_values)  # [N, (P)], bytes of the word
    word_base = w_start.flat_values + tf.gather(sub_start.flat_values,
                                                row_ids(words.row_splits))  # [N] of the part
    base = tf.gather(word_base, row_ids(pieces.row_splits))
    found = tf.stack([tf.cast(pieces.flat_values, tf.int64), p_start.flat_values + base,
                      p_end.flat_values + base], axis=1)  # [M, 3]
    tokens = tf.concat([
        merge_rows(words.with_flat_values(pieces.with_flat_values(found))),
        _id_rows(tf.stack([sub_id, sub_start.flat_values, sub_end.flat_values], axis=1))],
        axis=1)  # [R, (T), 3]: a part's words' pieces or its added token
    tokens = merge_rows(sub.with_flat_values(tokens))  # [S, (T), 3]

    # 4. normalized bytes -> original characters: a token spans from the original character of
    # its first normalized character to that of its last (the original character holding
    # normalized char g is the first k with cum[k] > g)
    part_of = row_ids(tokens.row_splits)
    values = tokens.flat_values
    start, end = _char_index(normalized, part_of, values[:, 1], values[:, 2])  # [M] chars
    base = tf.gather(part_base, part_of)
    first_char = tf.searchsorted(cum, base + start, side="right", out_type=tf.int32)
    last_char = tf.searchsorted(cum, base + end - 1, side="right", out_type=tf.int32)
    char_base = tf.gather(part_start - tf.cast(chars.row_starts(), tf.int32), part_of)
    found = tf.stack([values[:, 0], tf.cast(char_base + first_char, tf.int64),
                      tf.cast(char_base + last_char + 1, tf.int64)], axis=1)
    # an added token found as written spans its part
    added = tf.stack([raw_id, tf.cast(part_start, tf.int64),
                      tf.cast(part_start, tf.int64) + chars.row_lengths()], axis=1)
    rows = tf.concat([tokens.with_flat_values(found), _id_rows(added)], axis=1)  # [S, (T), 3]
    rows = merge_rows(raw.with_flat_values(rows)).with_row_splits_dtype(tf.int64)  # [B, (T), 3]
    values = rows.flat_values
    return (rows.with_flat_values(tf.cast(values[:, 0], tokenizer.compute_dtype)),
            rows.with_flat_values(tf.cast(values[:, 1], tf.int32)),
            rows.with_flat_values(tf.cast(values[:, 2], tf.int32)))


_SPACE = "\u0120"  # Ġ, GPT-2's symbol for the space byte


def _byte_pair_offsets(tokenizer, texts):
    # [B, (W)], [N, (P)], [N]
    words, pieces, added = tokenizer.split_and_merge(texts, prefixed=True)
    flat_words = words.flat_values
    added = tf.cast(added, tf.int32)  # 1: the word starts with a space the text does not have
    # 1. the words concatenate back to the text, less their added spaces: each starts where the
    # ones before it end
    before = tf.cumsum(tf.strings.length(flat_words, unit="UTF8_CHAR") - added, exclusive=True)
    word_start = before - tf.gather(before, tf.gather(words.row_starts(),
                                                      row_ids(words.row_splits)))  # [N]
    # 2. bytes of the word each piece covers: one per symbol; a word of one piece (a special
    # token written in the text among them) is covered whole
    symbols = pieces.flat_values  # [M]
    size = tf.strings.length(symbols, unit="UTF8_CHAR")
    word_of_piece = row_ids(pieces.row_splits)
    before = tf.cumsum(size, exclusive=True)
    start = before - tf.gather(before, tf.gather(pieces.row_starts(), word_of_piece))
    whole = tf.equal(tf.gather(pieces.row_lengths(), word_of_piece), 1)
    end = tf.where(whole, tf.gather(tf.strings.length(flat_words), word_of_piece), start + size)
    # 3. characters, as HF aligns them: an added space stands for the first character of its
    # word (a piece of it alone spans that character)
    shift = tf.gather(added, word_of_piece)
    after_first, last = _char_index(flat_words, word_of_piece, tf.maximum(start, shift) + 1,
                                    tf.maximum(end, 1 + shift))
    base = tf.gather(word_start, word_of_piece)
    first = base + tf.maximum(after_first - 1 - shift, 0)  # [first, last): of the text
    last = tf.maximum(base + last - shift, first + 1)  # (an added space alone: its character)
    # 4. HF's trim_offsets (RobertaProcessing), on characters: the leading and trailing spaces
    # (Ġ) come off a piece's span, an added one too (so "Ġthe" after "<s>" loses its "t", as in
    # HF); with add_prefix_space, not the one leading space of the text's first piece or of a
    # piece starting at 0
    lead = size - tf.strings.length(tf.strings.regex_replace(symbols, f"^{_SPACE}+", ""),
                                    unit="UTF8_CHAR")
    trail = size - tf.strings.length(tf.strings.regex_replace(symbols, f"{_SPACE}+$", ""),
                                     unit="UTF8_CHAR")
    token_ids = pieces.with_flat_values(
        tf.cast(tokenizer.piece_ids(symbols), tokenizer.compute_dtype))
    merged_splits = tf.gather(pieces.row_splits, words.row_splits)  # [B + 1]: each text's pieces
    index = tf.range(tf.size(symbols, out_type=merged_splits.dtype))
    row_first = tf.equal(index, tf.gather(merged_splits, row_ids(merged_splits)))
    if tokenizer.add_prefix_space:
        lead = tf.where((row_first | tf.equal(first, 0)) & tf.equal(lead, 1), 0, lead)
    starts = tf.minimum(first + lead, last)
    ends = tf.where(last >= trail, tf.maximum(last - trail, starts), last)
    return _per_text(words, token_ids, starts, ends)


_QUOTE_PAIRS = r"(`)`|(')'"  # albert_normalize's "``" and "''", each pair's first char captured


def _sentencepiece_offsets(tokenizer, texts):
    # the tokenizer's own cut at its tokens read alone (XLNet's user-defined pieces), each part
    # between them mapped as a text of its own
    return tokenizer.read_around_tokens(
        texts, lambda parts: _sentencepiece_part_offsets(tokenizer, parts), offsets=True)


def _sentencepiece_part_offsets(tokenizer, texts):
    chars = tf.strings.unicode_split(texts, "UTF-8")  # [B, (C)]
    flat = chars.flat_values  # [K]
    n_chars = tf.shape(flat, out_type=tf.int64)[0]
    char_row = row_ids(chars.row_splits)  # [K] the text of each character
    row_start = tf.gather(chars.row_starts(), char_row)  # [K] first char of its text
    row_end = tf.gather(chars.row_limits(), char_row)

    # 1. ALBERT's normalization one character at a time, so that each normalized byte knows
    # the original character it came from. Whitespace: the first character of a run between
    # words becomes " ", the rest (and runs at either end) nothing. A "``" / "''" pair: '"' from
    # its second character (as HF's fast tokenizer aligns it), nothing from its first. Any other
    # character: NFKD, accents dropped, lowercased, as `albert_normalize` alone (computed once
    # per distinct character: a text has far fewer of those than characters).
    distinct, which = tf.unique(flat)
    sp = tokenizer.live_sentence_piece()
    space = tf.gather(tf.strings.regex_full_match(distinct, PYTHON_WHITESPACE), which)
    index = tf.range(n_chars)
    after_space = tf.concat([[False], space[:-1]], 0) & (index > row_start)
    words = tf.cumsum(tf.cast(~space, tf.int64))  # [K] non-space characters up to k
    words_before_row = tf.gather(tf.concat([[0], words], 0), row_start)
    words_in_row = tf.gather(tf.concat([[0], words], 0), row_end)
    between = (words - words_before_row > 0) & (words_in_row - words > 0)
    paired = tf.strings.unicode_split(tf.strings.regex_replace(texts, _QUOTE_PAIRS, r'\1\2"'),
                                      "UTF-8").flat_values  # a pair -> its first char + '"'
    second = tf.equal(paired, '"') & tf.not_equal(flat, '"')
    first = tf.concat([second[1:], [False]], 0)
    distinct_normalized = albert_normalize(distinct, tokenizer.lowercase, tokenizer.keep_accents)
    alone = tf.gather(distinct_normalized, which)
    produced = tf.where(space, tf.where(~after_space & between, " ", ""),
                        tf.where(first, "", tf.where(second, '"', alone)))  # [K]
    normalized = tf.strings.unsorted_segment_join(produced, char_row, chars.nrows())  # [B]
    cum = tf.cumsum(tf.cast(tf.strings.length(produced), tf.int64))  # [K] byte ends, global
    text_base = tf.gather(tf.concat([[0], cum], 0), chars.row_starts())  # [B]

    # 2. the tokenizer's ids with tf-text's byte offsets into the normalized text
    ids, starts, ends = tokenizer.tokenize_normalized(sp, normalized, offsets=True)
    text_of_piece = row_ids(ids.row_splits)
    base = tf.gather(text_base, text_of_piece)
    start = base + tf.cast(starts.flat_values, tf.int64)  # [M] global normalized bytes
    end = base + tf.cast(ends.flat_values, tf.int64)

    # 3. back to original characters: from the one holding a piece's first byte to the one
    # holding its last, less the characters SentencePiece reads as nothing (the space a "▁"
    # stands for, a dropped control or combining character, the first of a quote pair) at
    # either edge; a piece of such characters only (a lone "▁") spans the character after it,
    # the first of its word, as in HF.
    first_char = tf.searchsorted(cum, start, side="right", out_type=tf.int64)
    last_char = tf.where(end > start, tf.searchsorted(cum, end - 1, side="right",
                                                      out_type=tf.int64), first_char - 1)
    silent_alone = tf.gather(sp.tokenize(distinct_normalized).row_lengths() == 0, which)
    silent_quote = sp.tokenize(tf.constant(['"'])).row_lengths()[0] == 0
    silent = space | first | tf.where(second, silent_quote, silent_alone)
    kept = tf.concat([tf.where(~silent)[:, 0], [n_chars]], 0)  # sorted, with a sentinel
    piece_row_end = tf.gather(chars.row_limits(), text_of_piece)
    span_start = tf.minimum(tf.gather(kept, tf.searchsorted(kept, first_char, side="left")),
                            piece_row_end)
    last_kept = tf.gather(kept, tf.maximum(
        tf.searchsorted(kept, last_char, side="right") - 1, 0))
    span_end = tf.where(span_start <= last_char, last_kept + 1,
                        tf.minimum(span_start + 1, piece_row_end))
    row_base = tf.gather(chars.row_starts(), text_of_piece)
    return (ids, ids.with_flat_values(tf.cast(span_start - row_base, tf.int32)),
            ids.with_flat_values(tf.cast(span_end - row_base, tf.int32)))
