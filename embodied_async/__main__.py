"""``python -m embodied_async <command> ...``: the command line (``embodied_async.cli``)."""

import sys

from embodied_async.cli import main

if __name__ == "__main__":
    sys.exit(main())
