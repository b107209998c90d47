"""``python -m prewarm_probe REPORT MODE``: what a forked attempt sees, written to REPORT, then MODE.

MODE: ``exit:N`` (``sys.exit(N)``), ``message`` (``sys.exit("...")``), ``raise`` (an uncaught exception),
``wait`` (a child ``sleep`` in its group, then wait for a signal; at most 30 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    report, mode = sys.argv[1], sys.argv[2]
    seen = {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv[1:],
            "env": dict(os.environ), "torch_loaded": "torch" in sys.modules}
    if mode == "wait":
        seen["child"] = subprocess.Popen(["sleep", "30"]).pid
    with open(report + ".tmp", "w") as fh:
        json.dump(seen, fh)
    os.rename(report + ".tmp", report)
    if mode.startswith("exit:"):
        sys.exit(int(mode[5:]))
    if mode == "message":
        sys.exit("probe: refused")
    if mode == "raise":
        raise RuntimeError("probe failed")
    time.sleep(30)
