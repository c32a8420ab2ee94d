"""What a TensorFlow train step keeps from its forward pass for its backward pass, by size.

Builds `kb.tasks.MaskedLM(kb.models.BertBackbone(...))` as `bench_step_memory.py` does, traces
its `train_step` into one graph (what `fit` runs), and sums the sizes of the forward tensors
that the backward pass reads (the backward pass: the ops downstream of the loss's seed
gradient); those live from the forward pass to the backward one. Grouped by the producing op's
type, by its layer (the name scope with block numbers folded), and both; the biggest single
tensors with the gradient ops that read them; the sizes of the weights and Adam's moments.
Static shapes (the fixed 16 x 128 batch): exact sizes. The graph is the one before Grappler,
and a Reshape's (or Identity's) output shares its input's buffer: an upper bound of what is
held; the distinct buffers are also summed (weights' reshapes left out). Grappler may fold a
transpose away (2026-11-26 at base: the MLM head's 89 MB table transpose).

Usage: python bench/kept_tensors.py [--config base|mini|tiny] [--dropout 0.1] [--top 25]
       (KEPT_GREP=block_3_ in the environment also lists every kept tensor whose name has it)
"""
import argparse
import collections
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="base")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.join(HERE, ".."))
    sys.path.insert(0, HERE)
    import numpy as np
    import tensorflow as tf

    from bench_step_memory import fixed_batch_and_task

    data, task = fixed_batch_and_task(args.config, args.dropout)
    x, y, w = data
    task.train_on_batch(x, y, sample_weight=w)  # builds the optimizer's variables
    graph = tf.function(task.train_step).get_concrete_function(
        tf.nest.map_structure(tf.convert_to_tensor, data)).graph

    def size(t):
        shape = t.shape
        if shape.rank is None or not shape.is_fully_defined():
            return 0
        return int(np.prod(shape.as_list(), dtype=np.int64)) * t.dtype.size

    # The backward pass: the ops downstream of the loss's seed gradient (a Const `ones` the
    # tape's ops read), the optimizer's update included. Ops of the tape that need no upstream
    # gradient (e.g. `x - mean` in a LayerNorm's gradient) run in the forward pass, and their
    # outputs are counted as kept; a custom gradient's ops (not named gradient_tape/) are not.
    backward = set()
    todo = [op for op in graph.get_operations()
            if op.type == "Const" and re.fullmatch(r"ones(_\d+)?", op.name)
            and any("gradient_tape/" in c.name for c in op.outputs[0].consumers())]
    assert todo, "no seed gradient found"
    while todo:
        op = todo.pop()
        if op.name in backward:
            continue
        backward.add(op.name)
        todo.extend(c for t in op.outputs for c in t.consumers())
        todo.extend(op._control_outputs)

    def is_grad(op):
        return op.name in backward

    def layer_of(op):
        name = op.name.replace("gradient_tape/", "")
        parts = name.split("/")[:-1]
        scope = "/".join(p for p in parts if p not in ("mask_ed_lm", "masked_lm"))
        scope = re.sub(r"block_\d+", "block_*", scope)
        scope = re.sub(r"_\d+(?=/|$)", "", scope)
        return scope or "(top)"

    kept = {}
    for op in graph.get_operations():
        if not is_grad(op):
            continue
        for t in op.inputs:
            src = t.op
            if is_grad(src) or src.type in ("Const", "ReadVariableOp", "Placeholder",
                                            "VarHandleOp", "Shape"):
                continue
            kept[t.name] = t
    by_type, by_layer, total = collections.Counter(), collections.Counter(), 0
    for t in kept.values():
        n = size(t)
        total += n
        by_type[t.op.type] += n
        by_layer[layer_of(t.op)] += n
    mb = lambda n: f"{n / 2**20:9.1f} MB"  # noqa: E731
    print(f"forward tensors read by gradient ops: {len(kept)}, {mb(total)}")

    def buffer_of(t):  # the tensor whose buffer a Reshape / Identity chain shares
        while t.op.type in ("Reshape", "Identity", "IdentityN", "ExpandDims", "Squeeze"):
            t = t.op.inputs[0] if t.op.type != "IdentityN" else t.op.inputs[t.value_index]
        return t

    buffers = {}
    for t in kept.values():
        b = buffer_of(t)
        if b.op.type not in ("ReadVariableOp", "Const", "Placeholder"):
            buffers[b.name] = max(buffers.get(b.name, 0), size(t))
    print(f"  as distinct buffers, weights' reshapes left out: {len(buffers)}, "
          f"{mb(sum(buffers.values()))}")
    print("\nby producing op type:")
    for k, n in by_type.most_common(20):
        print(f"  {mb(n)}  {k}")
    print("\nby layer (numbers folded):")
    for k, n in by_layer.most_common(30):
        print(f"  {mb(n)}  {k}")
    print(f"\n{args.top} biggest kept tensors:")
    for t in sorted(kept.values(), key=size, reverse=True)[:args.top]:
        users = sorted({c.type for c in t.consumers() if is_grad(c)})
        print(f"  {mb(size(t))}  {t.op.type:22s} {t.name}  {t.shape}  <- {users}")
    if os.environ.get("KEPT_GREP"):
        for t in kept.values():
            if os.environ["KEPT_GREP"] in t.name:
                print("  grep", mb(size(t)), t.op.type, t.name, t.shape, sorted({c.name for c in t.consumers() if is_grad(c)})[:3])
    print("\nkept, by op type x layer:")
    both = collections.Counter()
    for t in kept.values():
        both[(layer_of(t.op), t.op.type)] += size(t)
    for (k, typ), n in both.most_common(args.top):
        print(f"  {mb(n)}  {typ:12s} {k}")
    weights = sum(int(np.prod(v.shape)) * 4 for v in task.trainable_variables)
    print(f"\ntrainable weights {mb(weights)}; Adam moments {mb(2 * weights)}; "
          f"a dense gradient of every weight {mb(weights)}")


if __name__ == "__main__":
    main()
