"""The deterministic training program every rank runs (tiny decoder-only LM, DDP)."""

from chaos.workload.config import WorkloadConfig

__all__ = ["WorkloadConfig"]
