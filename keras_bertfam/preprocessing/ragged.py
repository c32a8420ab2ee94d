"""Ragged tensors as their flat values and row splits, in few traced ops.

TensorFlow's ragged operations validate their partitions and rebuild them op by op: a ragged
slice, gather or `boolean_mask` traces tens to hundreds of ops, `value_rowids()` ~70. A test suite
and every `tf.data` pipeline spend their start-up tracing such graphs, so the preprocessing
layers work on the flat values instead: the row of each value is one binary search on the row
splits, a run of values is a flat index, and partitions are built unvalidated where they are
valid by construction.
"""
import tensorflow as tf


def merge_rows(rt):
    """Ragged [B, (W), (P), ...] -> [B, (W·P), ...]: `rt.merge_dims(1, 2)` without validating the
    row splits again (3 assert `tf.cond`s a merge, all valid by construction)."""
    return tf.RaggedTensor.from_row_splits(rt.values.values,
                                           tf.gather(rt.values.row_splits, rt.row_splits),
                                           validate=False)


def row_ids(splits):
    """Row splits [R + 1] -> the row of each of their `splits[-1]` values (`value_rowids()`, in
    the splits' dtype)."""
    return rows_and_index(splits)[0]


def rows_and_index(splits):
    """Row splits [R + 1] -> (the row of each value, `range(splits[-1])`), [N] each in the
    splits' dtype: one binary search, 14 ops to trace where `value_rowids()` builds ~70 (and
    `tf.searchsorted`'s reshapes 28)."""
    index = tf.range(tf.reduce_max(splits))  # (the splits ascend: their max is their last)
    found = tf.raw_ops.UpperBound(sorted_inputs=tf.expand_dims(splits, 0),
                                  values=tf.expand_dims(index, 0), out_type=splits.dtype)
    return tf.reshape(found, [-1]) - 1, index


def ranges(starts, lengths):
    """`tf.ragged.range(starts, starts + lengths)` as (values [N], row splits [R + 1], row of each
    value [N]), in `starts`' dtype: the flat index of each row's run of values."""
    splits = tf.concat([tf.zeros([1], lengths.dtype), tf.cumsum(lengths)], 0)
    row, index = rows_and_index(splits)
    return tf.gather(starts - splits[:-1], row) + index, splits, row


def keep_values(rt, keep):
    """Ragged [B, (T)] -> its values where `keep` ([N], over `rt.values`), in their rows:
    `tf.ragged.boolean_mask(rt, keep)` (~110 ops) in ~25."""
    kept = tf.math.unsorted_segment_sum(tf.cast(keep, rt.row_splits.dtype),
                                        row_ids(rt.row_splits), rt.nrows())
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(rt.values, keep), kept,
                                            validate=False)
