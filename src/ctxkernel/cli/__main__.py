"""``python -m ctxkernel.cli``: the ``ctxkernel`` command."""

import sys

from .main import main

sys.exit(main())
