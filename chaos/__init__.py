"""Chaos harness for training-checkpoint recovery.

The pipeline is Scenario -> FaultPlan -> Cluster -> RunRecord -> Oracles -> Verdict;
each stage is a plain dataclass handed to the next (see ARCHITECTURE.md).
"""

__version__ = "0.1.0"
