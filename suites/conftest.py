"""Shared settings of the chaos suites: a short workload so every family runs in CI's time."""

import os

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    """Per-user harness state (the origin key of results files) stays in the session's folder."""
    os.environ["XDG_STATE_HOME"] = str(session.config._tmp_path_factory.mktemp("xdg-state"))


# 24 steps, a save every 4: saves at 4, 8, ..., 24; faults land around step 18-20.
SUITE_WORKLOAD = {"steps": 24, "save_every": 4}


@pytest.fixture
def run_fault(chaos):
    """Run one fault scenario with the suite workload; skip (with the reason) when it cannot run here."""

    def run(checkpointer, *faults, **workload):
        result = chaos.run(chaos.scenario(checkpointer, list(faults), **{**SUITE_WORKLOAD, **workload}))
        if result.verdict == "skipped":
            pytest.skip(result.error or "scenario skipped")
        return result

    return run
