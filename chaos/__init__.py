"""Chaos harness for training-checkpoint recovery.

The pipeline, one folder a stage (each stage's types are plain dataclasses handed to the
next; nothing reaches back up, which ``lint-imports`` checks against pyproject's contracts)::

    plan ─► launch (target) ─► nemesis ─► record ─► judge ─► run ─► cli
    (what to break,   (processes    (faults     (what the  (verdicts  (one point   (commands,
     where)            started)      applied)    run left)  with       or many)      reports,
                                                            evidence)                plugin)

model/      plain types and documents every stage reads (job spec and points, results schema)
target/     what is attacked: the built-in workload (also runnable as a job), a user's job, the
            checkpointer protocol
plan/       scenarios, fault schedules, a job's points, at-rest targets
launch/     fork server, containers, a job's attempts, spare interpreters
nemesis/    one module per fault family (family.py: the protocol, the registry), and what a
            built-in scenario's faults need around its ranks (environment.py)
record/     run records, fault-free reference runs (cached), fault points from traces
judge/      one registry of oracles for both targets, verdicts, power-loss exploration
run/        one scenario or job point end to end, campaigns, explorations, results JSON
cli/        ``chaos`` and its subcommands, the pytest plugin
bench/, certify/   on top of the pipeline
reference/  the reference checkpointer, independent of the harness
errors.py, phases.py, probe.py, scratch.py, trustedpath.py   shared by all (public names:
            ``chaos.phases`` for checkpointers, ``chaos.probe`` for jobs)
"""

__version__ = "0.1.0"
