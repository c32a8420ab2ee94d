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
            `KERAS_DISTRIBUTION_JOB_ADDRESSES` / `_NUM_PROCESSES` / `_PROCESS_ID` variables:
            all three or none, some without the others a ValueError naming the missing ones).
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
        processes = _jax_processes(job_addresses, num_processes, process_id)
        if backend != "jax":
            raise RuntimeError(
                "strategy 'jax_data_parallel' needs KERAS_BACKEND=jax (set it before importing "
                f"keras); the backend is {backend!r}."
            )
        if processes:
            _initialize_jax_processes(*processes)
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


# Keras' variables for `keras.distribution.initialize`, by the argument each stands for
JAX_PROCESS_VARIABLES = {"job_addresses": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
                         "num_processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
                         "process_id": "KERAS_DISTRIBUTION_PROCESS_ID"}


def _jax_processes(job_addresses, num_processes, process_id):
    """`(job_addresses, num_processes, process_id)` of a multi-process JAX run, each the
    argument or else its Keras variable (`JAX_PROCESS_VARIABLES`); None for one process (none
    of the three given). Some but not all of them: a ValueError naming the ones given and the
    ones missing (without the coordinator's address, each process went on alone without a
    word); a process count or id that is not an integer in range: one naming the values."""
    values = {"job_addresses": job_addresses, "num_processes": num_processes,
              "process_id": process_id}
    from_variable = set()
    for arg, variable in JAX_PROCESS_VARIABLES.items():
        if values[arg] is None and os.environ.get(variable, "").strip():
            values[arg] = os.environ[variable].strip()
            from_variable.add(arg)

    def shown(arg):
        return (f"{JAX_PROCESS_VARIABLES[arg]}={values[arg]}" if arg in from_variable
                else f"{arg}={values[arg]!r}")

    missing = [arg for arg, value in values.items() if value is None]
    if len(missing) == len(values):
        return None
    if missing:
        given = [shown(arg) for arg in values if arg not in missing]
        raise ValueError(
            f"Multi-process JAX takes the coordinator's address, the number of processes and "
            f"this process's id together: {', '.join(given)} {'is' if len(given) == 1 else 'are'}"
            f" set but not {', '.join(JAX_PROCESS_VARIABLES[a] for a in missing)} (get_strategy's"
            f" {', '.join(f'{a}=' for a in missing)}). Set all three for a run over several "
            f"processes, none for one process.")
    try:
        count, index = int(values["num_processes"]), int(values["process_id"])
    except (TypeError, ValueError):
        count = index = None
    if count is None or count < 1 or not 0 <= index < count:
        raise ValueError(
            f"Multi-process JAX: {shown('num_processes')}, {shown('process_id')}: expected a "
            f"positive number of processes and this process's id from 0 to that number minus 1.")
    return values["job_addresses"], count, index


def _initialize_jax_processes(job_addresses, num_processes, process_id):
    import jax

    if getattr(_initialize_jax_processes, "done", False):
        return
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
