"""The haproxy kind's talk over the runtime API (certflow/edge/haproxy.py), against
a fake that answers each command with HAProxy 2.6's own text (captured from
Debian's haproxy 2.6.12): a large store read whole, an open transaction left by a
killed push, duplicate crt-list lines, a refusal, a restart. Real HAProxy is
tests/e2e/test_edge_haproxy.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from certflow.edge.haproxy import HAProxyTarget
from certflow.edge.maintain import EdgeUnreachableError, PushRefusedError
from tests.unit.edge_pki import leaf

LIST = "/etc/haproxy/certflow.crtlist"


class FakeHAProxy:
    """The runtime API's prompt mode over a unix socket, with HAProxy's answers."""

    def __init__(self) -> None:
        self.stored: list[str] = ["/etc/haproxy/default.pem"]
        self.lines: list[tuple[str, str]] = []
        self.numbers: list[int] = []
        """Each line's number: HAProxy keeps it when a line before it is deleted."""
        self.pending: str | None = None
        self.pid = 100
        self.commands: list[str] = []
        self.refuse: str | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = (await reader.readline()).decode()
                if not line:
                    return
                line = line.rstrip("\n")
                payload = None
                if line.endswith(" <<"):
                    line, parts = line[:-3], []
                    while (part := (await reader.readline()).decode()) not in ("\n", ""):
                        parts.append(part)
                    payload = "".join(parts)
                self.commands.append(line)
                writer.write((self.answer(line, payload) + "\n\n> ").encode())
                await writer.drain()
        except ConnectionError:
            return

    def answer(self, line: str, payload: str | None) -> str:
        words = line.split(" ")
        if self.refuse and line.startswith(self.refuse):
            return "Can't update: refused for the test!"
        if line == "prompt":
            return ""
        if line == "show info":
            return f"Name: HAProxy\nVersion: 2.6.12\nPid: {self.pid}\nUptime_sec: 3\nStart_time_sec: {1000 + self.pid}"
        if line == "show ssl cert":
            head = f"# transaction\n*{self.pending}\n" if self.pending else ""
            return head + "# filename\n" + "\n".join(self.stored)
        if line == f"show ssl crt-list -n {LIST}":
            numbered = zip(self._numbers(), self.lines)
            return f"# {LIST}\n" + "\n".join(f"{n}:{number} {sni}" for number, (n, sni) in numbered)
        if line.startswith("show ssl crt-list -n "):
            return "didn't find the specified filename"
        name = words[-1]
        if words[:3] == ["new", "ssl", "cert"]:
            if name in self.stored:
                return f"Certificate '{name}' already exists!"
            self.stored.append(name)
            return f"New empty certificate store '{name}'!"
        if words[:3] == ["set", "ssl", "cert"]:
            if self.pending not in (None, name):
                return f"The ongoing transaction is about '{self.pending}' but you are trying to set '{name}'"
            assert payload is not None and KEY.decode().strip() in payload
            created = self.pending is None
            self.pending = name
            return f"Transaction {'created' if created else 'updated'} for certificate {name}!"
        if words[:3] == ["commit", "ssl", "cert"]:
            self.pending = None
            return f"Committing {name}\nSuccess!"
        if words[:3] == ["abort", "ssl", "cert"]:
            self.pending = None
            return f"Transaction aborted for certificate '{name}'!"
        if words[:3] == ["add", "ssl", "crt-list"]:
            assert payload is not None
            cert, sni = payload.split()
            self.numbers = self._numbers() + [max(self._numbers(), default=0) + 1]
            self.lines.append((cert, sni))
            return f"Inserting certificate '{cert}' in crt-list '{words[3]}'.\nSuccess!"
        if words[:3] == ["del", "ssl", "crt-list"]:
            cert, _, number = name.partition(":")
            found = [i for i, (n, _) in enumerate(self.lines) if n == cert]
            if len(found) > 1 and not number:
                return f"Can't delete the entry: found the certificate '{cert}' in several entries"
            numbers = self._numbers()
            index = numbers.index(int(number)) if number else found[0]
            del self.lines[index]
            del numbers[index]
            self.numbers = numbers
            return f"Entry '{cert}' deleted in crtlist '{words[3]}'!"
        if words[:3] == ["del", "ssl", "cert"]:
            if any(n == name for n, _ in self.lines):
                return f"Can't remove the certificate: certificate '{name}' in use, can't be deleted!"
            self.stored.remove(name)
            return f"Certificate '{name}' deleted!"
        return "Unknown command"

    def _numbers(self) -> list[int]:
        return self.numbers if len(self.numbers) == len(self.lines) else list(range(1, len(self.lines) + 1))

    def restart(self) -> None:
        self.stored, self.lines, self.pending, self.pid = ["/etc/haproxy/default.pem"], [], None, self.pid + 1


