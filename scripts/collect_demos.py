"""Moved: ``python -m embodied_async collect ENV --source S --episodes N --out DIR ...``
(``embodied_async/cli/collect.py``, ``runner.mode: collect``). This entry runs it, saying so, for one release."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embodied_async.cli import main as cli  # noqa: E402


def main(argv=None) -> int:
    print("[collect] scripts/collect_demos.py is now 'python -m embodied_async collect' (this entry goes in the "
          "next release)", file=sys.stderr, flush=True)
    return cli(["collect", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
