"""Pipeline schedule time from per-stage micro-batch times.

With p stages of micro-batch time t_i (forward + backward), m micro-batches and v virtual stages per
device, the last micro-batch leaves the pipeline after m * max(t) + (sum(t) - max(t)) / v:
the slowest stage works m times back to back and every other stage adds its share of the fill and
drain once, shortened v times by interleaving. For equal stages this is the familiar
(m + (p - 1) / v) * t, i.e. a bubble fraction (p - 1) / (v * m) (Narayanan et al. SC'21, section 2.2;
GPipe and 1F1B have the same bubble, 1F1B only lowers memory).
"""

from __future__ import annotations

import numpy as np


def pipeline_time_s(stage_time_s, active, num_micro_batches, virtual_stages):
    """(total seconds, bubble seconds, slowest stage index) for (N, P) stage times."""
    t = np.where(active, stage_time_s, 0.0)
    slowest = np.argmax(t, axis=1)
    t_max = t[np.arange(t.shape[0]), slowest]
    m = num_micro_batches.astype(float)
    v = virtual_stages.astype(float)
    fill = (t.sum(axis=1) - t_max) / v
    return m * t_max + fill, fill, slowest
