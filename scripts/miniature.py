"""Moved: ``python -m embodied_async miniature FAMILY ...`` (``embodied_async/cli/miniature.py``, the
pipeline ``configs/pipelines/miniature.yaml``). This entry runs it, saying so, for one release."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embodied_async.cli import main as cli  # noqa: E402


def main(argv=None) -> int:
    print("[miniature] scripts/miniature.py is now 'python -m embodied_async miniature' (this entry goes in the "
          "next release)", file=sys.stderr, flush=True)
    return cli(["miniature", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
