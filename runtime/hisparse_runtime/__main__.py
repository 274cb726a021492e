"""``python -m hisparse_runtime`` is the same as the ``hisparse-runtime`` command."""

import sys

from hisparse_runtime.cli import main

sys.exit(main())
