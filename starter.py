"""certflow's client entry point: the command line, and the async client as a library.

    python starter.py request HOST... [--tenant T] [--wait SECONDS]
    python starter.py check HOST...
    python starter.py status HOST | events HOST | list [--status S]
    python starter.py retry HOST | renew HOST | cancel HOST | delete HOST [--revoke]
    python starter.py cooldown [--clear]
    python starter.py reconcile [--install [--every SECONDS]]
    python starter.py rotate-keys | migrate
    python starter.py demo [--exit]

Every command takes ``--json``. ``CertflowClient`` (certflow/client.py) is the
same as a library; the commands are in certflow/cli.py.
"""

from __future__ import annotations

import sys

from certflow.cli import main
from certflow.client import ActionRejectedError, CertflowClient
from certflow.models import CertificateState

__all__ = ["ActionRejectedError", "CertflowClient", "CertificateState", "main"]

if __name__ == "__main__":
    sys.exit(main())
