"""Distributed training: MirroredStrategy (2 logical CPUs), MultiWorkerMirroredStrategy (two worker
processes on 127.0.0.1), Keras DataParallel on JAX (2 host devices; two JAX processes), mixed
precision. Every engine runs in its own subprocess so device settings never leak between tests
(forked from one that has imported the libraries: `_forked`).
"""
import json
import os
import socket

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from tests.conftest import TF_TEST_SETTINGS, ForkServer

# Only catches hangs: an order of magnitude above the idle time, so a busy machine does not fail
# working code (idle, the slowest script here takes under 2 minutes).
TIMEOUT = 1800

# Tiny BertPretrainer, dropout 0, preprocessed inputs (fixed masks): training is deterministic.
# One layer where the step's equality across devices / workers / processes is the point (each
# layer costs a trace per replica); two for mixed precision, whose rounding compounds per layer.
COMMON = r'''
import os, sys, json
import numpy as np

def make_task(kb, keras, num_layers=1):
    keras.utils.set_random_seed(0)
    backbone = kb.models.BertBackbone(64, num_layers, 2, 16, 32, max_sequence_length=16,
                                      dropout=0.0)
    return kb.tasks.BertPretrainer(backbone)

def make_data(batch=8, length=16, steps=1):
    rng = np.random.RandomState(0)
    n = batch * steps
    x = {"token_ids": rng.randint(5, 64, (n, length)).astype("int32"),
         "segment_ids": np.repeat([[0] * 8 + [1] * 8], n, 0).astype("int32"),
         "padding_mask": np.ones((n, length), "int32"),
         "mask_positions": np.tile(np.arange(1, 4), (n, 1)).astype("int32")}
    y = {"mask_ids": rng.randint(5, 64, (n, 3)).astype("int32"),
         "mask_weights": np.ones((n, 3), "float32"),
         "pair_labels": rng.randint(0, 2, (n,)).astype("int32")}
    return x, y

def weights_of(task):
    return [np.asarray(keras.ops.convert_to_numpy(w)) for w in task.weights]
'''


# The TensorFlow scripts take the test processes' TensorFlow settings (conftest's
# `TF_TEST_SETTINGS`: no Grappler, the classic graph optimizer at L0, no per-op Python stacks):
# Grappler off took the mirrored process from 71.6 to 67.0 s of CPU (one A/B round, load ~6);
# the multi-worker processes too, so that their weights and the mirrored process's one-device
# reference come from the same kind of graph.


FORKED_IMPORTS = "import numpy as np\nimport tensorflow as tf\nimport keras, keras_bertfam"


# A forked script ends as a fresh process would (conftest's `ForkServer`; `python -c` prints the
# same): its threads joined (one here waits for the script's end), then the atexit hooks. One of
# them is JAX's `distributed.shutdown`, where a job's process waits for the others. A forker that
# skipped them (`os._exit` right after the script) let the first process of
# test_jax_data_parallel_two_processes take the job's coordination service down while the other
# was still running, which aborted that one (SIGABRT, "Terminating process because the JAX
# distributed service detected fatal errors"): now and then under load, and every time when the
# second process was made to end 20 s after the first (2026-11-29).
ENDS_AS_PYTHON = r'''
import atexit, threading
atexit.register(print, "atexit hook")
main = threading.main_thread()
threading.Thread(target=lambda: (main.join(), print("thread after the script"))).start()
print("script")
'''


def _forked(groups, work, env=None, unused=()):
    """Runs each `(script, args, env)` of `groups` as `python -c script *args` would (its `env`
    added to the environment), in processes forked from one that has imported NumPy,
    TensorFlow, Keras and keras_bertfam (conftest's `ForkServer`, with `env`, without the
    packages no script here uses: `unused`, "jax" for the TensorFlow-only ones). A group's
    scripts run at once, the groups one after the other. -> each script's
    `(returncode, stdout, stderr)`, in order; the outputs are kept in `work`."""
    server = ForkServer(FORKED_IMPORTS, work, env, unused)
    try:
        return [(run.returncode, run.stdout, run.stderr)
                for group in groups for run in server.run(group, timeout=TIMEOUT)]
    finally:
        server.close()


def _stdout(run):
    """A script's output, after checking that it ended well (else its error)."""
    code, out, err = run
    assert code == 0, err[-3000:]
    return out


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _result(out):
    return json.loads(out.strip().splitlines()[-1])


