#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh), checks the code with ruff and runs the test suite.
# Usage: bash scripts/test.sh [pytest arguments ...]   e.g. -m "not slow", tests/algorithms
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# LIBERO's environment (.venv-libero) is built by the tests that start its simulators, on first use
bash scripts/setup.sh

# The lint first (pyflakes, pycodestyle, import order; its settings in pyproject.toml): a second.
if ! .venv/bin/ruff check --quiet .; then
    echo "[test] error: ruff check found the problems above; '.venv/bin/ruff check --fix .' mends import" \
         "order and unused imports, the rest is by hand" >&2
    exit 1
fi

# The manual (docs/, mkdocs.yml) with every link and anchor checked: a few seconds.
site=$(mktemp -d)
if ! .venv/bin/mkdocs build --strict --quiet --site-dir "$site"; then
    echo "[test] error: the docs do not build (the lines above name the page and the broken link);" \
         "'.venv/bin/mkdocs serve' shows them as you edit" >&2
    rm -rf "$site"
    exit 1
fi
rm -rf "$site"

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "[test] error: pytest ran no tests (exit code 5: none collected or all deselected; arguments: ${*:-none})" >&2
    exit 1
fi
exit "$status"
