"""Where the workload computes: ``device=cpu`` (gloo) or ``device=cuda`` (one GPU per rank, NCCL).

Three parties use this module, and only the rank imports torch's CUDA side:

* the harness, before any rank starts: ``check`` (from ``Scenario.validate``) raises a
  ConfigError when CUDA is not available or fewer GPUs are visible than there are ranks,
  and ``golden_facts`` adds the GPUs and CUDA version to the golden-run cache key;
* the supervisor (``chaos.launch.cluster``): ``rank_env`` gives each rank its own
  ``CUDA_VISIBLE_DEVICES``, so rank ``r`` sees exactly one device — the ``r``-th one the
  harness sees — as ``cuda:0``;
* the rank (``chaos.target.workload.train``): ``setup`` binds the device, picks the determinism
  settings and names the process-group backend.

Why one visible device per rank rather than ``torch.cuda.set_device(local_rank)`` with
every GPU visible: a rank then cannot touch (or make a CUDA context on) another rank's
GPU by accident, every rank's tensors live on ``cuda:0`` so a shard saved by rank 1 loads
on any rank (an elastic restart renumbers ranks) without device remapping, and the CUDA
RNG state a checkpoint carries is that rank's one device. The ranks are forked from the
warm fork server, which imports torch but never initialises CUDA, so the variable set in
the forked rank (``RankSpec.env``, applied first thing) is what CUDA reads at its start.
The price: NCCL may not use peer-to-peer copies between processes that cannot see each
other's device and falls back to shared memory — fine for correctness runs, slower for
benchmarks.

The training group is ``cpu:gloo,cuda:nccl``: every collective on CUDA tensors (DDP's
gradient all-reduce, FSDP's all-gathers and reduce-scatters) runs on NCCL, while the
few CPU-tensor collectives on the default group (the noise seed broadcast, a user
checkpointer's CPU messages) still work. Checkpointers keep making their own gloo
group for their small messages (``chaos.reference.checkpoint.comm``, ``chaos.target.adapters.dcp``).
"""

from __future__ import annotations

import os
from typing import Any

from chaos.errors import ConfigError

CUDA_BACKEND = "cpu:gloo,cuda:nccl"
# cuBLAS repeats its results only with a fixed workspace (PyTorch's reproducibility notes).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def _visible_list() -> list[str] | None:
    """The harness's own ``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs), None when unset."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]


def unavailable(ranks: int) -> str | None:
    """Why ``ranks`` ranks cannot each get a GPU here, or None when they can.

    Uses ``torch.cuda.is_available`` and ``device_count`` (NVML-based, so the harness does
    not initialise CUDA for the answer); the reason starts with "no CUDA device:" when there
    is none at all, which is the text GPU-only tests skip with.
    """
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"torch {torch.__version__} is a CPU-only build"
        else:
            why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU or driver"
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        if hidden is not None:
            why += f"; CUDA_VISIBLE_DEVICES={hidden!r}"
        return f"no CUDA device: torch.cuda.is_available() is false ({why})"
    count = torch.cuda.device_count()
    if count < ranks:
        where = f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
        return f"{ranks} ranks need {ranks} CUDA devices (one each), but {count} visible{where}"
    return None


def check(device: str, world_size: int) -> None:
    """Raise a ConfigError, before any rank starts, when ``device`` cannot run ``world_size`` ranks here."""
    if device != "cuda":
        return
    why = unavailable(world_size)
    if why is not None:
        raise ConfigError(f"--device cuda: {why}")


def rank_env(workload: dict[str, Any], rank: int) -> dict[str, str]:
    """The environment the supervisor gives rank ``rank``: its one GPU (nothing for cpu).

    Rank ``r`` gets the ``r``-th device the harness sees: entry ``r`` of the harness's own
    ``CUDA_VISIBLE_DEVICES`` when that is set (so a runner that hands the job GPUs 4-7
    keeps them), else index ``r``.
    """
    if workload.get("device", "cpu") != "cuda":
        return {}
    visible = _visible_list()
    if visible is None:
        return {"CUDA_VISIBLE_DEVICES": str(rank)}
    if rank >= len(visible):
        raise ConfigError(f"--device cuda: rank {rank} has no GPU: CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} lists {len(visible)}")
    return {"CUDA_VISIBLE_DEVICES": visible[rank]}


def golden_facts(device: str, world_size: int) -> dict[str, Any]:
    """What besides the workload decides a cuda golden run's numbers: the CUDA build and the GPUs.

    Empty for cpu, so every CPU golden key stays what it was. The GPU names come from
    ``torch.cuda.get_device_name``, which initialises CUDA in the harness process; that is
    safe because ranks are forked from the fork server (its own fresh interpreter), never
    from the harness.
    """
    if device != "cuda":
        return {}
    import torch

    facts: dict[str, Any] = {"device": "cuda", "process_group": CUDA_BACKEND, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        count = min(world_size, torch.cuda.device_count())
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
    return facts


def setup(device: str, deterministic: bool) -> Any:
    """In the rank, before anything touches CUDA: bind the device, set the determinism flags.

    Returns the ``torch.device`` the model and batches live on. On cpu the run is
    deterministic as it always was (``torch.use_deterministic_algorithms(True)``). On cuda
    the rank sees one device (``rank_env``), which becomes ``cuda:0``; with
    ``deterministic`` the kernels are made repeatable, without it they are left free (a
    nondeterministic-only kernel would otherwise raise) and the run is judged in tolerance mode.
    """
    import torch

    if device != "cuda":
        torch.use_deterministic_algorithms(True)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"workload device=cuda: this rank sees no CUDA device (CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__})")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)  # before the first cuBLAS call
    torch.cuda.set_device(0)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    return torch.device("cuda", 0)


def backend(device: str, requested: str) -> str:
    """The training process group's backend: ``cpu:gloo,cuda:nccl`` for cuda, else what the plan asked."""
    return CUDA_BACKEND if device == "cuda" and requested == "gloo" else requested