MIRRORED = COMMON + r'''
os.environ["KERAS_BACKEND"] = "tensorflow"
import traceback
import tensorflow as tf
''' + TF_TEST_SETTINGS + r'''cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, keras_bertfam as kb
from keras_bertfam.cli import PRETRAINERS
vocab, single_out = sys.argv[1], sys.argv[2]
strategy = kb.distribute.get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
result = {"replicas": strategy.num_replicas_in_sync}


def guarded(run, *args):
    try:
        return run(*args)
    except Exception:
        return {"error": traceback.format_exc()}


def step_equality():
    x, y = make_data(batch=8)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # one global batch of 8
    optimizers = {  # AdamW: our fused kernel's update inside strategy.extended.update
        "sgd": lambda: keras.optimizers.SGD(0.5),
        "adamw": lambda: kb.tasks.AdamW(1e-2, weight_decay=0.01, global_clipnorm=1.0)}
    out = {}
    for name, make_optimizer in optimizers.items():
        single = make_task(kb, keras)
        single.compile(optimizer=make_optimizer())
        initial = weights_of(single)
        h1 = single.fit(ds, epochs=1, verbose=0).history
        with strategy.scope():
            dist = make_task(kb, keras)
            dist.set_weights(initial)
            dist.compile(optimizer=make_optimizer())
        h2 = dist.fit(ds, epochs=1, verbose=0).history
        out[name] = {
            "diff": max(float(np.abs(a - b).max()) for a, b in zip(weights_of(single),
                                                                   weights_of(dist))),
            "moved": max(float(np.abs(a - b).max()) for a, b in zip(weights_of(single), initial)),
            "loss1": h1["loss"][0], "loss2": h2["loss"][0]}
        if name == "sgd":  # two other tests' results, from these two tasks
            out["single_3_steps"] = guarded(single_three_steps, single, initial)
            out["dataset_starts"] = guarded(
                lambda: {"starts": dataset_starts_per_fit(dist, ds)})
    return out


def dataset_starts_per_fit(task, ds):
    # How many times fit() under the strategy starts a dataset: once, for the epoch (Keras
    # started it a first time to pull a batch to build the model with, built or not).
    starts, batches = [], list(ds.as_numpy_iterator())

    def generate():
        starts.append(1)
        yield from batches

    task.fit(tf.data.Dataset.from_generator(generate, output_signature=ds.element_spec),
             epochs=1, verbose=0)
    return len(starts)


def single_three_steps(single, initial):
    # test_multi_worker_fit_two_processes' reference: the multi-worker script's 3 global batches
    # of 8 on one device (the default strategy), SGD(0.5) from make_task's weights. The SGD task
    # above, back at its initial weights: the same compiled step, not a second trace.
    default = kb.distribute.get_strategy("default")
    assert not tf.distribute.has_strategy() and tf.distribute.get_strategy() is default
    x, y = make_data(batch=8, steps=3)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 3 global batches of 8
    single.set_weights(initial)
    history = single.fit(ds, epochs=1, verbose=0).history
    np.savez(single_out, *weights_of(single))
    return {"replicas": default.num_replicas_in_sync,
            "history": {k: float(v[-1]) for k, v in history.items()}}


def every_pretrainer():
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    texts = [f"Film {i} was good. I liked the actors a lot. The ending was sad. I would see it "
             "again." for i in range(64)]
    sizes = dict(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
                 hidden_dim=16, intermediate_dim=32, max_sequence_length=32)
    backbones = {"bert": kb.models.BertBackbone, "roberta": kb.models.RobertaBackbone,
                 "albert": kb.models.AlbertBackbone, "distil_bert": kb.models.DistilBertBackbone,
                 "electra": kb.models.ElectraBackbone, "spanbert": kb.models.SpanBertBackbone}
    out = {}
    for family, backbone_cls in backbones.items():
        keras.utils.set_random_seed(0)
        task_cls = getattr(kb.tasks, PRETRAINERS[family])
        with strategy.scope():
            # one layer (each layer's trace costs ~1 s per family here); ALBERT two, so its one
            # shared block is called twice per replica step
            extra = dict(embedding_dim=8, num_layers=2) if family == "albert" else {}
            backbone = backbone_cls(**{**sizes, **extra})
            preprocessor = task_cls.default_preprocessor(tokenizer, backbone, sequence_length=32,
                                                         batch_size=8, seed=0)
            task = task_cls.pretraining_task(backbone, preprocessor)
            task.compile(learning_rate=1e-3)
        before = [keras.ops.convert_to_numpy(w) for w in task.trainable_weights]
        history = task.fit(tf.data.Dataset.from_tensor_slices(texts).batch(16), epochs=1,
                           steps_per_epoch=2, verbose=0).history
        moved = max(float(np.abs(keras.ops.convert_to_numpy(w) - b).max())
                    for w, b in zip(task.trainable_weights, before))
        out[family] = dict({k: float(v[-1]) for k, v in history.items() if k.endswith("loss")},
                           moved=moved)
    return out


# Each part's failure is its own test's (the others still report theirs).
result["step_equality"] = guarded(step_equality)
result["every_pretrainer"] = guarded(every_pretrainer)
print(json.dumps(result))
'''


