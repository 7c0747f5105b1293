"""Whether each edge serves a hostname's current certificate, as ``status HOST``
reports it: a TLS handshake with that SNI to each edge that said where it serves
(``CERTFLOW_EDGE_ADDRESS``), the served leaf's serial compared with the row's."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import asyncpg
from cryptography import x509

from certflow.hostnames import parse_host_port
from certflow.store import edges
from certflow.store.edges import EdgeRecord

HANDSHAKE_TIMEOUT = 3.0
LIVE_WITHIN = timedelta(minutes=5)
"""An edge that has not reported for this long is left out (stopped, or gone)."""
SILENT_AFTER = timedelta(seconds=60)
"""An edge that has not reported for this long is said to be silent."""


@dataclass(frozen=True)
class EdgeServing:
    """One edge, and what it serves for the hostname asked."""

    edge: EdgeRecord
    served_serial: int | None = None
    """The serial of the leaf it served (None: not asked, or no answer)."""
    error: str | None = None

    def describe(self, current_serial: str | None, now: datetime | None = None) -> str:
        """One line for ``status``."""
        now = now or datetime.now(timezone.utc)
        edge = self.edge
        where = f"{edge.kind}, {edge.tls_address}" if edge.tls_address else edge.kind
        head = f"edge {edge.name} ({where}): "
        silent = now - edge.heartbeat_at
        tail = f"; silent for {int(silent.total_seconds())} s" if silent > SILENT_AFTER else ""
        if self.error is not None:
            return head + f"no handshake: {self.error}" + tail
        if self.served_serial is None:
            if edge.synced_at is None:
                return head + "not current yet (converging)" + tail
            behind = int((now - edge.synced_at).total_seconds())
            return head + f"held every change up to {behind} s ago ({edge.held} certificates)" + tail
        if current_serial is not None and self.served_serial == serial_number(current_serial):
            return head + f"serves the current certificate (serial {current_serial})" + tail
        current = f", not the current {current_serial}" if current_serial else ""
        return head + f"serves serial {self.served_serial:x}{current}" + tail


def serial_number(serial: str) -> int:
    """A stored serial (hex, with or without colons) as a number."""
    return int(serial.replace(":", ""), 16)


async def served_serial(address: str, server_name: str, timeout: float = HANDSHAKE_TIMEOUT) -> int:
    """The serial of the leaf the TLS server at ``address`` serves for ``server_name``
    (not verified: what is served is the question, not whether this machine trusts it)."""
    host, port = parse_host_port(address)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=server_name), timeout
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is None:
            raise ssl.SSLError("no certificate served")
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


async def edge_serving(pool: asyncpg.Pool, hostname: str) -> list[EdgeServing]:
    """Every edge that reported lately, each asked (concurrently) what it serves for
    hostname when it said where it serves."""

    async def ask(edge: EdgeRecord) -> EdgeServing:
        if edge.tls_address is None:
            return EdgeServing(edge)
        try:
            return EdgeServing(edge, await served_serial(edge.tls_address, hostname))
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ValueError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return EdgeServing(edge, error=reason)

    return list(await asyncio.gather(*(ask(e) for e in await edges.live_edges(pool, LIVE_WITHIN))))
