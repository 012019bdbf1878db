"""Benchmarks on top of the pipeline: they report ratios with their spread, never assert timings.

The ``chaos bench-*`` subcommands (NAME, HELP, add_arguments, run; registered by ``chaos.cli.main``):

save.py         ``chaos bench``: the reference checkpointer against DCP, DCP async, torch.save, the disk
launch.py       ``chaos bench launch``: one kill scenario's wall time, phase by phase, beside torchrun
crashstates.py  ``chaos bench crashstates``: power-loss crash states checked per second
job.py          ``chaos bench job``: our job mode beside the peer ckpt-chaos on the same scripts
scale.py        ``chaos bench scale``: how the harness's costs grow

and what they measure with:

checkpoint.py   the save/load benchmark itself (--device cuda on a GPU runner)
sharded.py      the same on FSDP2 state, resharded loads included
ranks.py        the rank processes and in-rank helpers both share
"""
