"""BERTology: attention maps and their statistics, head importance, structural head pruning and
probing classifiers (Clark et al. 2019; Michel et al. 2019; Voita et al. 2019; Tenney et al. 2019;
Hewitt & Liang 2019).

Uses models and tasks; nothing below imports it. Plotting needs matplotlib
(`pip install keras-bertfam[analysis]`).
"""
from keras_bertfam.analysis.pruning import prune_heads
