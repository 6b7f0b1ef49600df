"""The quality harness's entry script: ``python benchmarks/quality/run.py [options]``.

The harness is the package ``toyq`` next to this script (``benchmarks/quality/toyq``; the
script's folder is on ``sys.path`` when Python runs it, so no path setup is needed; ``--help``
lists the options). This script only points its report (``RESULTS.md``, plots) at this folder.
``--short`` runs the shortened harness (one seed, four arms, minutes on 2 cores).
"""

import sys
from pathlib import Path

from toyq.run import main

if __name__ == "__main__":
    report_dir = str(Path(__file__).resolve().parent)
    raise SystemExit(main(["--report-dir", report_dir, *sys.argv[1:]]))
