"""The deterministic training program every rank runs (tiny decoder-only LM; DDP, FSDP2, HSDP or tensor parallel)."""

from chaos.target.workload.config import WorkloadConfig

__all__ = ["WorkloadConfig"]
