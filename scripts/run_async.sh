#!/usr/bin/env bash
# Trains a recipe from configs/ (default: async PPO with an MLP policy on ManiSkill PushCube-v1).
# Usage: bash scripts/run_async.sh [CONFIG_NAME] [key=value ...]
#   bash scripts/run_async.sh
#   bash scripts/run_async.sh maniskill_ppo_mlp runner.max_steps=50
#   bash scripts/run_async.sh runner.max_steps=50 cluster.component_placement.actor=0-1
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,6s/^# \{0,1\}//p' scripts/run_async.sh
    exit 0
fi

config_name=$(sed -n 's/^name: *//p' configs/defaults/recipe.yaml)  # the default recipe
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then
    config_name=$1
    shift
fi
overrides=("$@")

if [ ! -f "configs/$config_name.yaml" ]; then
    echo "[run_async] error: no recipe configs/$config_name.yaml; available recipes:" >&2
    shopt -s nullglob
    configs=(configs/*.yaml)
    if [ ${#configs[@]} -eq 0 ]; then
        echo "  (none: configs/ holds no *.yaml)" >&2
    fi
    for path in "${configs[@]}"; do
        name=${path##*/}
        echo "  ${name%.yaml}" >&2
    done
    exit 2
fi

bash scripts/setup.sh
# an env family with a Python environment of its own (e.g. LIBERO's): set up on its first run
family_envs=$(.venv/bin/python -m embodied_async.config.recipes "$config_name" "${overrides[@]}" 2>/dev/null || true)
for name in $family_envs; do
    bash scripts/setup.sh --python-env "$name"
done

# the run names its log folder logs/<time>-<recipe> unless runner.logger.log_path=... does
exec .venv/bin/python -m embodied_async train "$config_name" "${overrides[@]}"
