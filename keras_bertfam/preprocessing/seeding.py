"""The one seeding scheme of the random preprocessing stages (maskers, pairers, XLNet's
permutation masker): `SeededStage`.

A stage has an int `seed` (None at construction: drawn from NumPy's global generator, so
`keras.utils.set_random_seed` makes it reproducible) saved in its config, and derives the
stateless key of each call from `(seed, salt)` with `stateless_fold_in`:

* `stage(x, seed=s)`: an explicit call seed `s` (an int or a static-length int vector such as
  `(epoch, index)`): the output is a pure function of `(stage seed, s, input)` -- fairseq's
  seed-per-(seed, epoch, index) scheme, reproducible under `Dataset.map(num_parallel_calls=...)`.
* `stage(x)`: call number k uses `fold_in((seed, salt), k)` (a call counter): fresh randomness
  every call, the same sequence for the same seed when calls run in order.
* `stage.map_dataset(ds)`: zips `ds` with `tf.data.Dataset.random(seed)` and passes each
  element's draw as `s`: fresh every epoch, reproducible whatever the parallelism.

`salt` is a class constant that keeps the streams of different kinds of stages apart.
"""
import numpy as np
import tensorflow as tf

_INT32_MAX = 2**31 - 1


class SeededStage:
    """Mixin of every random preprocessing stage: `seed`, `_call_key(seed)`, `map_dataset`."""

    seed_salt = 0

    def _init_seed(self, seed):
        self.seed = int(np.random.randint(0, _INT32_MAX)) if seed is None else int(seed)
        with tf.init_scope():  # eager even when built inside a traced function
            counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="stage_calls")
        object.__setattr__(self, "_call_counter", counter)  # not a Keras-tracked weight

    def _base_key(self):
        return tf.constant([self.seed, self.seed_salt], tf.int64)

    def _call_key(self, seed=None):
        """The [2] int64 stateless key of one call (see the module docstring)."""
        if seed is None:
            count = self._call_counter.assign_add(1, read_value=True) - 1
            return tf.random.experimental.stateless_fold_in(self._base_key(), count)
        seed = tf.reshape(tf.cast(tf.convert_to_tensor(seed), tf.int64), [-1])
        if seed.shape[0] is None:
            raise ValueError("The call seed must have a static length.")
        key = tf.random.experimental.stateless_fold_in(self._base_key(),
                                                       tf.constant(-1, tf.int64))
        for i in range(seed.shape[0]):
            key = tf.random.experimental.stateless_fold_in(key, seed[i])
        return key

    def _map_element(self, x, seed):
        return self(x, seed=seed)

    def map_dataset(self, dataset, num_parallel_calls=tf.data.AUTOTUNE, deterministic=None):
        """`dataset.map(self)` with a reproducible per-element call seed drawn from
        `tf.data.Dataset.random(self.seed)`: fresh every epoch, the same for the same seed for
        any `num_parallel_calls`."""
        draws = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True)
        return tf.data.Dataset.zip((dataset, draws)).map(
            lambda x, s: self._map_element(x, s), num_parallel_calls=num_parallel_calls,
            deterministic=deterministic)