@pytest.fixture
async def haproxy(tmp_path: Path) -> AsyncIterator[tuple[FakeHAProxy, str]]:
    fake = FakeHAProxy()
    path = str(tmp_path / "admin.sock")
    server = await asyncio.start_unix_server(fake.serve, path)
    yield fake, path
    server.close()


PEM, KEY = leaf("a.example.com")  # made at run time: no key lives in the repository


async def test_a_new_name_then_a_renewal_then_a_removal(haproxy: tuple[FakeHAProxy, str]) -> None:
    """New: new, set, commit, one crt-list line with the hostname as SNI filter; a
    renewal: set and commit only (no second line); a removal: the line, then the
    certificate. Red if a renewal added a line again (HAProxy keeps both: the
    removal then fails on "several entries") or the line had no SNI filter."""
    fake, path = haproxy
    target = HAProxyTarget(path, LIST)
    await target.put("*.shop.example.com", PEM, KEY)
    await target.put("*.shop.example.com", PEM, KEY)
    assert fake.lines == [("certflow/*.shop.example.com.pem", "*.shop.example.com")]
    assert [c for c in fake.commands if not c.startswith("show") and c != "prompt"] == [
        "new ssl cert certflow/*.shop.example.com.pem",
        "set ssl cert certflow/*.shop.example.com.pem",
        "commit ssl cert certflow/*.shop.example.com.pem",
        f"add ssl crt-list {LIST}",
        "set ssl cert certflow/*.shop.example.com.pem",
        "commit ssl cert certflow/*.shop.example.com.pem",
    ]
    assert await target.held() == {"*.shop.example.com"}
    assert await target.remove("*.shop.example.com") is True
    assert (fake.lines, fake.stored) == ([], ["/etc/haproxy/default.pem"])
    assert await target.remove("*.shop.example.com") is False
    await target.stop()


async def test_what_a_killed_push_left_is_mended(haproxy: tuple[FakeHAProxy, str]) -> None:
    """Another process killed between ``set`` and ``commit`` (an open transaction),
    and a line added twice: the next push, of any name, aborts the transaction
    first, and a removal names each line. Red without the abort (shown: HAProxy
    refuses every other certificate's ``set`` while one transaction is open, "The
    ongoing transaction is about …") or without the line numbers."""
    fake, path = haproxy
    fake.stored += ["certflow/a.example.com.pem", "certflow/b.example.com.pem"]
    fake.pending = "certflow/a.example.com.pem"
    fake.lines = [("certflow/b.example.com.pem", "b.example.com")] * 2
    target = HAProxyTarget(path, LIST)
    assert await target.held() == {"a.example.com", "b.example.com"}
    await target.put("c.example.com", PEM, KEY)
    assert fake.pending is None and "abort ssl cert certflow/a.example.com.pem" in fake.commands
    assert await target.remove("b.example.com") is True
    assert [n for n, _ in fake.lines] == ["certflow/c.example.com.pem"]
    await target.stop()


async def test_a_store_of_100000_names_is_read_whole(haproxy: tuple[FakeHAProxy, str]) -> None:
    """``show ssl cert`` at 100,000 certificates is ~6 MB in one answer. Red with
    asyncio's default stream limit (64 KiB): LimitOverrunError, a traceback, the
    process gone — found by ``bench --edges`` converging 10,000."""
    fake, path = haproxy
    fake.stored += [f"certflow/h{i}.example.com.pem" for i in range(100_000)]
    target = HAProxyTarget(path, LIST)
    assert len(await target.held()) == 100_000
    await target.stop()


async def test_a_refusal_a_restart_and_no_haproxy(haproxy: tuple[FakeHAProxy, str], tmp_path: Path) -> None:
    """A refused command is PushRefusedError quoting HAProxy (the follower reports
    that one push); a new pid in ``show info`` is a restart; no socket is
    EdgeUnreachableError naming it and the setting. Red if the refusal passed as
    success (the edge silently keeps the old certificate)."""
    fake, path = haproxy
    target = HAProxyTarget(path, LIST)
    fake.refuse = "commit ssl cert"
    with pytest.raises(PushRefusedError, match="HAProxy refused `commit ssl cert certflow/a.example.com.pem`"):
        await target.put("a.example.com", PEM, KEY)
    fake.refuse = None
    await target.put("a.example.com", PEM, KEY)
    assert await target.restarted() is False
    fake.restart()
    assert await target.restarted() is True
    assert await target.held() == set()
    gone = HAProxyTarget(str(tmp_path / "none.sock"), LIST)
    with pytest.raises(EdgeUnreachableError, match=r"none\.sock \(CERTFLOW_EDGE_HAPROXY_SOCKET\)"):
        await gone.put("a.example.com", PEM, KEY)
    other = HAProxyTarget(path, "/etc/haproxy/other.crtlist")
    with pytest.raises(EdgeUnreachableError, match="has no crt-list /etc/haproxy/other.crtlist"):
        await other.held()
    await target.stop()
