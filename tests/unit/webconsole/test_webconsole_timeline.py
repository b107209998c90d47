"""The fleet page's timeline shaping (gpufleet/webconsole/timeline.js, pure), run under Node: segments clipped to
the window and merged, each lane's time by cause (the text alternative to the coloured bar), every cause of the
attribution with a code."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gpufleet.diagnose.attribution import Cause
from gpufleet.webconsole import ASSETS

SCRIPT = """
import { CAUSES, duration, laneShares, mergeSegments } from %(module)s;
const segs = [[0, 10, "computing", "j1"], [10, 30, "computing", "j1"], [30, 40, "free_quota", null],
              [40, 50, "computing", "j2"], [50, 200, "free_no_work", null]];
console.log(JSON.stringify({
  merged: mergeSegments(segs, 5, 100),
  shares: laneShares(segs, 0, 100),
  causes: CAUSES.map((c) => [c.cause, c.code]),
  durations: [duration(40), duration(125), duration(7260)],
}));
"""


def test_segments_merge_clip_and_sum_to_shares():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the console's modules cannot be run outside a browser here")
    out = json.loads(subprocess.run([node, "--input-type=module", "-e",
                                     SCRIPT % {"module": json.dumps((ASSETS / "timeline.js").as_uri())}],
                                    capture_output=True, text=True, timeout=60, check=True).stdout)
    assert [(m["start"], m["end"], m["cause"], m["job"]) for m in out["merged"]] == [
        (5, 30, "computing", "j1"), (30, 40, "free_quota", None), (40, 50, "computing", "j2"),
        (50, 100, "free_no_work", None)]
    assert [(s["cause"], s["seconds"], s["share"]) for s in out["shares"]] == [
        ("free_no_work", 50, 0.5), ("computing", 40, 0.4), ("free_quota", 10, 0.1)]
    codes = dict(out["causes"])
    assert set(codes) == {c.value for c in Cause}  # every cause the API can send has a code
    assert len(set(codes.values())) == len(codes)  # and no two share one
    assert out["durations"] == ["40s", "2m 5s", "2h 1m"]
