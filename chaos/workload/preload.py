"""Imported once by the warm fork server, never by the harness process itself.

It pays every one-off start-up cost of a rank up front — importing torch and the
workload, and the ~2.5 s first call of ``torch.use_deterministic_algorithms`` — so a
forked rank starts training within milliseconds. The flag is switched back off here
so the fork server's state stays neutral; each rank switches it on for itself.
"""

import torch

import chaos.workload.train  # noqa: F401 - the import is the point

torch.use_deterministic_algorithms(True)
torch.use_deterministic_algorithms(False)
