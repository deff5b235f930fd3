"""Bounds on what advisor reads from files and flags.

Every bound sits far above the largest published configuration it guards (so no real input meets
it) and far below where arithmetic, memory or time would run away (so no hostile input gets past
it). A value beyond a bound is refused with the bound named (advisor.specs._fields).
"""

from __future__ import annotations

# ---- files ------------------------------------------------------------------------------------
# The largest file advisor reads as input is a plan (a few KB) or a fitted hardware profile (about
# 6 KB, hardware_profiles/); shared/validation/calibration_runs.yaml, the largest YAML in the
# project, is about 0.55 MB. PyYAML's safe loader builds a node per value before the Python
# objects: measured on a loaded 2-core machine, 1 MiB of YAML took 2.4 s with libyaml (6.7 s in
# pure Python) and about 150 MB, 4 MiB took 20 s and 670 MB in pure Python; so YAML is held to
# 1 MiB. JSON parses in C at well over 50 MB/s and may be 4 MiB (large operator-strategy plans).
MAX_YAML_BYTES = 2 ** 20
MAX_JSON_BYTES = 4 * 2 ** 20
# Nesting of mappings and lists. A plan nests 6 levels (hardware.node.intra_node.collectives.
# all_reduce.latency_us); Python's own recursion limit is 1000 frames, which the YAML composer and
# json's decoder would otherwise reach (a RecursionError instead of a message).
MAX_DEPTH = 64
# Values (mappings, lists and scalars, each alias expanded where it is used) in one file. A
# billion-laughs YAML file expands a few hundred bytes into 10**9 values; the bundled files hold
# a few hundred values each. One million values is walked in about a second.
MAX_VALUES = 1_000_000
# Mapping keys and names (model.name, hardware.name, device.name): the longest bundled name is
# 36 characters (shared/validation/calibration_runs.yaml run ids).
MAX_NAME_CHARS = 200
# Any other string (notes, source): the longest bundled one is 901 characters (a model's source).
MAX_TEXT_CHARS = 8192
# Integers anywhere: 2**53 is the largest range in which float64 represents every integer
# (IEEE 754 binary64, 53-bit significand), so counts survive the cost model's float arithmetic.
MAX_INT = 2 ** 53
# Positive real quantities (GiB, GB/s, TFLOP/s, microseconds, parameters, tokens, USD, W): the
# largest bundled figure is 1.008e12 (models/megatron-1t.yaml published_params), the smallest
# 0.002 (a GEMM efficiency point of hardware_profiles/dgx-b200.yaml); the largest token budget
# published is 3.6e13 (Qwen3 technical report, 2025). Bounds of 1e-12 and 1e18 keep every product
# and quotient the cost model forms far from float64's 1.8e308 overflow and 2.2e-308 underflow.
MIN_POSITIVE = 1e-12
MAX_QUANTITY = 1e18

# ---- models -------------------------------------------------------------------------------------
# Largest published: 128 layers (Megatron 1T, Narayanan et al. SC'21 table 1), hidden 25,600
# (Megatron 1T), vocabulary 262,144 = 2**18 (Gemma 3), context 10M tokens (Llama 4 Scout),
# 1,048,576 = 2**20 experts (He 2024, "Mixture of A Million Experts", arXiv 2407.04153).
MAX_LAYERS = 10_000
MAX_HIDDEN = 2 ** 20
MAX_FFN_HIDDEN = 2 ** 24
MAX_HEADS = 2 ** 16
MAX_VOCAB = 2 ** 24
MAX_SEQ_LENGTH = 2 ** 26
MAX_EXPERTS = 2 ** 20
# Rows of one embedding table: the largest published tables hold about 10**10 rows (Meta's DLRM
# production models, Mudigere et al. 2022, "Software-Hardware Co-design for Fast and Scalable
# Training of Deep Learning Recommendation Models", table 1: up to 12T parameters in total).
MAX_EMBEDDING_ROWS = 2 ** 40

# ---- clusters and jobs --------------------------------------------------------------------------
# The largest training clusters reported hold 100,000-200,000 GPUs (xAI Colossus, 2024-25); the
# largest scale-up domain is 576 GPUs (NVIDIA GB200 NVL576).
MAX_DEVICES = 2 ** 20
MAX_DEVICES_PER_NODE = 2 ** 12
# Sequences per optimizer step: GPT-3 175B used 1,536 x 2,048 tokens (Brown et al. 2020, table 2.1);
# 2**30 sequences is far beyond any published batch even at sequence length 1.
MAX_GLOBAL_BATCH = 2 ** 30
