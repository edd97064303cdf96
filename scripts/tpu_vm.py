#!/usr/bin/env python3
"""`dateopt-tpu` from a clone without installing it: see dateopt/tpu.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dateopt import tpu  # noqa: E402  (after the path)

if __name__ == "__main__":
  sys.exit(tpu.main())
