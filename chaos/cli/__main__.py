"""``python -m chaos.cli``: the ``chaos`` command."""

import sys

from chaos.cli.main import main

sys.exit(main())
