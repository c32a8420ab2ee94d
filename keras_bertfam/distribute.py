"""Distributed training: one name per engine, and the fixes our tasks need under `tf.distribute`.

```python
import keras_bertfam as kb
strategy = kb.distribute.get_strategy("mirrored")      # or multi_worker | tpu | jax_data_parallel
with strategy.scope():
    task = kb.tasks.BertPretrainer.from_preset("bert_tiny_en_uncased", load_weights=False)
    task.compile(learning_rate=1e-4)
task.fit(dataset)                                      # global batch = the dataset's batch
```

Every strategy object returned here has `.scope()`: a `tf.distribute.Strategy` on the TensorFlow
backend, a `keras.distribution.DataParallel` on JAX. Batches are *global*: the dataset's batch is
split over the replicas (and over the workers / processes), and the task's loss is the mean of the
replicas' losses (see `Task.compute_loss`), so one step on N replicas equals one step on one
device for the same global batch when each replica holds the same number of masked tokens (the
default maskers' fixed `mask_selection_length` does).

Keras 3 `fit()` under `MultiWorkerMirroredStrategy` fails (keras-team/keras#20585): its trainer
reduces the first distributed batch with `strategy.reduce` to build the model, and reduces the
scalar logs of each step with `axis=0`. `Task` overrides the two places (see
`first_replica_batch` and `per_worker_logs` below), so tasks train with plain `fit()` there.
"""
import json
import os

import keras

NAMES = ("default", "mirrored", "multi_worker", "tpu", "jax_data_parallel")


def get_strategy(name="default", tpu=None, devices=None, job_addresses=None, num_processes=None,
                 process_id=None):
    """The distribution engine called `name`; use it as `with strategy.scope(): build + compile`.

    Args:
        name: `"default"` (no distribution), `"mirrored"` (all local GPUs / devices),
            `"multi_worker"` (`MultiWorkerMirroredStrategy`; the cluster comes from `TF_CONFIG`),
            `"tpu"` (`TPUStrategy` on the TPU named by `tpu`: "" or None = the local / Colab TPU,
            or a name / `grpc://` address), `"jax_data_parallel"` (`keras.distribution.DataParallel`
            over all JAX devices; with several hosts pass `job_addresses` (the coordinator's
            "host:port" first), `num_processes` and `process_id`, or set Keras'
            `KERAS_DISTRIBUTION_JOB_ADDRESSES` / `_NUM_PROCESSES` / `_PROCESS_ID` variables).
        devices: for "mirrored" / "jax_data_parallel", an explicit device list.

    The TensorFlow strategies need the TensorFlow backend, `jax_data_parallel` the JAX backend
    (a clear error says so otherwise).
    """
    backend = keras.backend.backend()
    if name in (None, "default"):
        if backend == "tensorflow":
            import tensorflow as tf

            return tf.distribute.get_strategy()
        return _NoDistribution()
    if name not in NAMES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(NAMES)}.")
    if name == "jax_data_parallel":
        if backend != "jax":
            raise RuntimeError(
                "strategy 'jax_data_parallel' needs KERAS_BACKEND=jax (set it before importing "
                f"keras); the backend is {backend!r}."
            )
        job_addresses = job_addresses or os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
        if job_addresses:
            _initialize_jax_processes(job_addresses, num_processes, process_id)
        return keras.distribution.DataParallel(devices=devices)
    if backend != "tensorflow":
        raise RuntimeError(
            f"strategy {name!r} is a tf.distribute strategy and needs KERAS_BACKEND=tensorflow; "
            f"the backend is {backend!r} (on JAX use 'jax_data_parallel')."
        )
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices)
    if name == "multi_worker":
        if "TF_CONFIG" in os.environ:
            json.loads(os.environ["TF_CONFIG"])  # a malformed TF_CONFIG fails here, clearly
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _initialize_jax_processes(job_addresses, num_processes, process_id):
    import jax

    if getattr(_initialize_jax_processes, "done", False):
        return
    env = os.environ
    num_processes = int(num_processes if num_processes is not None
                        else env.get("KERAS_DISTRIBUTION_NUM_PROCESSES", 0)) or None
    process_id = int(process_id if process_id is not None
                     else env.get("KERAS_DISTRIBUTION_PROCESS_ID", -1))
    if num_processes is None or process_id < 0:
        raise ValueError("Multi-process JAX needs num_processes and process_id with job_addresses.")
    # CPU devices talk through gloo collectives (GPU / TPU collectives are unaffected). No jax
    # call may touch a device before jax.distributed.initialize.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize(job_addresses, num_processes, process_id)
    _initialize_jax_processes.done = True


class _NoDistribution:
    """A no-op `.scope()` for the default case on JAX / torch."""

    def scope(self):
        import contextlib

        return contextlib.nullcontext()


def num_replicas(strategy=None):
    """Replicas that share a global batch (1 with no distribution)."""
    if strategy is None or isinstance(strategy, _NoDistribution):
        return 1
    if hasattr(strategy, "num_replicas_in_sync"):
        return strategy.num_replicas_in_sync
    return len(strategy.device_mesh.devices.flatten())


# === Fixes used by Task under tf.distribute (keras-team/keras#20585) ===
def _multi_worker(strategy):
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode())


def first_replica_batch(batch, strategy):
    """The first local replica's part of a distributed batch: enough to build the model.

    Keras reduces the whole distributed batch with `strategy.reduce("MEAN")`, which fails on
    multi-worker (PerReplica values in a dict) and averages token ids elsewhere.
    """
    import tensorflow as tf

    def first(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tf.nest.map_structure(first, batch)


def per_worker_logs(logs, strategy):
    """Scalar logs as shape-[1] tensors on multi-worker, where Keras reduces them with `axis=0`
    (`strategy.reduce("MEAN", v, axis=0)` then averages the replicas' values into a scalar)."""
    if not _multi_worker(strategy):
        return logs
    from keras import ops

    return {k: ops.reshape(v, (-1,)) if len(v.shape) == 0 else v for k, v in logs.items()}
