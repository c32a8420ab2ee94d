"""tf.data options of our pretraining pipelines, A/B against the model alone: one process,
variants interleaved (the order reversed every round), wall and process CPU per step.

Variants (`--variants`, comma-separated; the first is the reference of the ratios):
  M_static  the model alone on the pipeline's first batches held in memory (static shapes)
  M_dyn     the same with the batch dimension unknown, as the pipeline's (`[None, ...]`)
  E         end to end: `task.fit` on raw strings through the preprocessor's `prepare`
  E_pool1, E_intra1, E_pool1_intra1, E_noauto, E_pool1_noauto: E with `tf.data.Options`
            (threading.private_threadpool_size=1, threading.max_intra_op_parallelism=1,
            autotune.enabled=False) set on the dataset `prepare` returns
Peers (`--peer`): ours_blocks (MaskedLM, token blocks), ours_nsp, ours_nsp_grouped
(BertPretrainer, SentencePairPreprocessor; grouped: `--group` batches per group, whole groups
timed). BERT-Mini, batch 16 x 128, TensorFlow backend.

Usage: python bench/bench_input_options.py [--peer ours_blocks] [--variants M_static,E,E_pool1]
       [--steps 6] [--warmup 2] [--rounds 6]
Not a test: numbers depend on the machine and its load (printed); compare CPU per step when
the machine is loaded (another process barely moves it), wall only when it is idle.
"""
import argparse, os, sys, time, statistics as st
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_pretrain_e2e as b
import keras, numpy as np, tensorflow as tf
import keras_bertfam as kb

p = argparse.ArgumentParser()
p.add_argument("--peer", default="ours_blocks")
p.add_argument("--variants", default="M_static,M_dyn,E")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--rounds", type=int, default=6)
p.add_argument("--group", type=int, default=10)
a = p.parse_args()
print("keras_bertfam from", kb.__file__, "load average", os.getloadavg(), flush=True)
keras.utils.set_random_seed(0)
texts = b.load_texts(2048)
strings = tf.data.Dataset.from_tensor_slices(texts).repeat()
B = 16
tok = kb.preprocessing.WordPieceTokenizer(vocabulary=b.vocab_path(), lowercase=True)
backbone = kb.models.BertBackbone(30522, dropout=0.1, max_sequence_length=512, **b.CONFIGS["mini"])
warmup, steps = a.warmup, a.steps
if a.peer.startswith("ours_nsp"):
    grouped = a.peer == "ours_nsp_grouped"
    pre = kb.preprocessing.SentencePairPreprocessor(tok, 128, batch_size=B, seed=0, group_by_length=grouped)
    task = kb.tasks.BertPretrainer(backbone, preprocessor=pre)
    if grouped:
        pre.group_by_length_batches = a.group
        warmup, steps = a.group, a.group
else:
    pre = kb.preprocessing.MaskedLMPreprocessor(tok, 128, packing="token_blocks", batch_size=B, seed=0)
    task = kb.tasks.MaskedLM(backbone, preprocessor=pre)
task.compile()
n = warmup + steps
batches = list(pre.prepare(strings.batch(B)).take(n))
fixed = tf.data.Dataset.from_tensors(batches[0])
for x in batches[1:]:
    fixed = fixed.concatenate(tf.data.Dataset.from_tensors(x))
dyn = fixed.map(lambda *e: tf.nest.map_structure(
    lambda t: tf.raw_ops.PlaceholderWithDefault(input=t, shape=[None] + t.shape[1:]), e))
print("static spec", fixed.element_spec[0]["token_ids"], "dyn", dyn.element_spec[0]["token_ids"])
print("e2e spec", pre.prepare(strings.batch(B)).element_spec[0]["token_ids"], flush=True)

times = []
class Timer(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        times.append((time.perf_counter(), time.process_time()))

def with_opts(ds, **kw):
    o = tf.data.Options()
    for k, v in kw.items():
        obj = o
        parts = k.split("__")
        for q in parts[:-1]:
            obj = getattr(obj, q)
        setattr(obj, parts[-1], v)
    return ds.with_options(o)

orig_prepare = type(pre).prepare
def e2e_with(**kw):
    def run(n):
        def prepare(self, ds, training=True, batch_size=None):  # (a task passes batch_size)
            return with_opts(orig_prepare(self, ds, training), **kw) if kw else orig_prepare(self, ds, training)
        type(pre).prepare = prepare
        try:
            task.fit(strings.batch(B), steps_per_epoch=n, epochs=1, verbose=0, callbacks=[Timer()])
        finally:
            type(pre).prepare = orig_prepare
    return run

VARIANTS = {
    "M_static": lambda n: keras.Model.fit(task, fixed, steps_per_epoch=n, epochs=1, verbose=0, callbacks=[Timer()]),
    "M_dyn": lambda n: keras.Model.fit(task, dyn, steps_per_epoch=n, epochs=1, verbose=0, callbacks=[Timer()]),
    "E": e2e_with(),
    "E_pool1": e2e_with(threading__private_threadpool_size=1),
    "E_intra1": e2e_with(threading__max_intra_op_parallelism=1),
    "E_pool1_intra1": e2e_with(threading__private_threadpool_size=1, threading__max_intra_op_parallelism=1),
    "E_noauto": e2e_with(autotune__enabled=False),
    "E_pool1_noauto": e2e_with(threading__private_threadpool_size=1, autotune__enabled=False),
}
names = a.variants.split(",")
res = {k: [] for k in names}
for r in range(a.rounds):
    order = names if r % 2 == 0 else names[::-1]
    for k in order:
        times.clear()
        VARIANTS[k](n)
        w = [t1[0] - t0[0] for t0, t1 in zip(times[warmup - 1:], times[warmup:])]
        c = [t1[1] - t0[1] for t0, t1 in zip(times[warmup - 1:], times[warmup:])]
        res[k].append((w, c))
        print(f"r{r} {k:16s} wall {1000*np.mean(w):6.0f} cpu {1000*np.mean(c):6.0f}  steps " + " ".join(f"{1000*t:.0f}" for t in w), flush=True)
print("load", os.getloadavg())
base = names[0]
for k in names:
    walls = [np.mean(w) for w, c in res[k]]
    cpus = [np.mean(c) for w, c in res[k]]
    ratio = [np.mean(w) / np.mean(w0) for (w, _), (w0, _) in zip(res[k], res[base])]
    print(f"{k:16s} wall mean {1000*np.mean(walls):6.0f} median-of-rounds {1000*np.median(walls):6.0f}  cpu {1000*np.mean(cpus):6.0f}  "
          f"wall/{base} per round median {np.median(ratio):.3f} ({' '.join(f'{x:.2f}' for x in ratio)})")
