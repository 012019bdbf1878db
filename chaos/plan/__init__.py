"""Where and what to break: scenarios, fault schedules, a job's points, at-rest targets.

scenario.py    Scenario: a checkpointer, a cluster shape, a workload and its faults (chaos.model.fault)
strategies.py  hypothesis strategies for fault schedules and the stateful schedule machine
pointset.py    a job's points: which families apply and where, and the order they are tried in
resumepoints.py  a second fault inside a point's resume (--resume-points): which points, which event
loadtrace.py   which files a fault-free load reads, in order: where at-rest faults land
"""
