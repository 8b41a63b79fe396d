"""What the benchmark scripts share: one contender per fresh process, and its peak RSS.

VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a Python expression, for the contender's own source: its peak RSS in MB
PEAK_RSS_MB = ('int([ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]'
               '.split()[1]) / 1024')


def run_python(source: str) -> tuple[dict, float]:
    """Run ``source`` with ``python -c`` from the repo root: (its last stdout line, read as
    JSON; the process's wall seconds). Raises with the stderr tail if it fails."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise RuntimeError(f"contender failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), wall
