"""Run every benchmark in bench/ (``python3 dev.py bench``); each prints its own table of
figures measured side by side with a baseline in the same run."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
failed = 0
for bench in sorted(here.glob("*_bench.py")):
    print(f"\n### {bench.name}", flush=True)
    # --quick is understood by every bench that has repeats to cut; others ignore it.
    args = [a for a in sys.argv[1:] if a != "--quick" or "--quick" in bench.read_text()]
    failed |= subprocess.run([sys.executable, str(bench), *args]).returncode
sys.exit(1 if failed else 0)
