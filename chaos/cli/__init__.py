"""The user's entry points: the ``chaos`` command, its subcommands, and the pytest plugin.

main.py      ``chaos`` (entry point ``chaos.cli.main:main``; ``python -m chaos.cli``): run, replay
job.py       ``chaos run [options] -- COMMAND``: a user's own job
commands/    the other subcommands (report, repro, findings, certify, savers, selfcheck, bench, ...)
plugin.py    the pytest plugin (entry point ``pytest11``): markers, options, the ``chaos`` fixture
console.py   the live terminal output of a campaign
repro.py     ``chaos repro``'s reproduction script and issue draft for one failing job point
findings.py  the findings table of job explorations (``chaos findings``)
storagefindings.py  the storage findings table of certify and savers reports (``chaos findings``)
"""
