"""``recipes``: the recipes of ``configs/``, each with the first sentence of its own description (the
comment at its top), and the env and model files a recipe's ``env=`` / ``model=`` may pick."""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

from embodied_async.config.recipes import CONFIG_DIR, group_names, recipe_names


def recipes_command(argv: Sequence[str]) -> int:
    if argv:
        print(f"usage: python -m embodied_async recipes (takes no arguments; got {' '.join(argv)})", file=sys.stderr)
        return 2
    names = recipe_names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {summary(os.path.join(CONFIG_DIR, f'{name}.yaml'))}")
    for group in ("env", "model"):
        print(f"\n{group}=<name> picks one of configs/{group}/: {', '.join(group_names(group))}")
    return 0


def summary(path: str) -> str:
    """The first sentence of the comment a recipe opens with ("" when it opens with none)."""
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    sentence = re.split(r"(?<=\.)\s", " ".join(lines), maxsplit=1)[0]
    return sentence if len(sentence) <= 150 else sentence[:147].rsplit(" ", 1)[0] + " ..."
