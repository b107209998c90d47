"""``python -m gpufleet.runtime``: see :mod:`gpufleet.runtime.main`."""

import sys

from gpufleet.runtime.main import main

sys.exit(main())
