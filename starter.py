"""certflow's client entry point: the command line, and the async client as a library.

    python starter.py request HOST... [--tenant T] [--wait SECONDS]
    python starter.py check HOST...
    python starter.py status HOST | events HOST | list [--status S]
    python starter.py retry HOST | renew HOST | cancel HOST | delete HOST [--revoke]
    python starter.py cooldown [--clear]
    python starter.py reconcile [--install [--every SECONDS]]
    python starter.py rotate-keys | migrate
    python starter.py demo [--exit]

Every command takes ``--json``. ``CertflowClient`` (certflow/product/client.py) is the
same as a library; the command line is certflow/product/cli.py (installed as the
``certflow`` command). ``demo`` runs from a checkout only: it is the dev harness's
(devstack/demo.py), which no install carries.
"""

from __future__ import annotations

import sys

from certflow.product.cli import exit_process, main


def demo(argv: list[str]) -> int:
    """Every server local, three certificates issued (the README's first command)."""
    try:
        from devstack.demo import run_demo
    except ImportError:
        print(
            "certflow: the demo runs from a checkout with the dev extra"
            " (scripts/setup.sh && .venv/bin/python starter.py demo)",
            file=sys.stderr,
        )
        return 2
    if argv not in ([], ["--exit"]):
        print("usage: starter.py demo [--exit]", file=sys.stderr)
        return 2
    return run_demo(keep_running=not argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["demo"]:
        sys.exit(demo(sys.argv[2:]))
    exit_process(main())
