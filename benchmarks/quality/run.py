"""The quality harness's entry script: ``python benchmarks/quality/run.py [options]``.

The harness itself is the installed package :mod:`xdistill.quality` (``--help`` lists the
options); this script only points its report (``RESULTS.md``, plots) at this folder.
"""

from pathlib import Path

from xdistill.quality.run import main

if __name__ == "__main__":
    report_dir = str(Path(__file__).resolve().parent)
    import sys

    raise SystemExit(main(["--report-dir", report_dir, *sys.argv[1:]]))
