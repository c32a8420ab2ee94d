"""BERTology: attention maps and their statistics, head importance, structural head pruning and
probing classifiers (Clark et al. 2019; Michel et al. 2019; Voita et al. 2019; Tenney et al. 2019;
Hewitt & Liang 2019).

Uses models and tasks; nothing below imports it. Plotting needs matplotlib
(`pip install keras-bertfam[analysis]`).
"""
from keras_bertfam.analysis.attention import (
    AttentionMaps, attention_maps, attention_statistics)
from keras_bertfam.analysis.importance import (
    HeadImportance, PruningCurve, evaluate_with_mask, head_importance, iterative_pruning,
    normalize_importance)
from keras_bertfam.analysis.plots import plot_attention, plot_curve, plot_heads
from keras_bertfam.analysis.pruning import prune_heads
from keras_bertfam.analysis.probing import (
    ProbeResult, SelfAttentiveSpanPool, edge_probe, plot_probe, probe, representations)
