"""PNG figures of `kb.analysis` (matplotlib, the optional `[analysis]` extra)."""
import os

import numpy as np


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("kb.analysis plots need matplotlib: pip install "
                          "'keras-bertfam[analysis]' (or pip install matplotlib).") from e
    return plt


def _save(fig, path):
    """Writes the figure to `path` (".png" appended when it has no extension, as matplotlib
    does) and returns the path of the file written."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        _pyplot().close(fig)
        raise ValueError(f"The path of a plot must be a file name, got {path!r}.")
    path = os.fspath(path)
    if os.path.isdir(path):
        _pyplot().close(fig)
        raise ValueError(f"The path of a plot must be a file name, got {path!r}, which is a "
                         "directory.")
    extension = os.path.splitext(path)[1]
    if not extension:
        path += ".png"
    else:
        formats = fig.canvas.get_supported_filetypes()
        if extension[1:].lower() not in formats:
            _pyplot().close(fig)
            raise ValueError(
                f"The path of a plot {path!r} ends in {extension!r}, which is not an image "
                f"format: expected .png (or {', '.join('.' + f for f in sorted(formats))}), or "
                "no extension for .png.")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _is_index(i, n):
    return not isinstance(i, bool) and isinstance(i, (int, np.integer)) and 0 <= i < n


def plot_attention(maps, path, index=0, layer=None, head=None):
    """Draws text `index`'s attention to a PNG at `path` and returns the path.

    Without `layer`/`head`: a layer x head grid of small (T, T) maps. With both: one head's
    token-to-token map with the tokens on both axes (query rows, key columns), sized so that the
    labels of 64 tokens stay readable."""
    from keras_bertfam.analysis.attention import AttentionMaps

    if not isinstance(maps, AttentionMaps):
        raise TypeError("plot_attention takes the AttentionMaps of kb.analysis.attention_maps.")
    if not _is_index(index, len(maps)):
        raise ValueError(f"index {index} is out of range: there are {len(maps)} texts.")
    layers, tokens = maps.maps[index], maps.tokens[index]
    plt = _pyplot()
    if (layer is None) != (head is None):
        raise ValueError("Give both layer and head (a single map) or neither (the grid).")
    if layer is not None:
        if not _is_index(layer, len(layers)):
            raise ValueError(f"layer {layer} is out of range: the model has {len(layers)} layers.")
        if not _is_index(head, layers[layer].shape[0]):
            raise ValueError(f"head {head} is out of range: layer {layer} has "
                             f"{layers[layer].shape[0]} heads.")
        t = len(tokens)
        side = max(5.0, 0.16 * t + 1.5)
        fig, ax = plt.subplots(figsize=(side + 1.0, side))
        image = ax.imshow(layers[layer][head], cmap="viridis", vmin=0.0, vmax=1.0)
        size = 9 if t <= 24 else 7 if t <= 48 else 6
        ax.set_xticks(range(t))
        ax.set_yticks(range(t))
        ax.set_xticklabels(tokens, rotation=90, fontsize=size)
        ax.set_yticklabels(tokens, fontsize=size)
        ax.set_xlabel("attended to (key)")
        ax.set_ylabel("attending (query)")
        ax.set_title(f"{maps.family}: layer {layer}, head {head}")
        fig.colorbar(image, ax=ax, fraction=0.04)
        return _save(fig, path)
    rows, cols = len(layers), max(m.shape[0] for m in layers)
    fig, axes = plt.subplots(rows, max(cols, 1), figsize=(1.3 * max(cols, 1) + 0.5,
                                                          1.3 * rows + 0.5), squeeze=False)
    for i in range(rows):
        for j in range(max(cols, 1)):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j < layers[i].shape[0]:
                ax.imshow(layers[i][j], cmap="viridis", vmin=0.0, vmax=1.0)
            else:
                ax.axis("off")  # a pruned head
            if j == 0:
                ax.set_ylabel(f"L{i}", fontsize=8)
            if i == 0:
                ax.set_title(f"H{j}", fontsize=8)
    fig.suptitle(f"{maps.family}: attention of text {index} ({len(tokens)} tokens), "
                 "layer x head", fontsize=10)
    return _save(fig, path)


def plot_heads(values, path, title="head importance", cmap="magma", fmt=".2f"):
    """An (L, N) per-head table (importance, accuracy drop, a statistic) as an annotated heat map;
    NaN cells (pruned heads) stay blank."""
    values = np.asarray(values, dtype="float64")
    if values.ndim != 2 or not values.size:
        raise ValueError(f"plot_heads takes an (L, N) array, got shape {values.shape}.")
    plt = _pyplot()
    rows, cols = values.shape
    fig, ax = plt.subplots(figsize=(0.6 * cols + 2.0, 0.5 * rows + 1.5))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto")
    for i in range(rows):
        for j in range(cols):
            if np.isfinite(values[i, j]):
                ax.text(j, i, format(values[i, j], fmt), ha="center", va="center", fontsize=6,
                        color="white" if image.norm(values[i, j]) < 0.6 else "black")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.04)
    return _save(fig, path)


def plot_curve(series, path, xlabel, ylabel, title=""):
    """Line plot: `series` is `{label: (xs, ys)}`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    return _save(fig, path)
