"""Fault families as the harness carries them out around a target's processes (Jepsen's nemesis).

environment.py  what a built-in scenario's faults need around the ranks (mounts, labs, corruption)
family.py       the protocol of a fault family, and the registry of them
kill.py         SIGKILL before or after a traced file event, torn mid-write, or at a step
shrink.py       a kill with lost=true: the rank lost for good, the restarts on one rank fewer
term.py         SIGTERM at a step, SIGKILL after the grace: a preemption
ioerror.py      a file event raises EIO or ENOSPC (the errno family)
corrupt.py      bit rot in a completed file: a bit flipped, truncated, zeroed, deleted
stale.py        an older version of a completed file put back in its place
swap.py         two ranks' files of one checkpoint swapped
payload.py      code planted in a completed file, in its own format (pickle, torch zip)
reorder.py      a completed file's pending writes reaching the disk out of order, then a power cut
power.py        a power loss right after an event: {out} becomes one of the cut's crash states
atrest.py       what those share (Applied, the file a point strikes, file versions, merged traces)
sites.py        where an at-rest fault can strike in a fault-free trace (completed files, later steps)
diskfull.py     a real full disk: {out} on a size-limited tmpfs
netcut.py       a network cut between a job's ranks
nodes.py        a job on simulated nodes, and a node's loss or link cut
sched.py        through Slurm (--launcher sbatch): the job requeued, preempted, or its node set down
stop.py         a hung rank (SIGSTOP) while the rest of the job runs on
restart.py      a rank's container restarted in place by the engine (--launcher docker)

The primitives they use live in ``faults``; the launchers (``chaos.launch``) call their
hooks during an attempt, ``chaos.run`` between attempts.
"""
