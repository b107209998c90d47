"""``python -m onprem_agent``."""

import sys

from onprem_agent.main import main

sys.exit(main())
