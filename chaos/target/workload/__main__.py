"""``python -m chaos.target.workload OUT [options]``: the built-in workload as a job (see ``job.py``)."""

import sys

from chaos.target.workload.job import main

sys.exit(main())
