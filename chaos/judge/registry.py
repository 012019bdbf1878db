"""Every oracle once: what it checks, which target it judges, and what its failure is called.

Both targets' judges read this table. The built-in workload's scenarios
(``chaos.judge.oracles``, which keeps the functions under these names; the runner adds
``atomic_commit`` from the power-loss exploration) carry every oracle whose ``workload``
is set; a job point's verdict (``chaos.judge.job``) carries those with a ``job`` outcome,
and the first of them to fail, in this table's order, names the point's outcome
(``VERDICT_ORDER``). The self-checks plant a defect for every oracle of their target
(``chaos.run.selfcheck``, ``chaos.run.jobselfcheck``), and the docs' table of oracles is
generated from :data:`ORACLES`. An oracle both targets judge is one row: the same
question, asked of the built-in workload's record or of a job's traces.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Oracle:
    """One question a verdict asks."""

    name: str
    checks: str                # what it checks, in one line (Markdown)
    workload: bool = False     # the built-in workload's scenarios ask it
    job: str | None = None     # a job point's outcome when it fails (None: jobs are not asked)


# Job oracles first, in the order that names a failing point's outcome: code run from a
# checkpoint comes first (the job may well crash afterwards: the crash is not the news); a
# job that did not finish is down whatever else it got wrong; a wrong result outranks lost work.
ORACLES: tuple[Oracle, ...] = (
    Oracle("no_code_execution", "loading the checkpoint never ran code planted in it (payload faults)",
           workload=True, job="code_execution"),
    Oracle("liveness", "the job finished within its restarts; when it did not, the evidence says which load or "
                       "save broke", workload=True, job="hard_failure"),
    Oracle("committed_state", "whatever a restart (or the final check) loaded is exactly a state that was saved "
                              "(a job: `probe.resumed(n, state)` against `probe.saving(n, state)`)",
           workload=True, job="silent_divergence"),
    Oracle("result_files", "each `--result-file` equals the fault-free run's: safetensors and torch files tensor "
                           "by tensor, JSON by key", job="silent_divergence"),
    Oracle("loss_continuity", "every step's loss follows the fault-free run's (at its own world size): exactly "
                              "where the fault-free runs agreed, else within the band (0.5 %), with no spike after "
                              "a resume (a job: `probe.step(n, loss)` or `--loss-regex`, one source a run)",
           workload=True, job="silent_divergence"),
    Oracle("no_false_ack", "a save that an injected error or a full disk hit is not acknowledged (a job: "
                           "`probe.saved(n)` after an error hit the save `probe.saving(n, state)` began)",
           workload=True, job="lost_work"),
    Oracle("durability", "the resume started at or after the newest checkpoint acknowledged (a job: relied on) "
                         "and still intact", workload=True, job="lost_work"),
    Oracle("preemption_exit", "a SIGTERMed attempt exits non-zero unless it had finished: a job that exits 0 "
                              "mid-run is never restarted by a supervisor (term points)", job="hard_failure"),
    Oracle("bit_exact", "the final state equals the golden run's tensor by tensor, and every step's loss too",
           workload=True),
    Oracle("final_durability", "at the end, a fresh launch loads the newest acknowledged save, exactly",
           workload=True),
    Oracle("checksum_detection", "each at-rest corruption is detected by the next load (and fallen back from), "
                                 "never loaded silently", workload=True),
    Oracle("hygiene", "no rank process, mount or network namespace outlived the scenario", workload=True),
    Oracle("atomic_commit", "every crash state of a traced save (power loss) recovers to a committed checkpoint "
                            "or to the one before it", workload=True),
)
BY_NAME = {o.name: o for o in ORACLES}
# (oracle, outcome) for a job point, in order: the first failing one names the outcome
VERDICT_ORDER: tuple[tuple[str, str], ...] = tuple((o.name, o.job) for o in ORACLES if o.job is not None)
FAILURES = tuple(dict.fromkeys(outcome for _oracle, outcome in VERDICT_ORDER))  # a job point's, worst first


def of_workload() -> list[str]:
    """The oracles a built-in workload scenario's verdict can carry (its self-check's catches)."""
    return [o.name for o in ORACLES if o.workload]


def of_job() -> list[str]:
    """The oracles a job point's verdict can carry (the job self-check's catches)."""
    return [name for name, _outcome in VERDICT_ORDER]


__all__ = ["BY_NAME", "FAILURES", "ORACLES", "VERDICT_ORDER", "Oracle", "of_job", "of_workload"]
