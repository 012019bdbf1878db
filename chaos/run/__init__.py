"""One scenario or one job point end to end, and explorations of many.

runner.py      one built-in scenario: golden, faulted run, record, oracles, verdict
campaign.py    the default campaign and its generated schedules within --budget
explore.py     a user's job: fault-free runs, its points, each point run and judged
selfcheck.py   the battery run against planted defects: each must fail its intended oracle
jobselfcheck.py  the same for the job oracles, on a corpus of training jobs
results.py     the results JSON of either target: a campaign's scenarios or a job's points
"""