def tensorflow_processes(bert_vocab, tmp_path_factory):
    """The TensorFlow processes of this file and test_keras_io_data_parallel's (its keras.io
    example, on 2 logical CPUs too), forked from one forker once per test run: the two
    multi-worker processes (`MULTI_WORKER`), then the MirroredStrategy one (`MIRRORED`), then
    the example's (with `ENDS_AS_PYTHON`'s). The first test module that needs them runs them
    (under pytest-xdist, the other worker waits and reads them: test_cli's `scenarios`). ->
    {"workers": the two runs, "mirrored", "example", "ends": a run each, "work": their
    directory}"""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    work = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tf-processes"
    work.mkdir(exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (work / "runs.json").exists():
            from tests.test_keras_io_data_parallel import EXAMPLE, write_wikitext  # imports this

            ports = ",".join(map(str, _free_ports(2)))
            *workers, mirrored, example, ends = _forked(
                [[(MULTI_WORKER, (i, ports, work / f"w{i}.npz"), {}) for i in range(2)],
                 [(MIRRORED, (bert_vocab, work / "single_3_steps.npz"), {})],
                 [(EXAMPLE, (write_wikitext(work / "wikitext-2"), work), {}),
                  (ENDS_AS_PYTHON, (), {})]],
                work, env={"KERAS_BACKEND": "tensorflow"}, unused=("jax",))
            (work / "runs.json").write_text(json.dumps(dict(
                workers=workers, mirrored=mirrored, example=example, ends=ends)))
        return dict(json.loads((work / "runs.json").read_text()), work=work)


@pytest.fixture(scope="module")
def tf_processes(bert_vocab, tmp_path_factory):
    return tensorflow_processes(bert_vocab, tmp_path_factory)


def test_a_forked_script_ends_as_a_fresh_process_would(tf_processes):
    assert _stdout(tf_processes["ends"]).split("\n") == [
        "script", "thread after the script", "atexit hook", ""]


@pytest.fixture(scope="module")
def mirrored(tf_processes):
    """One MirroredStrategy process (2 logical CPUs) for every mirrored case, and the one-device
    reference of the multi-worker test (saved to `single_3_steps.npz`)."""
    result = _result(_stdout(tf_processes["mirrored"]))
    result["single_3_steps_npz"] = tf_processes["work"] / "single_3_steps.npz"
    return result


def _part(result, name):
    part = result[name]
    assert "error" not in part, part.get("error")
    return part


def test_mirrored_step_equals_single_device_step(mirrored):
    assert mirrored["replicas"] == 2
    result = _part(mirrored, "step_equality")
    for out in (result["sgd"], result["adamw"]):
        assert out["moved"] > 1e-3  # the step did change the weights
        assert out["diff"] <= 1e-5, result
        assert abs(out["loss1"] - out["loss2"]) <= 1e-5, result


def test_fit_under_a_strategy_starts_the_dataset_once(mirrored):
    """A built task needs no batch to build before fit (only the optimizer's slots, which Task
    builds without one): the dataset, a raw-text pipeline included, is started once."""
    assert _part(_part(mirrored, "step_equality"), "dataset_starts")["starts"] == 1


MULTI_WORKER = COMMON + r'''
os.environ["KERAS_BACKEND"] = "tensorflow"
index, ports, weights_out = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
    "task": {"type": "worker", "index": index}})
import tensorflow as tf
''' + TF_TEST_SETTINGS + r'''import keras, keras_bertfam as kb
strategy = kb.distribute.get_strategy("multi_worker")
x, y = make_data(batch=8, steps=3)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 3 global batches of 8
with strategy.scope():
    task = make_task(kb, keras)
    task.compile(optimizer=keras.optimizers.SGD(0.5))
history = task.fit(ds, epochs=1, verbose=0).history
np.savez(weights_out, *weights_of(task))
print(json.dumps({"replicas": strategy.num_replicas_in_sync,
                  "history": {k: float(v[-1]) for k, v in history.items()}}))
'''


def test_multi_worker_fit_two_processes(tf_processes, mirrored):
    work = tf_processes["work"]
    # the one-device reference: 3 steps in the mirrored process, on the default strategy
    outs = [_result(_stdout(w)) for w in tf_processes["workers"]] + [
        _part(_part(mirrored, "step_equality"), "single_3_steps")]
    assert [o["replicas"] for o in outs] == [2, 2, 1]
    assert np.isfinite(outs[0]["history"]["loss"]) and outs[0]["history"] == outs[1]["history"]
    w0, w1 = (np.load(work / f"w{i}.npz") for i in range(2))
    single = np.load(mirrored["single_3_steps_npz"])
    for key in w0.files:
        np.testing.assert_array_equal(w0[key], w1[key])  # identical weights on both workers
        # and the same 3 steps as one device on the same global batches
        np.testing.assert_allclose(w0[key], single[key], atol=1e-5)
    assert abs(outs[0]["history"]["loss"] - outs[2]["history"]["loss"]) < 1e-5


# JAX on CPU, XLA's optimizations off and its older fusion code generator, as `make test-jax`
# runs the JAX tests: compiling a tiny model's steps dominates these processes (the
# two-host-devices one: 21.5 -> 14.8 s CPU for the first flag), and each comparison here is
# between steps compiled under the same flags.
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"
JAX_ENV = {"JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "XLA_FLAGS": FAST_COMPILE}

JAX_DP = COMMON + r'''
os.environ["KERAS_BACKEND"] = "jax"
import keras, keras_bertfam as kb
import jax
x, y = make_data(batch=8, steps=2)
single = make_task(kb, keras)
single.compile(optimizer=keras.optimizers.SGD(0.5))
initial = weights_of(single)
single.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
# the two-process test's reference too: two steps on one device, the full global batches
np.savez(sys.argv[1], *weights_of(single))

strategy = kb.distribute.get_strategy("jax_data_parallel")
with strategy.scope():
    dist = make_task(kb, keras)
    dist.set_weights(initial)
    dist.compile(optimizer=keras.optimizers.SGD(0.5))
dist.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
kernel = dist.backbone.embeddings.token_embedding.embeddings
diff = max(float(np.abs(a - b).max()) for a, b in zip(weights_of(single), weights_of(dist)))
moved = max(float(np.abs(a - b).max()) for a, b in zip(weights_of(single), initial))
print(json.dumps({"devices": len(jax.devices()), "diff": diff, "moved": moved,
                  "sharding_devices": len(kernel.value.sharding.device_set)}))
'''


@pytest.fixture(scope="module")
def jax_processes(tmp_path_factory):
    """The JAX processes: the two of one job (`JAX_MULTI_PROCESS`), then the one with 2 host
    devices (`JAX_DP`): DataParallel against one device, whose weights after the same two steps
    (single.npz) are also the two-process test's reference. -> (the two processes' runs, the
    two-devices run, their directory)"""
    work = tmp_path_factory.mktemp("jax")
    address = f"127.0.0.1:{_free_ports(1)[0]}"
    two_devices = {"XLA_FLAGS": FAST_COMPILE + " --xla_force_host_platform_device_count=2"}
    runs = _forked([[(JAX_MULTI_PROCESS, (address, i, work / f"p{i}.npz"), {}) for i in range(2)],
                    [(JAX_DP, (work / "single.npz",), two_devices)]],
                   work, env=dict(JAX_ENV, KERAS_BACKEND="jax"))
    return runs[:2], runs[2], work


def test_jax_data_parallel_two_host_devices(jax_processes):
    out = _result(_stdout(jax_processes[1]))
    assert out["devices"] == 2 and out["sharding_devices"] == 2  # weights replicated on both
    assert out["moved"] > 1e-3
    assert out["diff"] <= 1e-5, out


JAX_MULTI_PROCESS = COMMON + r'''
os.environ["KERAS_BACKEND"] = "jax"
address, index, weights_out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import keras, keras_bertfam as kb
import jax
strategy = kb.distribute.get_strategy(
    "jax_data_parallel", job_addresses=address, num_processes=2, process_id=index)
import tensorflow as tf
x, y = make_data(batch=8, steps=2)
# Every process reads the same global batches of 8; DataParallel shards them per process.
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
with strategy.scope():
    task = make_task(kb, keras)
    task.compile(optimizer=keras.optimizers.SGD(0.5))
task.fit(ds, epochs=1, verbose=0)
np.savez(weights_out,
         *[np.asarray(jax.device_get(w.value.addressable_data(0))) for w in task.weights])
print(json.dumps({"processes": jax.process_count(), "devices": len(jax.devices())}))
'''


def test_jax_data_parallel_two_processes(jax_processes):
    processes, _, work = jax_processes
    outs = [_result(_stdout(p)) for p in processes]
    assert all(o == {"processes": 2, "devices": 2} for o in outs)
    p0, p1 = np.load(work / "p0.npz"), np.load(work / "p1.npz")
    for key in p0.files:
        np.testing.assert_array_equal(p0[key], p1[key])
    # the same two steps as one process on the full global batches (a one-device model in the
    # two-host-devices process: the same script the single-process reference ran)
    ref = np.load(work / "single.npz")
    for key in p0.files:
        np.testing.assert_allclose(p0[key], ref[key], atol=1e-5)


# === Mixed precision (in process, every backend: keras.ops models, preprocessed inputs) ===
@pytest.fixture(scope="module")
def float32_reference():
    """make_task's float32 weights and outputs on make_data(batch=4): both policies' reference."""
    exec(COMMON, scope := {"keras": keras})
    x, y = scope["make_data"](batch=4)
    reference = scope["make_task"](kb, keras, num_layers=2)
    outputs = {k: keras.ops.convert_to_numpy(v)
               for k, v in reference.predict(x, verbose=0).items()}
    return scope, x, y, reference.get_weights(), outputs


@pytest.mark.multibackend
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_train_step(policy, float32_reference):
    scope, x, y, reference_weights, reference = float32_reference
    try:
        keras.mixed_precision.set_global_policy(policy)
        task = scope["make_task"](kb, keras, num_layers=2)
        task.set_weights(reference_weights)
        out = task.predict(x, verbose=0)
        assert task.backbone.compute_dtype == policy.split("_")[1]
        assert all(w.dtype == "float32" for w in task.weights)  # float32 master weights
        np.testing.assert_allclose(out["pair_logits"], reference["pair_logits"], atol=0.05)
        mlm = keras.ops.convert_to_numpy(out["mlm_logits"]).astype("float32")
        assert np.abs(mlm - reference["mlm_logits"]).max() < 0.1
        task.compile(learning_rate=1e-3)
        loss, aux = task.losses_and_metrics(y, task(x, training=True), None)
        # the backend's dtypes by name (torch's is torch.float32, not the string "float32")
        dtypes = {keras.backend.standardize_dtype(v.dtype) for v in [loss, *aux.values()]}
        assert dtypes == {"float32"}
        logs = task.train_on_batch(x, y, return_dict=True)
        assert all(np.isfinite(v) for v in logs.values()), logs
        assert abs(logs["loss"] - float(loss)) < 0.05
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_get_strategy_names():
    assert kb.distribute.get_strategy("default").num_replicas_in_sync == 1
    with pytest.raises(ValueError, match="Unknown strategy"):
        kb.distribute.get_strategy("horovod")
    with pytest.raises(RuntimeError, match="KERAS_BACKEND=jax"):
        kb.distribute.get_strategy("jax_data_parallel")


def test_every_pretrainer_fits_raw_text_under_mirrored(mirrored):
    """Each family's pretraining task (the CLI's choice), raw strings through its preprocessor,
    two steps on 2 logical CPUs: finite losses, every loss term live, weights moved."""
    assert mirrored["replicas"] == 2
    tasks = _part(mirrored, "every_pretrainer")
    assert set(tasks) == {"bert", "roberta", "albert", "distil_bert", "electra", "spanbert"}
    for family, result in tasks.items():
        losses = {k: v for k, v in result.items() if k.endswith("loss")}
        assert all(np.isfinite(v) and v > 0 for v in losses.values()), (family, result)
        assert result["moved"] > 1e-4, (family, result)
