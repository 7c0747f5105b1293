"""The fault proxy as a test holds it (:class:`FaultProxy`) and how one is started in
front of a Pebble (:func:`start_fault_proxy`)."""

from __future__ import annotations

import collections
import datetime
import http
import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any


from devstack.servers import PebbleStack

from devstack.faultproxy.faults import ArrivingCallback, Endpoint, Fault, ForwardedCallback, RENEWAL_INFO_PATH, _RenewalInfo, _STOP_JOIN_S, _UPSTREAM_TIMEOUT_S, _normalize_host, _whole_seconds_utc
from devstack.faultproxy.limits import LimitDecision, LimitSpend, LimitsConfig
from devstack.faultproxy.server import _ProxyServer


class FaultProxy:
    """A running proxy; see the module docstring. Create it with :func:`start_fault_proxy`."""

    def __init__(self, server: _ProxyServer, directory_path: str) -> None:
        self._server = server
        self._state = server.state
        self.url = f"https://{server.netloc}"
        self.directory_url = self.url + directory_path
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"faultproxy-{server.server_port}",
            daemon=True,
        )
        self._stopped = False

    def __repr__(self) -> str:
        return f"FaultProxy({self.url!r})"

    # ------------------------------------------------------------------ faults

    def inject(self, endpoint: Endpoint, *faults: Fault) -> None:
        """Queue faults: the next ``len(faults)`` requests to ``endpoint`` get them in order.

        Queued faults come before an :meth:`inject_always` fault; once the queue is
        used up, requests pass through again (or get the always-fault).
        """
        with self._state.lock:
            self._state.queued.setdefault(endpoint, collections.deque()).extend(faults)

    def inject_always(self, endpoint: Endpoint, fault: Fault | None) -> None:
        """Answer every request to ``endpoint`` with ``fault`` until cleared (None clears)."""
        with self._state.lock:
            if fault is None:
                self._state.always.pop(endpoint, None)
            else:
                self._state.always[endpoint] = fault

    def pending(self, endpoint: Endpoint) -> int:
        """How many queued faults for ``endpoint`` have not been used yet."""
        with self._state.lock:
            return len(self._state.queued.get(endpoint, ()))

    def fail_validation(
        self, hostname: str, problem_type: str, detail: str, *, takes: float = 0.0
    ) -> None:
        """From now on, the accept of a challenge for ``hostname`` fails validation as
        the CA reports it: that authorization, its challenge (with ``{"type":
        problem_type, "detail": detail, "status": 403}`` as its error) and its order
        read ``invalid`` — after ``takes`` seconds during which they read
        ``pending``, as Boulder shows a challenge under validation.
        :meth:`pass_validation` stops it for later accepts."""
        problem = {"type": problem_type, "detail": detail, "status": 403}
        with self._state.lock:
            self._state.validation_failures.problems[hostname.lower().rstrip(".")] = (
                problem,
                takes,
            )

    def pass_validation(self, hostname: str) -> None:
        """Later accepts for ``hostname`` validate as Pebble decides again."""
        with self._state.lock:
            self._state.validation_failures.problems.pop(hostname.lower().rstrip("."), None)

    def clear(self) -> None:
        """Drop all queued and always-faults (counters stay)."""
        with self._state.lock:
            self._state.queued.clear()
            self._state.always.clear()

    # ------------------------------------------------------------ renewal info

    @property
    def renewal_info_url(self) -> str:
        """The ``renewalInfo`` URL the directory advertises once ARI is served."""
        return self.url + RENEWAL_INFO_PATH

    def serve_renewal_info(
        self,
        window_start: datetime.datetime,
        window_end: datetime.datetime,
        *,
        retry_after: str | None = "3600",
        explanation_url: str | None = None,
    ) -> tuple[datetime.datetime, datetime.datetime]:
        """Act as an ARI server (RFC 9773) from now on.

        The proxied directory then carries ``"renewalInfo":`` :attr:`renewal_info_url`,
        and ``GET <renewal_info_url>/<certID>`` gets ``{"suggestedWindow": {"start",
        "end"}}`` (RFC 3339, UTC, whole seconds) with ``Retry-After: retry_after``
        (None omits it), for any well-formed certID. Clients read the directory
        once, so call this before they start. Calling again changes the window.
        Faults injected for :attr:`Endpoint.RENEWAL_INFO` (e.g. a 503 with
        Retry-After) are answered first. Returns the window as served.
        """
        info = _RenewalInfo(
            start=_whole_seconds_utc(window_start, "window_start"),
            end=_whole_seconds_utc(window_end, "window_end"),
            retry_after=retry_after,
            explanation_url=explanation_url,
        )
        with self._state.lock:
            self._state.renewal_info = info
        return info.start, info.end

    # ------------------------------------------------------------------- hooks

    def on_forwarded(self, endpoint: Endpoint, callback: ForwardedCallback) -> Callable[[], None]:
        """Call ``callback(Forwarded)`` for every request to ``endpoint`` forwarded to
        Pebble, in the proxy's handler thread, after Pebble answered and before the
        answer is relayed (see the module docstring). Returns a function that
        removes this registration."""
        with self._state.lock:
            self._state.hooks.setdefault(endpoint, []).append(callback)

        def remove() -> None:
            with self._state.lock:
                callbacks = self._state.hooks.get(endpoint, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return remove

    def before_forwarding(
        self, endpoint: Endpoint, callback: ArrivingCallback
    ) -> Callable[[], None]:
        """Call ``callback(Arriving)`` for every request to ``endpoint`` about to be
        forwarded to Pebble, in the handler thread, before Pebble sees it (a callback
        that blocks holds the request back). Returns a function that removes it."""
        with self._state.lock:
            self._state.before.setdefault(endpoint, []).append(callback)

        def remove() -> None:
            with self._state.lock:
                callbacks = self._state.before.get(endpoint, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return remove

    def stop_serving_renewal_info(self) -> None:
        """Relay the directory unchanged again and forward renewal-info paths to Pebble."""
        with self._state.lock:
            self._state.renewal_info = None

    def renewal_info_requests(self) -> list[str]:
        """The certIDs of the renewal-info requests answered with a window, in order."""
        with self._state.lock:
            return list(self._state.renewal_info_requests)

    # ------------------------------------------------------------- rate limits

    def emulate_limits(self, config: LimitsConfig | None) -> None:
        """Enforce Let's Encrypt's limits on new orders from now on (None: stop).

        Starts every bucket full and forgets earlier decisions and spends; what the
        proxy saw issued (renewal exemptions, ARI certIDs) is kept. See the module
        docstring for what is checked, spent and exempt."""
        with self._state.lock:
            self._state.limits.reset(config)

    def limit_decisions(self) -> list[LimitDecision]:
        """Every new-order decision since :meth:`emulate_limits`, oldest first."""
        with self._state.lock:
            return list(self._state.limits.decisions)

    def limit_spends(self) -> list[LimitSpend]:
        """Every token taken (and refunded) since :meth:`emulate_limits`, oldest first."""
        with self._state.lock:
            return list(self._state.limits.spends)

    def limit_counts(self) -> collections.Counter[tuple[str, str, str]]:
        """(limit, key, "allowed" | "refused") → how many new orders that bucket let
        through or refused (a bucket refuses only when it decided the refusal)."""
        counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for decision in self.limit_decisions():
            if not decision.allowed:
                counts[(str(decision.limit), str(decision.key), "refused")] += 1
                continue
            for check in decision.checks:
                counts[(check.limit, check.key, "allowed")] += 1
        return counts

    def limit_remaining(self, limit: str, key: str) -> int | None:
        """Whole tokens in a bucket now (None when that limit is not emulated)."""
        with self._state.lock:
            return self._state.limits.remaining(limit, key)

    def issued_cert_ids(self) -> dict[str, frozenset[str]]:
        """RFC 9773 certID → identifiers of every certificate downloaded through the proxy."""
        with self._state.lock:
            return dict(self._state.limits.cert_ids)

    # ---------------------------------------------------------------- counters

    def count(self, endpoint: Endpoint) -> int:
        """Requests to ``endpoint`` the proxy received (faulted or forwarded)."""
        with self._state.lock:
            return self._state.received[endpoint]

    def forwarded(self, endpoint: Endpoint) -> int:
        """Requests to ``endpoint`` actually sent on to Pebble."""
        with self._state.lock:
            return self._state.forwarded[endpoint]

    def new_orders_for(self, hostname: str) -> int:
        """Forwarded new-order requests whose identifiers include ``hostname``.

        Case and a trailing dot are ignored.
        """
        with self._state.lock:
            return self._state.new_orders[_normalize_host(hostname)]

    def faults_taken(self, endpoint: Endpoint) -> list[frozenset[str]]:
        """For each fault answered on ``endpoint`` so far, the identifiers of the
        request that took it (empty when the request named none the proxy knows:
        an account or ARI request, or a URL it never saw in an answer)."""
        with self._state.lock:
            return [owners for taken_at, owners in self._state.taken if taken_at is endpoint]

    def faults_taken_by(self, hostname: str) -> list[Endpoint]:
        """The endpoints of the faults answered to requests for ``hostname``."""
        host = _normalize_host(hostname)
        with self._state.lock:
            return [endpoint for endpoint, owners in self._state.taken if host in owners]

    def reset_counts(self) -> None:
        """Zero every counter and forget the renewal-info requests seen (faults stay queued)."""
        with self._state.lock:
            self._state.received.clear()
            self._state.forwarded.clear()
            self._state.new_orders.clear()
            self._state.renewal_info_requests.clear()

    # ----------------------------------------------------------------- control

    def _start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop listening, close open client connections and end all threads."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        handlers = self._server.close_connections()
        self._server.server_close()
        self._thread.join(_STOP_JOIN_S)
        for thread in handlers:
            if thread is not threading.current_thread():
                thread.join(_STOP_JOIN_S)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tls_files(pebble: PebbleStack, workdir: Path) -> tuple[Path, Path]:
    for directory in (workdir, pebble.ca_bundle.parent):
        cert, key = directory / "pebble-tls-cert.pem", directory / "pebble-tls-key.pem"
        if cert.is_file() and key.is_file():
            return cert, key
    raise FileNotFoundError(
        f"Pebble's TLS leaf (pebble-tls-cert.pem, pebble-tls-key.pem) is neither in "
        f"{workdir} nor next to {pebble.ca_bundle}"
    )


def start_fault_proxy(
    pebble: PebbleStack, workdir: Path, *, port: int | None = None
) -> FaultProxy:
    """Start a fault proxy in front of ``pebble`` on 127.0.0.1 (``port`` or a free one).

    ``workdir`` is the directory given to ``start_pebble`` (its TLS leaf and key
    are served by the proxy, so ``pebble.ca_bundle`` trusts the proxy too).
    Point clients at :attr:`FaultProxy.directory_url`.
    """
    cert, key = _tls_files(pebble, workdir)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    upstream_context = ssl.create_default_context(cafile=str(pebble.ca_bundle))

    target = urllib.parse.urlsplit(pebble.directory_url)
    if target.hostname is None or target.port is None:
        raise ValueError(f"cannot tell Pebble's address from {pebble.directory_url!r}")
    directory_path = target.path or "/dir"

    # Learn newNonce from Pebble itself (and so check that it answers).
    conn = http.client.HTTPSConnection(
        target.hostname, target.port, context=upstream_context, timeout=_UPSTREAM_TIMEOUT_S
    )
    try:
        conn.request("GET", directory_path)
        resp = conn.getresponse()
        directory: dict[str, Any] = json.loads(resp.read())
    finally:
        conn.close()
    nonce_path = urllib.parse.urlsplit(str(directory["newNonce"])).path

    server = _ProxyServer(
        port or 0, server_context, upstream_context, target.hostname, target.port, nonce_path
    )
    proxy = FaultProxy(server, directory_path)
    proxy._start()
    return proxy
