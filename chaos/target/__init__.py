"""What the harness attacks: the built-in workload, a user's job, and the checkpointer protocol.

protocol.py   the checkpointer contract (``Cls(root, rank, world_size)``, save/wait/load_latest/close)
              and how a checkpointer is named on the command line
workload/     the deterministic training program every rank of the built-in workload runs
adapters/     third-party checkpointers (DCP, DCP async, torch.save) in the protocol
job/          a user's unmodified job: the boot path put on its PYTHONPATH (boot/), the tracer it
              installs in every rank (inproc.py), the facts of its script (script.py)

Imported by the launchers (``chaos.launch``), which start these programs, and by the stages
above them; imports only ``chaos.model`` and ``faults``.
"""
