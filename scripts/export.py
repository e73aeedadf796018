"""Moved: ``python -m embodied_async export CHECKPOINT --out DIR ...`` (``embodied_async/cli/export.py``).
This entry runs it, saying so, for one release."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embodied_async.cli import main as cli  # noqa: E402


def main(argv=None) -> int:
    print("[export] scripts/export.py is now 'python -m embodied_async export' (this entry goes in the next release)",
          file=sys.stderr, flush=True)
    return cli(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
