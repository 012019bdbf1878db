"""What every certify property drives: checkpointers on the target, seeded states, what a fresh reader must find.

Who calls what: the properties of :mod:`chaos.certify.battery`, :mod:`chaos.certify.blockcrash`
and :mod:`chaos.certify.dcp_fsspec`, and the throughput measurement in
:mod:`chaos.certify`, build their checkpointers with :class:`Bench`, their states with
:func:`make_state`, and judge what is left with :func:`expect_only` and
:func:`reset_to_one`. They live apart from the battery so that a property module the
battery registers can use them without importing the battery back.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from chaos.certify.target import Target
from chaos.model.check import Check


def error_text(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, at most ``limit`` characters, keeping both ends.

    Why both ends: a storage error names a long path first and says what went wrong last
    (``.../step-0000000001/manifest.json: cannot be opened: Input/output error``); a cut
    that keeps only the head drops the one word the evidence needed.
    """
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]} … {text[-half:]}"


def verdict_dict(v: Check) -> dict[str, Any]:
    """A property as certify's report writes it: ``status`` (pass | fail | n/a), not ``result``."""
    return {"name": v.name, "status": v.status, "summary": v.summary, "evidence": v.evidence,
            "seconds": round(v.seconds or 0.0, 3)}


def make_state(i: int, nbytes: int = 1 << 20, seed: int = 0) -> dict[str, Any]:
    """A small training-like state whose tensors are distinct per ``i`` (seeded)."""
    g = torch.Generator().manual_seed(seed * 1000 + i)
    n = max(1, nbytes // 4)
    w = torch.randn(n, generator=g)
    return {"model": {"w": w, "b": torch.randn(16, generator=g)},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(16, generator=g)}}, "param_groups": [{"params": [0], "lr": 0.1}]},
            "progress": {"step": i}}


def fingerprint(state: Any) -> str:
    """SHA-256 over every tensor's bytes and every other value, in path order."""
    from chaos.model.statehash import fingerprint as prints
    from chaos.model.statehash import state_digest

    return state_digest(prints(state))


class Bench:
    """Per-property helpers bound to one target and one scratch directory."""

    def __init__(self, target: Target, scratch: str, seed: int = 0) -> None:
        self.target, self.scratch, self.seed = target, scratch, seed
        self.small = 1 << 18
        self.large = 12 << 20 if target.kind == "s3" else 4 << 20  # > one S3 part: multipart

    def ckpt(self, sub: str, endpoint: str | None = None, url_params: dict[str, Any] | None = None, **opts: Any) -> Any:
        from chaos.reference.checkpoint.engine import ReferenceCheckpointer

        local = tempfile.mkdtemp(prefix="local-", dir=self.scratch)
        options = {"keep_last": 1000, "metrics": False, "storage": self.target.url(sub, endpoint, **(url_params or {}))}
        if self.target.wrapper:
            options["storage_wrapper"] = self.target.wrapper
        options.update(opts)
        return ReferenceCheckpointer(local, 0, 1, **options)

    def reader(self, sub: str) -> Any:
        return self.ckpt(sub)

    def save_once(self, sub: str, step: int, state: Any) -> None:
        """Save ``state`` at ``step`` with a checkpointer of its own, closed after (the set-up of most checks)."""
        w = self.ckpt(sub)
        try:
            w.save(step, state)
        finally:
            w.close()


def expect_only(b: Bench, sub: str, states: dict[int, Any], what: str) -> list[str]:
    """Every listed step must load completely and hold exactly the state saved at it (``states``)."""
    allowed = {k: fingerprint(v) for k, v in states.items()}
    from chaos.reference.checkpoint.loader import load_step

    bad = []
    r = b.reader(sub)
    try:
        steps = r.store.list_steps()
        for s in steps:
            try:
                template = states.get(s, next(iter(states.values())))
                loaded = load_step(r.store, s, template, 0, 1, True, 1 << 30)
                if s not in allowed or fingerprint(loaded.state) != allowed[s]:
                    bad.append(f"{what}: listed step {s} holds a state never saved at that step")
            except Exception as exc:  # noqa: BLE001
                bad.append(f"{what}: step {s} is listed (committed) but does not load: {error_text(exc, 200)}")
        try:
            latest = r.store.read_latest()
        except Exception as exc:  # noqa: BLE001
            latest = None
            bad.append(f"{what}: latest pointer unreadable: {exc}")
        if latest is not None and latest not in steps:
            bad.append(f"{what}: latest names step {latest}, which is not committed")
    finally:
        r.close()
    return bad


def reset_to_one(b: Bench, sub: str) -> None:
    """Back to the starting point after a counting run or a crash: only step 1 committed and latest."""
    c = b.ckpt(sub)
    try:
        if 2 in c.store.list_steps():
            c.store.hide_step(2)()
        c.store.set_latest(1)  # every backend has one
    finally:
        c.close()
