"""The input pipeline: what each rank reads per step, from its own shard or the full batch.

* Sharded (what every launcher does by default): Megatron-LM's MegatronPretrainingSampler hands
  each data-parallel rank its slice of the global batch, torchtitan's ParallelAwareDataloader
  likewise, and MindSpore with ``full_batch=False`` and ``dataset_strategy ((dp, 1),)`` reads
  shard ``rank % (N / pp) // mp`` of dp shards (mindformers/dataset/base_dataset.py,
  _generate_shard_info). A rank reads global_batch / dp sequences per step; the tensor-, context-
  and pipeline-parallel ranks of one data-parallel index read the same shard.
* Full batch (MindSpore ``full_batch=True``, dataset_strategy "full_batch"): every rank reads the
  whole global batch (mindformers/trainer/base_trainer.py multiplies the per-card batch by
  data_parallel) and the graph slices it by the first operator's strategy.

What a sample weighs and who reads it follow the framework:

* Megatron-LM: GPTDataset.__getitem__ (megatron/core/datasets/gpt_dataset.py) returns tokens and
  labels as int64, loss_mask as float32 and position_ids as int64, seq_length each, and with
  unfused attention the s x s boolean attention mask (Megatron builds it by default; advisor's
  export passes --no-create-attention-mask-in-dataloader for fused attention, which takes none);
  only tensor-parallel rank 0 of the first and last pipeline stages reads (get_batch returns nothing
  on the middle stages; get_batch_on_this_tp_rank broadcasts to the other tensor-parallel ranks),
  each context-parallel rank its dp shard's whole sequences (then its slice).
* torchtitan (and plain PyTorch): input and label ids as int64 (torchtitan/hf_datasets/
  text_datasets.py), read by every rank.
* MindSpore: seq_length + 1 token ids as int32 (MindFormers' legacy causal-LM path reads input_ids
  and shifts them for the labels; its train_dataset.input_columns ["input_ids"]), read by every rank.

Device memory: MindSpore sinks a step's samples to the device at once (its dataset batch is the
per-card batch times micro_batch_num under pipelining, times the accumulation steps otherwise),
other frameworks one micro-batch at a time (Megatron's get_batch per micro-batch); with the next
one prefetched, twice that.

Host traffic: the ranks of a node copy their samples over their PCIe links each step. The loader
works ahead (prefetch), so only a copy longer than the step shows, as host time.
"""

from __future__ import annotations

import numpy as np

from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob

# the batch in use and the next one (MindFormers' templates: train_dataset prefetch_size 1, one batch
# ahead); the PyTorch loaders prefetch into host memory and copy one micro-batch at a time, so for
# them twice is an upper bound of what the device holds
PREFETCHED = 2.0


def sample_bytes(job: TrainingJob) -> float:
    """Bytes of one sample as the framework's loader hands it over (module docstring; the record's
    sample_bytes_per_token, sample_extra_tokens and builds_attention_mask)."""
    fw = job.framework_record
    # with unfused attention Megatron's loader also builds the s x s boolean mask (the export turns it
    # off for fused attention: --no-create-attention-mask-in-dataloader)
    mask = float(job.seq_length) ** 2 if fw.builds_attention_mask and job.attention != "flash" else 0.0
    return (job.seq_length + fw.sample_extra_tokens) * fw.sample_bytes_per_token + mask


def reading_ranks(job: TrainingJob, dp: int, cp: int, pp: int, devices: int) -> int:
    """Ranks that read samples from storage each step (module docstring)."""
    return dp * cp * min(pp, 2) if job.framework_record.reads_on_end_stages_only else devices


def samples_per_step(job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """Samples one rank reads per optimizer step: its data-parallel shard or the whole batch."""
    shard = job.global_batch_size / b.dp.astype(float)
    return np.where(b.full_batch, float(job.global_batch_size), shard)


def device_bytes(job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """Input buffers on one device: a step's samples (MindSpore's data sink) or one micro-batch's
    (everyone else's per-micro-batch loading), twice for the prefetched next one."""
    per_step = samples_per_step(job, b)
    at_once = per_step if job.framework_record.sinks_whole_step else per_step / b.num_micro_batches.astype(float)
    return PREFETCHED * at_once * sample_bytes(job)


def host_copy_s(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """Seconds one rank's PCIe link takes to carry the step's samples to the device."""
    return samples_per_step(job, b) * sample_bytes(job) / (hw.host.pcie_bandwidth_gbps * 1e9)


def exposed_s(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, step_s: np.ndarray) -> np.ndarray:
    """What the input copies add to a step of ``step_s`` seconds (the loader runs one step ahead)."""
    return np.maximum(host_copy_s(hw, job, b) - step_s, 0.0)


def cluster_read_gb(job: TrainingJob, strategy, devices: int) -> float:
    """GB the cluster's reading ranks take from storage per step: each its shard or the whole batch
    (MindFormers' performance guide: full_batch=True puts a dp-fold redundant read on every card,
    which, summed over a large cluster, overloads the shared storage)."""
    s = strategy
    samples = job.global_batch_size if s.full_batch else job.global_batch_size / s.dp
    return samples * sample_bytes(job) * reading_ranks(job, s.dp, s.cp, s.pp, devices) / 1e9
