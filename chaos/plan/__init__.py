"""Where and what to break: scenarios, fault schedules, a job's points, at-rest targets.

scenario.py    Scenario and Fault, and the fault grammar (``kill:rank=1,step=11``)
strategies.py  hypothesis strategies for fault schedules and the stateful schedule machine
pointset.py    a job's points: which families apply and where, and the order they are tried in
loadtrace.py   which files a fault-free load reads, in order: where at-rest faults land
"""
