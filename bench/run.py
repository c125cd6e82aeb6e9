"""Run every benchmark in bench/ (``python3 dev.py bench``); each prints its own table of
figures measured side by side with a baseline in the same run."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
failed = 0
for bench in sorted(here.glob("*_bench.py")):
    print(f"\n### {bench.name}", flush=True)
    failed |= subprocess.run([sys.executable, str(bench), *sys.argv[1:]]).returncode
sys.exit(1 if failed else 0)
