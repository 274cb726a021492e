import sys

from hisparse_runtime.cpu_engine import main

sys.exit(main())
