"""A user's own training job as a chaos target: ``chaos run [options] -- COMMAND``.

spec.py      JobSpec (how to launch and judge) and Point (where to break it, and with what)
boot/        the sitecustomize the harness puts on PYTHONPATH: the tracer in every rank
inproc.py    what that installs: the I/O interposer numbering file events, firing a point
launch.py    one attempt: the command, or N copies with torchrun's environment; halt / SIGTERM requests
explore.py   fault-free runs, the points they show, each point run (sampled, concurrent)
pointset.py  which fault families apply and where: kill, corrupt, power, errno, term, diskfull
atrest.py    what the harness does to {out} between attempts: corruption, power-loss crash states
diskfull.py  a real full disk: {out} on a size-limited tmpfs for the first attempt
judge.py     per-point verdict with evidence: pass, hard_failure, silent_divergence, lost_work
compare.py   result files compared after the run (tensor by tensor for safetensors / torch)
results.py   the results JSON (the schema ``chaos run --json`` always writes)
cli_job.py   the command line, called from chaos.cli when ``run`` has a ``--``
"""
