"""Fault families as the harness carries them out around a target's processes (Jepsen's nemesis).

environment.py  what a built-in scenario's faults need around the ranks (mounts, labs, corruption)
atrest.py       a job's {out} edited between attempts: corruption, power-loss crash states
sites.py        where an at-rest fault can strike in a fault-free trace (completed files, later steps)
diskfull.py     a real full disk: {out} on a size-limited tmpfs
netcut.py       a network cut between a job's ranks
nodes.py        a job on simulated nodes, and a node's loss or link cut

The primitives they use live in ``faults``; the launchers (``chaos.launch``) call their
hooks during an attempt, ``chaos.run`` between attempts.
"""
