"""A user's own training job as a target, from inside its processes and from its script.

boot/       the sitecustomize the harness puts on the job's PYTHONPATH: the tracer in every rank
inproc.py   what that installs: the I/O interposer numbering file events, firing one point
native.py   the native tracer (faults/chaosio.c) bound to it: native code's calls performed through it
script.py   which local ``.py`` COMMAND runs, what it imports, at which versions
"""
