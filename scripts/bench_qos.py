"""The quality-of-service benchmark (issue 27): see app/bench_qos.py.  `python scripts/bench_qos.py --help`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bench_qos import main

if __name__ == "__main__":
    raise SystemExit(main())
