"""The batch-scaling study: `python -m dateopt.study`, kept under its old name.

  python scripts/scaling_study.py --workload lstm --quick --outdir runs/study_quick

See `dateopt/study/__main__.py` for the arguments.
"""

import sys

from dateopt.study.__main__ import main

if __name__ == "__main__":
  sys.exit(main())
