"""Verdicts from records alone, each with its evidence.

oracles.py    the oracles of the built-in workload (bit_exact, durability, loss_continuity, ...)
job.py        a job point's verdict: pass, hard_failure, silent_divergence, lost_work, skipped
compare.py    a job's result files against the fault-free run's, naming the first difference
losscurve.py  a job's loss curve, judged by the built-in loss_continuity
powerloss.py  every crash state a traced save may leave, recovered by the real code and judged
"""
