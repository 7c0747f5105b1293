"""The HAProxy edge: certificates pushed over its runtime API (the admin socket),
with no reload, the private key never written to the edge's disk.

Each hostname is one certificate in HAProxy's memory, ``certflow/<hostname>.pem``
(a name, not a file), and one line of the crt-list on the ``bind … crt-list``
line with the hostname as its SNI filter (``*.shop.example.com`` for a
wildcard: HAProxy matches a wildcard filter one label deep). A new hostname is
``new ssl cert``, ``set ssl cert`` with the PEM as payload, ``commit ssl cert``
and ``add ssl crt-list``; a renewal is ``set`` and ``commit`` alone, an atomic
swap for the next handshake; a removal is ``del ssl crt-list`` then ``del ssl
cert``. Only names under ``certflow/`` are ever touched.

Whatever is pushed lives in HAProxy's memory only, so a restart or a reload
(a new worker reads the configuration, whose crt-list is empty) loses it all.
:meth:`HAProxyTarget.restarted` notices a new process (its pid and start time in
``show info``, read over a fresh connection each time) and the follower pushes
everything again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field

from certflow.edge.maintain import EdgeUnreachableError, PushRefusedError

log = logging.getLogger(__name__)

PREFIX = "certflow/"
SUFFIX = ".pem"
SOCKET_SETTING = "CERTFLOW_EDGE_HAPROXY_SOCKET"
TIMEOUT = 10.0
"""Seconds for one command's answer (a commit of one certificate takes milliseconds)."""
_PROMPT = b"\n> "
_ANSWER_LIMIT = 256 * 2**20
"""The largest answer read: ``show ssl cert`` lists every name (about 60 bytes each:
100,000 certificates are 6 MB); asyncio's default of 64 KiB ends near 1,000."""
_NAME = re.compile(r"(\*\.)?[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")


def cert_name(hostname: str) -> str:
    """The name hostname's certificate has in HAProxy's memory."""
    if not _NAME.fullmatch(hostname):
        raise PushRefusedError(f"not a hostname this edge holds a certificate for: {hostname!r}")
    return PREFIX + hostname + SUFFIX


def _hostname(name: str) -> str | None:
    if name.startswith(PREFIX) and name.endswith(SUFFIX):
        return name[len(PREFIX) : -len(SUFFIX)]
    return None


class RuntimeApi:
    """One connection to HAProxy's runtime API in prompt mode: a command, then its
    answer up to the prompt."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, address: str) -> RuntimeApi:
        if address.startswith("/") or ":" not in address:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(address, limit=_ANSWER_LIMIT), TIMEOUT
            )
        else:
            host, _, port = address.rpartition(":")
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port), limit=_ANSWER_LIMIT), TIMEOUT
            )
        api = cls(reader, writer)
        await api.command("prompt")
        return api

    async def command(self, line: str, payload: str | None = None) -> str:
        """The answer to one command; ``payload`` (no empty line in it) follows ``<<``."""
        data = line if payload is None else f"{line} <<\n{payload.rstrip(chr(10))}\n"
        self._writer.write(data.encode() + b"\n")
        await self._writer.drain()
        answer = await asyncio.wait_for(self._reader.readuntil(_PROMPT), TIMEOUT)
        return answer[: -len(_PROMPT)].decode(errors="replace").strip()

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass


@dataclass
class _View:
    """What HAProxy holds of ours, as read at the connection's start and kept since."""

    stored: set[str] = field(default_factory=set)
    """Certificate names in its store."""
    lines: dict[str, list[int]] = field(default_factory=dict)
    """Certificate name → its lines in the crt-list."""
    pending: set[str] = field(default_factory=set)
    """Names with a transaction open (a push killed between ``set`` and ``commit``)."""


