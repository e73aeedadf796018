#!/usr/bin/env bash
# One-time (and idempotent) set-up of a machine for embodied_async:
#   1. the rendering system packages: on a machine with an NVIDIA GPU the Vulkan loader and EGL
#      (the driver brings the rest); without one, software rendering (Mesa lavapipe Vulkan
#      >= 24.3 for ManiSkill, EGL for MuJoCo);
#   2. a virtual environment in .venv;
#   3. the project installed into it (editable, with the test extra);
#   4. a one-line sanity check.
# Re-runs skip every step that is already done and take about a second.
#
# Environment:
#   EMBODIED_ASYNC_SKIP_SYSTEM=1  skip step 1 (system packages)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT=$(pwd)

log() { printf '[setup] %s\n' "$*"; }

# ManiSkill's CPU renderer needs lavapipe from Mesa >= 24.3; MuJoCo renders through EGL onto
# Mesa's software rasteriser (libgl1-mesa-dri).
MESA_MIN_VERSION=24.3
SYSTEM_PACKAGES=(mesa-vulkan-drivers libvulkan1 libegl1 libgl1 libegl-mesa0 libgles2 libgl1-mesa-dri)
# SAPIEN renders through Vulkan: the loader is a system package, the NVIDIA ICD comes with the driver
NVIDIA_PACKAGES=(libvulkan1 libegl1 libgl1)
STAMP=.venv/.embodied_async_installed

has_nvidia_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    [ -n "$(nvidia-smi -L 2>/dev/null || true)" ]
}

# Prints "" as root and "sudo " where password-less sudo works; fails otherwise.
root_prefix() {
    if [ "$(id -u)" -eq 0 ]; then
        return 0
    fi
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && printf 'sudo '
}

packages_installed() {
    local pkg status
    for pkg in "$@"; do
        status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
        [ "$status" = "install ok installed" ] || return 1
    done
}

# True when every system package is installed and Mesa's version is new enough.
system_packages_ok() {
    local mesa_version
    packages_installed "${SYSTEM_PACKAGES[@]}" || return 1
    mesa_version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
    # Strip an epoch ("1:25.0.7-2" -> "25.0.7-2") before comparing.
    dpkg --compare-versions "${mesa_version#*:}" ge "$MESA_MIN_VERSION"
}

# Prints the Debian major version (12, 13, ...), or nothing when not Debian.
debian_major() {
    [ -r /etc/debian_version ] || return 0
    cut -d. -f1 </etc/debian_version
}

# The mirror URI of the main (non-security) Debian suite, read from the existing apt sources.
debian_mirror_uri() {
    local uri=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        # deb822 format: one stanza per paragraph; take the first stanza that is not security.
        uri=$(awk -v RS= '{
            uri = ""; suites = ""
            n = split($0, lines, "\n")
            for (i = 1; i <= n; i++) {
                if (lines[i] ~ /^URIs:/) { split(lines[i], f, /[ \t]+/); uri = f[2] }
                if (lines[i] ~ /^Suites:/) suites = lines[i]
            }
            if (uri != "" && suites !~ /security/) { print uri; exit }
        }' /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {
            for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit }
        }' /etc/apt/sources.list)
    fi
    printf '%s' "$uri"
}

# Is bookworm-backports already enabled in a file apt reads?
backports_configured() {
    local -a files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    grep -qsE '^[^#]*[[:space:]]bookworm-backports([[:space:]]|$)' "${files[@]}"
}

# Prints the shell commands that install the system packages, one per line.
# $1 is a prefix for commands that need root ("" when root, "sudo " otherwise).
system_install_commands() {
    local p=$1 uri suite_args=""
    if [ "$(debian_major)" = "12" ]; then
        # Debian 12 ships Mesa 22.3; lavapipe needs the newer Mesa from backports.
        if ! backports_configured; then
            uri=$(debian_mirror_uri)
            echo "printf '%s\\n' 'Types: deb' 'URIs: $uri' 'Suites: bookworm-backports' 'Components: main'" \
                "'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg'" \
                "| ${p}tee /etc/apt/sources.list.d/backports.sources >/dev/null"
        fi
        suite_args="-t bookworm-backports "
    fi
    echo "${p}apt-get update"
    echo "${p}env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${suite_args}${SYSTEM_PACKAGES[*]}"
}

install_system_packages() {
    if [ "${EMBODIED_ASYNC_SKIP_SYSTEM:-0}" = "1" ]; then
        log "EMBODIED_ASYNC_SKIP_SYSTEM=1: skipping system packages"
        return 0
    fi
    if has_nvidia_gpu; then
        install_nvidia_rendering
        return 0
    fi
    if ! command -v dpkg-query >/dev/null 2>&1 || [ -z "$(debian_major)" ]; then
        log "not a Debian system: install Mesa >= $MESA_MIN_VERSION (lavapipe Vulkan) and EGL yourself"
        return 0
    fi
    if system_packages_ok; then
        log "software rendering ready (mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers))"
        return 0
    fi

    if [ "$(debian_major)" = "12" ] && ! backports_configured && [ -z "$(debian_mirror_uri)" ]; then
        log "no Debian mirror URI found in /etc/apt/sources.list(.d); add the bookworm-backports suite"
        log "for your mirror, then run: apt-get install -t bookworm-backports ${SYSTEM_PACKAGES[*]}"
        log "continuing without them: simulators cannot render until they are installed"
        return 0
    fi

    local prefix
    if ! prefix=$(root_prefix); then
        log "no NVIDIA GPU, and Mesa >= $MESA_MIN_VERSION (lavapipe) or EGL is missing; please run:"
        system_install_commands "sudo " | sed 's/^/[setup]     /'
        log "continuing without them: simulators cannot render until they are installed"
        return 0
    fi

    local cmd
    while IFS= read -r cmd; do
        log "running: $cmd"
        bash -c "$cmd"
    done < <(system_install_commands "$prefix")

    if ! system_packages_ok; then
        log "error: mesa-vulkan-drivers is older than $MESA_MIN_VERSION or a library is missing after apt-get" >&2
        exit 1
    fi
    log "software rendering ready (mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers))"
}

