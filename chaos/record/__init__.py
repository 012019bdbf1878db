"""What a run left, read back as data, and the fault-free runs every judgement compares with.

history.py     RunRecord: the built-in workload's per-rank logs, I/O traces and faults fired
jobhistory.py  PointRecord: a job point's attempts and every rank's trace
golden.py      golden (fault-free, checkpoint-free) runs, cached by what decides their numbers
points.py      fault points from a traced fault-free run, which faults fired, coverage
"""