class HAProxyTarget:
    """HAProxy's memory, over its runtime API at ``address`` (a unix socket path or
    ``host:port``; ``level admin``), its certificates listed in ``crt_list``."""

    def __init__(self, address: str, crt_list: str) -> None:
        self.address = address
        self.crt_list = crt_list
        self._api: RuntimeApi | None = None
        self._view: _View | None = None
        self._process: tuple[str, str] | None = None
        """(pid, start time) of the HAProxy process ``_view`` describes."""

    def __str__(self) -> str:
        return f"HAProxy's runtime API at {self.address} ({SOCKET_SETTING})"

    async def start(self) -> None:
        """Nothing to take: HAProxy is reached when the follower first pushes."""

    async def stop(self) -> None:
        await self._drop()

    # -- the EdgeTarget operations -------------------------------------------------------

    async def put(self, hostname: str, chain_pem: str, key_pem: bytes) -> None:
        name = cert_name(hostname)
        api, view = await self._session()
        pem = chain_pem.rstrip("\n") + "\n" + key_pem.decode().strip("\n")
        if "\n\n" in pem:
            raise PushRefusedError("its PEM has an empty line (the runtime API ends a payload there)")
        for pending in sorted(view.pending):  # HAProxy holds one transaction at a time
            await self._expect(api, f"abort ssl cert {pending}", "aborted")
            view.pending.discard(pending)
        if name not in view.stored:
            await self._expect(api, f"new ssl cert {name}", "New empty certificate store")
            view.stored.add(name)
        await self._expect(api, f"set ssl cert {name}", "Transaction ", payload=pem)
        view.pending.add(name)
        await self._expect(api, f"commit ssl cert {name}", "Success!")
        view.pending.discard(name)
        if not view.lines.get(name):
            await self._expect(api, f"add ssl crt-list {self.crt_list}", "Success!", payload=f"{name} {hostname}")
            view.lines[name] = [0]  # its line number is read again at the next view

    async def remove(self, hostname: str) -> bool:
        name = cert_name(hostname)
        api, view = await self._session()
        held = name in view.stored or bool(view.lines.get(name))
        if name in view.pending:
            await self._expect(api, f"abort ssl cert {name}", "aborted")
            view.pending.discard(name)
        lines = view.lines.pop(name, [])
        if len(lines) > 1 or 0 in lines:  # several lines (or one added since): name each
            lines = (await self._read_view(api)).lines.get(name, [])
            for line in lines:
                await self._expect(api, f"del ssl crt-list {self.crt_list} {name}:{line}", "deleted")
        elif lines:
            await self._expect(api, f"del ssl crt-list {self.crt_list} {name}", "deleted")
        if name in view.stored:
            await self._expect(api, f"del ssl cert {name}", "deleted")
            view.stored.discard(name)
        return held

    async def held(self) -> set[str]:
        api, _ = await self._session()
        self._view = view = await self._read_view(api)
        names = view.stored | {n for n, lines in view.lines.items() if lines}
        return {h for h in map(_hostname, names) if h is not None}

    async def restarted(self) -> bool:
        """Whether the HAProxy process now answering is not the one pushed to (a
        restart or a reload: what was pushed is gone). Asked over a fresh connection:
        the one kept for pushes may still reach an old worker after a reload."""
        try:
            api = await RuntimeApi.open(self.address)
            try:
                process = _process(await api.command("show info"))
            finally:
                await api.close()
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            await self._drop()
            raise EdgeUnreachableError(f"cannot reach {self}: {_reason(err)}") from None
        if self._process is not None and process != self._process:
            await self._drop()
            return True
        return False

    # -- the connection and what it sees -------------------------------------------------

    async def _session(self) -> tuple[RuntimeApi, _View]:
        if self._api is None:
            api = None
            try:
                api = await RuntimeApi.open(self.address)
                self._process = _process(await api.command("show info"))
                self._view = await self._read_view(api)
            except EdgeUnreachableError:
                if api is not None:
                    await api.close()
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
                self._view = None
                if api is not None:
                    await api.close()
                raise EdgeUnreachableError(f"cannot reach {self}: {_reason(err)}") from None
            self._api = api
        assert self._view is not None
        return self._api, self._view

    async def _read_view(self, api: RuntimeApi) -> _View:
        view = _View()
        section = ""
        for line in (await self._ask(api, "show ssl cert")).splitlines():
            if line.startswith("#"):
                section = line
            elif line.startswith("*") and "transaction" in section:
                view.pending.add(line[1:].strip())
            elif line.startswith(PREFIX):
                view.stored.add(line.strip())
        listing = await self._ask(api, f"show ssl crt-list -n {self.crt_list}")
        if not listing.startswith("#"):
            raise EdgeUnreachableError(
                f"{self} has no crt-list {self.crt_list} (CERTFLOW_EDGE_HAPROXY_CRT_LIST): {listing[:200]}"
            )
        for line in listing.splitlines()[1:]:
            entry = line.split(" ", 1)[0]
            name, _, number = entry.rpartition(":")
            if name.startswith(PREFIX) and number.isdigit():
                view.lines.setdefault(name, []).append(int(number))
        view.pending &= view.stored | set(view.lines)
        return view

    async def _ask(self, api: RuntimeApi, line: str, payload: str | None = None) -> str:
        try:
            return await api.command(line, payload)
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            await self._drop()
            raise EdgeUnreachableError(f"lost {self}: {_reason(err)}") from None

    async def _expect(self, api: RuntimeApi, line: str, success: str, *, payload: str | None = None) -> None:
        answer = await self._ask(api, line, payload)
        if success not in answer:
            # A refusal leaves the view unknown (a half-done push): read it again next time.
            await self._drop()
            raise PushRefusedError(f"HAProxy refused `{line}`: {' '.join(answer.split())[:300]}")

    async def _drop(self) -> None:
        api, self._api, self._view = self._api, None, None
        if api is not None:
            await api.close()


def _process(info: str) -> tuple[str, str]:
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
    if "Pid" not in fields:
        raise ValueError(f"`show info` has no Pid: {info[:200]!r}")
    return fields["Pid"], fields.get("Start_time_sec", fields.get("Uptime", ""))


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
