"""Accelerator profiles: what `ACCELERATOR = 'tpu_v3_8'` means.

Peak figures are the vendors' published dense bf16/fp16 numbers; prices are approximate
on-demand and preemptible (spot) list prices per hour in a US region, for estimates only.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Accelerator:
    name: str
    type: str  # "cpu", "gpu" or "tpu"
    replicas: int  # data-parallel replicas the strategy will have
    hosts: int = 1
    memory_gb_per_replica: float = 0.0
    peak_tflops_per_replica: float = 0.0
    usd_per_hour: float = 0.0
    usd_per_hour_preemptible: float = 0.0

    @property
    def needs_gcs(self) -> bool:
        """TPUs read and write only gs:// (the TPU hosts cannot see your disk)."""
        return self.type == "tpu"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in [
    Accelerator("cpu", "cpu", 1, memory_gb_per_replica=16, peak_tflops_per_replica=0.2),
    # The CPU split into 8 logical devices: runs the per-replica code of a v3-8 (per-replica
    # batches, gradient all-reduce, metric aggregation) on any machine, to test a TPU
    # experiment's batch and loss arithmetic before paying for the TPU.
    Accelerator("cpu_x8", "cpu", 8, memory_gb_per_replica=2, peak_tflops_per_replica=0.025),
    Accelerator("gpu", "gpu", 1, memory_gb_per_replica=16, peak_tflops_per_replica=65,
                usd_per_hour=0.35, usd_per_hour_preemptible=0.14),
    Accelerator("a100", "gpu", 1, memory_gb_per_replica=40, peak_tflops_per_replica=312,
                usd_per_hour=3.67, usd_per_hour_preemptible=1.47),
    Accelerator("h100", "gpu", 1, memory_gb_per_replica=80, peak_tflops_per_replica=989,
                usd_per_hour=11.06, usd_per_hour_preemptible=3.72),
    Accelerator("tpu_v2_8", "tpu", 8, memory_gb_per_replica=8, peak_tflops_per_replica=22.5,
                usd_per_hour=4.50, usd_per_hour_preemptible=1.35),
    Accelerator("tpu_v3_8", "tpu", 8, memory_gb_per_replica=16, peak_tflops_per_replica=52.5,
                usd_per_hour=8.00, usd_per_hour_preemptible=2.40),
    Accelerator("tpu_v4_8", "tpu", 4, memory_gb_per_replica=32, peak_tflops_per_replica=275,
                usd_per_hour=12.88, usd_per_hour_preemptible=3.86),
    Accelerator("tpu_v5e_8", "tpu", 8, memory_gb_per_replica=16, peak_tflops_per_replica=197,
                usd_per_hour=9.60, usd_per_hour_preemptible=3.84),
    Accelerator("tpu_v2_32", "tpu", 32, hosts=4, memory_gb_per_replica=8,
                peak_tflops_per_replica=22.5, usd_per_hour=24.00, usd_per_hour_preemptible=7.20),
]}
