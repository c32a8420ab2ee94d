"""Collocations learned from a corpus with pointwise mutual information, for `PhraseMasker`.

Offline corpus statistics (plain Python, like the vocabulary trainers), run once before
pretraining; the masker then matches the phrases in TF ops inside `tf.data`.
"""
import collections
import math
import re

import numpy as np

from keras_bertfam.user_warnings import warn

__all__ = ["learn_phrases"]

_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def _texts(corpus):
    """Strings from an iterable of str/bytes, a NumPy array, or a tf.data.Dataset of strings."""
    if isinstance(corpus, (str, bytes)):
        raise ValueError("corpus must be an iterable of documents, not a single string")
    if not hasattr(corpus, "__iter__"):
        raise ValueError(f"corpus must be an iterable of documents (strings) or a "
                         f"tf.data.Dataset of them; got {type(corpus).__name__} {corpus!r:.80}")
    try:
        import tensorflow as tf

        if isinstance(corpus, tf.data.Dataset):
            corpus = corpus.unbatch() if len(corpus.element_spec.shape) else corpus
            corpus = corpus.as_numpy_iterator()
    except ImportError:  # pragma: no cover
        pass
    for doc in corpus:
        if isinstance(doc, np.ndarray):
            doc = doc.item()
        if isinstance(doc, bytes):
            doc = doc.decode("utf-8", errors="replace")
        if not isinstance(doc, str):
            raise ValueError(f"corpus documents must be strings; got {type(doc).__name__}")
        yield doc


def learn_phrases(corpus, min_count=5, threshold=0.5, max_words=3, max_phrases=None,
                  lowercase=True, stop_words=("the", "a", "an", "and", "or", "of", "to", "in",
                                              "is", "it", "that", "this", "br")):
    """Phrases of 2..`max_words` words that occur together far more often than by chance.

    Words are runs of letters/digits (punctuation separates phrases; `lowercase` for uncased
    vocabularies). A pair of adjacent units (a, b) is scored by normalized PMI,
    `npmi = log(p(ab) / (p(a) p(b))) / -log p(ab)` (1 = always together, 0 = independent), and
    kept when it occurs at least `min_count` times and `npmi >= threshold`. Longer phrases are
    built word2phrase-style: the kept pairs are merged in the corpus and the pairs of units are
    scored again (`max_words - 1` passes at most; phrases never exceed `max_words` words). Pairs
    starting or ending with a `stop_words` word are not phrases ("of the").

    Args:
        corpus: documents: an iterable of strings (or bytes), or a `tf.data.Dataset` of them.
        min_count: int >= 1. threshold: npmi in [-1, 1]. max_words: int >= 2.
        max_phrases: keep only the best-scored this many (None: all).

    Returns:
        list of phrase strings (words joined by single spaces), best score first: the
        `phrases=` of `PhraseMasker` (with the model's `tokenizer=`).

    Example:
    >>> docs = ["I live in New York City.", "New York City is big.", "We saw New York City",
    ...         "I saw a big city", "We live in New York City"] * 3
    >>> learn_phrases(docs, min_count=3, threshold=0.6)
    ['new york city']
    """
    for name, value, low in (("min_count", min_count, 1), ("max_words", max_words, 2),
                             ("max_phrases", 1 if max_phrases is None else max_phrases, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}"
                             f"{' or None' * (name == 'max_phrases')}; got {value!r}")
    if (not isinstance(threshold, (int, float, np.number)) or isinstance(threshold, bool)
            or not -1.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold is a normalized PMI in [-1, 1]; got {threshold!r}")
    if not isinstance(lowercase, bool):
        raise ValueError(f"lowercase must be True or False; got {lowercase!r}")
    if isinstance(stop_words, (str, bytes)) or not all(
            isinstance(w, str) for w in stop_words or ()):
        raise ValueError(f"stop_words must be a list of words (strings); got {stop_words!r}")
    stop = {w.lower() if lowercase else w for w in (stop_words or ())}

    # Sentences of units; a unit is a tuple of words. Punctuation splits chunks.
    chunks = []
    for doc in _texts(corpus):
        chunk = []
        for tok in _WORD.findall(doc.lower() if lowercase else doc):
            if tok[0].isalnum() or tok[0] == "_":
                chunk.append((tok,))
            else:
                if len(chunk) > 1:
                    chunks.append(chunk)
                chunk = []
        if len(chunk) > 1:
            chunks.append(chunk)
    if not chunks:
        raise ValueError("corpus has no two adjacent words: no phrase can be learned")

    scores = {}
    first_pairs = None  # the first pass's pair counts, to say why nothing was learned
    for _ in range(int(max_words) - 1):
        unigrams = collections.Counter(u for c in chunks for u in c)
        bigrams = collections.Counter(p for c in chunks for p in zip(c, c[1:]))
        if first_pairs is None:
            first_pairs, num_words = bigrams, sum(unigrams.values())
        total = sum(unigrams.values())
        merge = {}
        for (a, b), n in bigrams.items():
            if n < min_count or len(a) + len(b) > max_words:
                continue
            if a[0] in stop or b[-1] in stop:
                continue
            p_ab = n / total
            if p_ab >= 1.0:
                continue
            npmi = math.log(p_ab / (unigrams[a] / total * unigrams[b] / total)) / -math.log(p_ab)
            if npmi >= threshold:
                merge[(a, b)] = npmi
        if not merge:
            break
        for (a, b), s in merge.items():
            scores[a + b] = max(s, scores.get(a + b, -2.0))
        merged = []
        for c in chunks:  # greedy left to right, the best-scored pair first where two compete
            out, i = [], 0
            while i < len(c):
                if i + 1 < len(c) and (c[i], c[i + 1]) in merge and not (
                        i + 2 < len(c) and (c[i + 1], c[i + 2]) in merge
                        and merge[(c[i + 1], c[i + 2])] > merge[(c[i], c[i + 1])]):
                    out.append(c[i] + c[i + 1])
                    i += 2
                else:
                    out.append(c[i])
                    i += 1
            merged.append(out)
        chunks = merged
    # A phrase absorbed into a longer one in a later pass is still a phrase where it occurs
    # alone; keep those that still occur as units after the last pass, and the longer ones.
    final = collections.Counter(u for c in chunks for u in c if len(u) > 1)
    phrases = [p for p in scores if final[p] >= min_count]
    phrases.sort(key=lambda p: (-scores[p], p))
    if max_phrases is not None:
        phrases = phrases[: int(max_phrases)]
    if not phrases:
        (a, b), n = first_pairs.most_common(1)[0]
        frequent = sum(1 for count in first_pairs.values() if count >= min_count)
        why = (f"no pair of adjacent words occurs min_count={min_count} times (the most "
               f"frequent pair, {' '.join(a + b)!r}, occurs {n} time{'s' * (n != 1)} in "
               f"{num_words} words): the corpus is too small for min_count; lower it or pass "
               "a larger corpus" if not frequent else
               f"{len(scores)} candidate phrase(s) occur fewer than min_count={min_count} times "
               "as whole units once merged into longer ones" if scores else
               f"{frequent} pair(s) occur at least min_count={min_count} times, but none has "
               f"npmi >= threshold={threshold} without a stop word at its edge; lower threshold")
        warn(f"learn_phrases found no phrase: {why}.")
    return [" ".join(p) for p in phrases]