# On an NVIDIA machine: the Vulkan loader and EGL, and a check that the driver's Vulkan ICD is
# there (containers need NVIDIA_DRIVER_CAPABILITIES to include "graphics" for it).
install_nvidia_rendering() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        log "NVIDIA GPU, not a Debian system: make sure the Vulkan loader (libvulkan.so.1) and EGL are installed"
    elif packages_installed "${NVIDIA_PACKAGES[@]}"; then
        log "NVIDIA GPU: Vulkan loader and EGL installed"
    else
        local prefix
        if ! prefix=$(root_prefix); then
            log "NVIDIA GPU: ManiSkill needs the Vulkan loader; please run:"
            log "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${NVIDIA_PACKAGES[*]}"
            return 0
        fi
        log "NVIDIA GPU: installing ${NVIDIA_PACKAGES[*]}"
        ${prefix}apt-get update
        ${prefix}env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${NVIDIA_PACKAGES[@]}"
    fi
    local icd
    for icd in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
        [ -f "$icd" ] && return 0
    done
    log "warning: no NVIDIA Vulkan ICD (nvidia_icd.json) found: SAPIEN cannot render on the GPU. In a container,"
    log "  start it with NVIDIA_DRIVER_CAPABILITIES=all (or compute,utility,graphics)"
}

create_venv() {
    if [ -x .venv/bin/python ]; then
        log "virtual environment .venv exists"
        return 0
    fi
    log "creating virtual environment .venv with $(command -v python3)"
    python3 -m venv .venv
    log "upgrading pip"
    .venv/bin/python -m pip install --upgrade pip
}

# pip fails deep in an install with "[Errno 28] No space left on device" and leaves a half-built
# environment: refuse before it starts. The sizes: .venv is 4.0 GB installed, a family
# environment (LIBERO with its assets) about 2 GB, and pip unpacks wheels in TMPDIR meanwhile.
require_free_space() {
    local what=$1 needed_gb=$2 folder free_kb
    for folder in "$REPO_ROOT" "${TMPDIR:-/tmp}"; do
        free_kb=$(df -Pk "$folder" | awk 'NR == 2 {print $4}')
        if [ -n "$free_kb" ] && [ "$free_kb" -lt $((needed_gb * 1024 * 1024)) ]; then
            echo "[setup] error: $((free_kb / 1024)) MB free on the disk of $folder; installing $what needs" \
                 "about $needed_gb GB there. Free some space (or point TMPDIR at a larger disk) and run" \
                 "scripts/setup.sh again" >&2
            exit 1
        fi
    done
}

install_project() {
    local digest
    digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$digest" ]; then
        log "project already installed for this pyproject.toml"
        return 0
    fi
    require_free_space "the project into .venv" 5
    # torch is pinned in the same command so pip keeps the CPU wheel.
    log "installing the project: .venv/bin/pip install torch==2.13.0 -e '.[test]'"
    .venv/bin/pip install torch==2.13.0 -e '.[test]'
    printf '%s\n' "$digest" >"$STAMP"
}

sanity_check() {
    .venv/bin/python - <<'EOF'
import platform
import importlib.metadata as md

def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "missing"

print(f"[setup] python {platform.python_version()}, torch {version('torch')}, "
      f"ray {version('ray')}, mani_skill {version('mani_skill')}")
EOF
}

# A family environment (``EnvConfig.python_env``): .venv-<name> from the requirements file
# envs/<family>/requirements-<name>.txt, for simulators that pin what .venv cannot hold. Rebuilt
# when the requirements change; the family's simulators run in it as child processes.
setup_python_env() {
    local name=$1 requirements venv stamp digest known file
    local matches=(envs/*/"requirements-$name.txt")
    requirements=${matches[0]}
    if [ ! -f "$requirements" ]; then
        known=""
        for file in envs/*/requirements-*.txt; do
            [ -f "$file" ] && known="$known ${file##*/requirements-}" && known=${known%.txt}
        done
        echo "[setup] error: no family environment '$name' (no envs/<family>/requirements-$name.txt); the ones" \
             "there:${known:- none}" >&2
        exit 2
    fi
    venv=".venv-$name"
    stamp="$venv/.embodied_async_installed"
    digest=$(sha256sum "$requirements" | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        log "family environment $venv already installed for $requirements"
        return 0
    fi
    if [ ! -x "$venv/bin/python" ]; then
        log "creating the family environment $venv with $(command -v python3)"
        python3 -m venv "$venv"
    fi
    require_free_space "$requirements into $venv" 3
    log "installing $requirements into $venv"
    "$venv/bin/pip" install -r "$requirements"
    printf '%s\n' "$digest" >"$stamp"
}

python_envs=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python-env) python_envs+=("$2"); shift 2 ;;
        --python-env=*) python_envs+=("${1#--python-env=}"); shift ;;
        *) echo "[setup] error: unknown argument '$1' (usage: bash scripts/setup.sh [--python-env NAME])" >&2; exit 2 ;;
    esac
done

log "repository: $REPO_ROOT"
install_system_packages
create_venv
install_project
sanity_check
for name in "${python_envs[@]}"; do
    setup_python_env "$name"
done
