"""BERT's optimization: linear warmup then linear decay, and AdamW with a fused TensorFlow step."""
import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_bertfam")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`
    (constant after warmup when `total_steps` is None): BERT's schedule."""

    def __init__(self, peak, warmup_steps=0, total_steps=None):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        lr = ops.convert_to_tensor(self.peak, "float32")
        if self.total_steps:
            remaining = ops.maximum(self.total_steps - step, 0.0)
            lr = lr * remaining / max(self.total_steps - self.warmup_steps, 1)
        if self.warmup_steps:
            warm = self.peak * (step + 1.0) / self.warmup_steps
            lr = ops.where(step < self.warmup_steps, warm, lr)
        return lr

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


@keras.saving.register_keras_serializable(package="keras_bertfam")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, the same arguments and update, fused and correct on TensorFlow.

    On TensorFlow, Keras' AdamW differs from its own JAX and torch results in three cases, and
    is slow on CPU; this subclass fixes all four (elsewhere it is exactly Keras'):

    * **Repeated rows of a sparse gradient.** An embedding's gradient arrives as
      `tf.IndexedSlices` with one slice per occurrence; Keras squares the slices before summing
      them, so a token seen twice in a batch gets `v += (1 - β2)(g₁² + g₂²)` instead of
      `(1 - β2)(g₁ + g₂)²` (every batch repeats [CLS], [SEP] and common words). The gradient is
      made dense first, as JAX and torch have it.
    * **The global norm of those slices.** `global_clipnorm` measured the same unsummed slices:
      g₁² + g₂² again, so the clipped step was too large (slices 3 and 4 of one token: norm 5
      instead of 7, a 1.4x step at `global_clipnorm=1`). Repeated rows are summed first.
    * **Clipping under `tf.distribute`.** Keras clips each replica's partial gradient before
      the replicas' gradients are summed, so `global_clipnorm=1.0` on two replicas is a
      different step from one device. Here clipping follows the all-reduce.
    * **Speed.** Keras' update is four element-wise ops per variable, each a pass over the
      weights and moments (and a temporary); on 2 CPU cores that was 0.10 s of a 0.46 s MiniLM
      fine-tuning step (the 30,522-row embedding's moments move every step).
      `ResourceApplyAdam` computes the same `m += (g - m)(1 - β1)`, `v += (g² - v)(1 - β2)`,
      `w -= lr·√(1 - β2ᵗ)/(1 - β1ᵗ)·m/(√v + ε)` in one kernel. Weight decay is Keras'
      `w -= w·wd·lr`. On one device the step's scalars (β powers, the scheduled rate) are built
      once a step, not once a variable as Keras' `strategy.extended.update` path did.

    JAX fuses the element-wise chain under `jit` and torch runs Keras' `_foreach` AdamW, with
    dense gradients and one global clip; there this class is `keras.optimizers.AdamW`.
    """

    # === Config ===
    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        # Keras' optimizers leave the exclusions out of their config: a task reloaded from a
        # `.keras` file decayed its LayerNorm and bias weights. The names are kept in ours, as
        # Keras keeps them: each call replaces the last one's.
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._excluded_names = list(var_names or [])

    def get_config(self):
        config = super().get_config()
        names = getattr(self, "_excluded_names", None)
        if names:
            config["exclude_from_weight_decay_names"] = list(names)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        names = config.pop("exclude_from_weight_decay_names", None)
        optimizer = super().from_config(config, custom_objects=custom_objects)
        if names:
            optimizer.exclude_from_weight_decay(var_names=names)
        return optimizer

    def update_step(self, gradient, variable, learning_rate):
        self._update(gradient, variable, learning_rate, {})

    def _update(self, gradient, variable, learning_rate, scalars):
        """`update_step`; `scalars` holds ResourceApplyAdam's scalar arguments by dtype, filled
        as needed (one device: shared by all of a step's variables)."""
        if keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        gradient = tf.convert_to_tensor(gradient)  # IndexedSlices: duplicates summed
        if self.amsgrad or callable(self.beta_1) or callable(self.beta_2):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        if dtype not in scalars:
            step = ops.cast(self.iterations + 1, dtype)
            cast = lambda x: ops.cast(x, dtype)  # noqa: E731
            scalars[dtype] = dict(beta1_power=ops.power(cast(self.beta_1), step),
                                  beta2_power=ops.power(cast(self.beta_2), step),
                                  lr=cast(learning_rate), beta1=cast(self.beta_1),
                                  beta2=cast(self.beta_2), epsilon=cast(self.epsilon))
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        tf.raw_ops.ResourceApplyAdam(var=variable.handle, m=m.handle, v=v.handle,
                                     grad=ops.cast(gradient, dtype), **scalars[dtype])

    # Clipping after the all-reduce (TensorFlow with more than one replica), on summed slices.
    def _clip_gradients(self, grads):
        if _replicas() > 1:
            return grads  # clipped in _backend_update_step, once summed over replicas
        return self._clipped(_summed_slices(grads))

    def _clipped(self, grads):
        """Keras' clipping of `grads` (repeated rows summed); `global_clipnorm` on TensorFlow
        by `_clip_by_global_norm`, the same numbers in less time."""
        if (keras.backend.backend() != "tensorflow" or (self.clipnorm and self.clipnorm > 0)
                or not (self.global_clipnorm and self.global_clipnorm > 0)):
            return super()._clip_gradients(grads)
        return _clip_by_global_norm(grads, self.global_clipnorm)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or not _single_device():
            return super()._apply_weight_decay(variables)
        # Keras' `variable * wd * lr`, with the learning rate (a schedule: ~10 ops) computed
        # once a step instead of once a variable.
        rate = {}
        for variable in variables:
            if self._use_weight_decay(variable):
                variable = variable.value if isinstance(variable, keras.Variable) else variable
                if variable.dtype not in rate:
                    rate[variable.dtype] = (ops.cast(self.weight_decay, variable.dtype),
                                            ops.cast(self.learning_rate, variable.dtype))
                wd, lr = rate[variable.dtype]
                variable.assign_sub(variable * wd * lr)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if _single_device():
            # No tf.distribute strategy: one kernel a variable, the step's scalars computed once
            # (Keras' path through `strategy.extended.update` built ~15 ops a variable, most of
            # a small task's train-step trace; the same kernel and arguments, so the same
            # numbers).
            scalars = {}
            for grad, variable in zip(grads, trainable_variables):
                self._update(grad, variable.value if isinstance(variable, keras.Variable)
                             else variable, learning_rate, scalars)
            return
        if _replicas() <= 1:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import tensorflow as tf

        variables = [v.value if isinstance(v, keras.Variable) else v
                     for v in trainable_variables]
        reduced = self._all_reduce_sum_gradients(list(zip(grads, variables)))
        clipped = self._clipped(_summed_slices([g for g, _ in reduced]))
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step, self._distribution_strategy,
            list(zip(clipped, variables)), learning_rate)


def _clip_by_global_norm(grads, clip_norm):
    """Keras' `clip_by_global_norm` on TensorFlow, bit for bit, faster: a float32 gradient's
    squared norm is `2 · l2_loss(g)`, one pass of Eigen's reduction over g² · ½ (the halving
    is exact), where Keras' `sum(square(g))` writes g² out and reduces it again: 85 -> 15 ms
    for MiniLM's 22.7M weights, most of the clipping's time. Sparse gradients (rows already
    summed) are made dense first, as Keras' `sum` makes them and as the update needs them."""
    import tensorflow as tf

    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    present = [g for g in grads if g is not None]
    # The float32 gradients' halved squares summed, then doubled once: doubling is exact, so
    # 2·Σ equals Σ 2· bit for bit, with one Mul (and its constant) a step, not one a variable.
    halves = [tf.nn.l2_loss(g) for g in present if g.dtype == tf.float32]
    squared = [ops.sum(ops.square(g)) for g in present if g.dtype != tf.float32]
    if halves:
        squared.insert(0, 2.0 * ops.sum(ops.stack(halves)))
    norm = ops.sqrt(ops.sum(ops.stack(squared)))
    scale = clip_norm * ops.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras'
    return [g * scale if g is not None else g for g in grads]


def _summed_slices(grads):
    """Each `tf.IndexedSlices` with its repeated rows summed (unique indices): Keras' global norm
    squares the slices as they come, so a token seen twice with slices 3 and 4 counted 3² + 4²
    instead of 7² (a 1.4x larger step under `global_clipnorm=1` in that example)."""
    if keras.backend.backend() != "tensorflow":
        return grads
    import tensorflow as tf

    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            rows, where = tf.unique(g.indices)
            g = tf.IndexedSlices(tf.math.unsorted_segment_sum(g.values, where, tf.size(rows)),
                                 rows, g.dense_shape)
        out.append(g)
    return out


def _replicas():
    """Replicas of the surrounding `tf.distribute` replica context (1 outside one, or not TF)."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def _single_device():
    """TensorFlow outside any `tf.distribute` strategy (the default one)."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return not tf.distribute.has_strategy()
