"""Launchers: how a target's processes are started, watched, faulted at a signal, and reaped.

cluster.py        the built-in workload's ranks from a warm fork server (restarts, elastic shrink)
drivers/          the same ranks as Docker containers, and the private engine they run in
job.py            one attempt of a user's job: its command, or N copies with torchrun's environment
spares.py         an attempt's copies started ahead of time, held at the boot path's gate
silence.py        when a job's attempt stopped showing progress (``--hang-timeout``)
output.py         what a job's output says about why it failed
recovery_pool.py  a warm group of ranks that runs a checkpointer's recovery again and again
ports.py          a free loopback TCP port (rendezvous, local servers)
protocol.py       what a driver and a job's attempt launcher offer, and in which order they are called
reaper.py         every process launched and not yet reaped, and the one kill_all (atexit too)
slurmcluster.py   a private one-node Slurm cluster (munged, slurmctld, slurmd) for ``chaos slurm``

Siblings of ``chaos.plan`` and ``chaos.nemesis`` (a launcher drives the nemesis hooks of its
attempts); called by ``chaos.record`` (reference runs) and the stages above.
"""
