"""RLinf's entry point, kept for its users: ``python examples/embodiment/train_async.py --config-name
<recipe> [key=value ...]`` is ``python -m embodied_async train <recipe> [key=value ...]``
(``embodied_async/cli/train.py``), Hydra's options included; without ``--config-name`` it trains the
default recipe (``configs/defaults/recipe.yaml``)."""

import sys

from embodied_async.cli import main
from embodied_async.cli.train import recipe_of
from embodied_async.config.recipes import default_recipe

if __name__ == "__main__":
    default = [] if recipe_of(sys.argv[1:]) else ["--config-name", default_recipe()]
    sys.exit(main(["train", *sys.argv[1:], *default]))
