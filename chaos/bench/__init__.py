"""Benchmarks on top of the pipeline: they report ratios with their spread, never assert timings.

checkpoint.py  ``chaos bench``: the reference checkpointer against DCP, DCP async, torch.save, the disk
sharded.py     the same on FSDP2 state, resharded loads included
ranks.py       the rank processes and in-rank helpers both share
"""
