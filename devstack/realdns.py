"""A real authoritative DNS server and a real recursive resolver for the tests.

``start_real_dns`` runs Knot (``knotd``, authoritative for one zone, ``test.`` by
default) and Unbound (recursive, the resolver Let's Encrypt uses) as our own
foreground processes on free loopback ports, with their configuration, zone
file, sockets and logs in a work directory. Unbound reaches Knot through a
stub-zone, so answers carry real DNS semantics: CNAME chains, CAA, negative
answers, TTLs. Point certflow (``CERTFLOW_DNS_RESOLVER``) and Pebble
(``start_pebble(dns_server=...)``) at :attr:`RealDns.resolver`.

``start_real_dns(..., failures=True)`` also loads a small policy into Unbound
(its Python module, Debian's ``python3-unbound``) that answers SERVFAIL for the
names and types :meth:`RealDns.fail_lookups` lists: a customer's name server
that fails one record type (AAAA, say) while answering the others, as seen by a
real recursive resolver.

Every record edit rewrites the zone file, reloads it in Knot, flushes Unbound's
cache for the zone and returns only once Unbound gives the new answer for every
edited name and type. (A client's query that was already in flight during the
reload can still cache an old answer, for at most its TTL: 1 s by default.)
Names outside the zone are not resolvable, there being no root servers: they
SERVFAIL (or NXDOMAIN under Unbound's built-in local zones such as
``invalid.``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CAA

from devstack.servers import (
    StackError,
    _Process,
    _require_free,
    _tcp_open,
    free_port,
)

__all__ = ["RECORD_TTL", "REALDNS_HINT", "RealDns", "start_real_dns"]

REALDNS_HINT = (
    "run scripts/setup.sh (or `apt-get install knot unbound knot-dnsutils python3-unbound`)"
)

RECORD_TTL = 1
"""Default TTL (seconds) of every record, and the zone's negative TTL."""

_DEADLINE_S = 30.0
_QUERY_TIMEOUT_S = 2.0
_PROBE_TIMEOUT_S = 0.25
# The NS host of the zone; Unbound reaches Knot through the stub-zone address,
# never through this name, but the zone needs an NS (and its glue) to be valid.
_NS_LABEL = "realdns-ns"
# Unix socket paths must fit in sockaddr_un (108 bytes with the NUL).
_MAX_SOCKET_PATH = 100

_Key = tuple[dns.name.Name, dns.rdatatype.RdataType]
_RRset = tuple[int, tuple[dns.rdata.Rdata, ...]]


def _find_sbin(name: str) -> str:
    # Debian puts knotd/unbound in /usr/sbin, which a non-root PATH often lacks.
    found = shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")
    if found is None:
        raise StackError(f"`{name}` not found on PATH or in /usr/sbin; {REALDNS_HINT}")
    return found


class RealDns:
    """Knot + Unbound serving one zone; edit its records, query through Unbound.

    Names given to the methods are absolute (``"shop.cust.test"``,
    ``"shop.cust.test."``) or relative to the zone (``"shop.cust"``, ``"@"`` for
    the apex). A name without a trailing dot that does not end in the zone is
    relative; one with a trailing dot must lie inside the zone.

    A name holds either one CNAME or other records, never both: setting one kind
    replaces the other. The apex SOA and NS are fixed.
    """

    def __init__(
        self,
        *,
        zone: dns.name.Name,
        workdir: Path,
        socket_dir: Path,
        knot: _Process,
        unbound: _Process,
        knot_port: int,
        unbound_port: int,
        failures: bool = False,
        resolver_host: str | None = None,
    ) -> None:
        self._failures = failures
        self._resolver_host = resolver_host
        self._zone = zone
        self._workdir = workdir
        self._socket_dir = socket_dir
        self._knot = knot
        self._unbound = unbound
        self._knot_port = knot_port
        self._unbound_port = unbound_port
        self._knotc = _find_sbin("knotc")
        self._unbound_control = _find_sbin("unbound-control")
        self._ns_name = dns.name.Name((_NS_LABEL.encode(),)).concatenate(zone)
        self._data: dict[dns.name.Name, dict[dns.rdatatype.RdataType, _RRset]] = {}
        self._serial = 1
        self._lock = threading.RLock()
        self._depth = 0
        self._touched: dict[_Key, None] = {}
        self._snapshot: dict[dns.name.Name, dict[dns.rdatatype.RdataType, _RRset]] = {}
        self._stopped = False

    # ------------------------------------------------------------------ addresses

    @property
    def zone(self) -> str:
        """The zone's absolute name, e.g. ``"test."``."""
        return self._zone.to_text()

    @property
    def resolver(self) -> str:
        """Unbound's ``127.0.0.1:PORT``: the recursive resolver to point clients at."""
        return f"127.0.0.1:{self._unbound_port}"

    @property
    def resolver_ip(self) -> str:
        """Unbound's extra address (port 53) from ``start_real_dns(resolver_host=...)``,
        for clients that take a bare IP (acme2certifier)."""
        if self._resolver_host is None:
            raise StackError("start_real_dns(..., resolver_host=...) to serve on port 53")
        return self._resolver_host

    @property
    def authoritative(self) -> str:
        """Knot's ``127.0.0.1:PORT`` (authoritative only, no recursion)."""
        return f"127.0.0.1:{self._knot_port}"

    @property
    def zone_file(self) -> Path:
        """The zone file Knot serves (rewritten on every edit)."""
        return self._workdir / f"{self._zone.to_text(omit_final_dot=True)}.zone"

    # -------------------------------------------------------------------- editing

    def set_a(self, name: str, addresses: Sequence[str], *, ttl: int = RECORD_TTL) -> None:
        """Make ``addresses`` the A records of ``name`` (empty: remove them)."""
        values = [str(ipaddress.IPv4Address(a)) for a in addresses]
        self.set_records(name, "A", values, ttl=ttl)

    def set_aaaa(self, name: str, addresses: Sequence[str], *, ttl: int = RECORD_TTL) -> None:
        """Make ``addresses`` the AAAA records of ``name`` (empty: remove them)."""
        values = [str(ipaddress.IPv6Address(a)) for a in addresses]
        self.set_records(name, "AAAA", values, ttl=ttl)

    def set_cname(self, name: str, target: str, *, ttl: int = RECORD_TTL) -> None:
        """Make ``name`` a CNAME to ``target``, replacing every other record of ``name``.

        ``target`` follows the same naming rules as ``name``, except that an
        absolute target (trailing dot) may lie outside the zone (it then
        SERVFAILs when chased: nothing serves it).
        """
        owner = self._name(name)
        if owner == self._zone:
            raise ValueError(f"a CNAME at the zone apex {self.zone} is not allowed")
        rdata = dns.rdata.from_text(
            dns.rdataclass.IN, dns.rdatatype.CNAME, self._name_any(target).to_text()
        )
        with self.batch():
            self._put(owner, dns.rdatatype.CNAME, ttl, (rdata,))

    def set_caa(
        self, name: str, records: Sequence[tuple[int, str, str]], *, ttl: int = RECORD_TTL
    ) -> None:
        """Make ``records`` (flags, tag, value) the CAA set of ``name`` (empty: remove it).

        E.g. ``(0, "issue", "letsencrypt.org; validationmethods=http-01")``; values
        are stored byte for byte (UTF-8) and quoted safely in the zone file.
        """
        # The constructor validates (flags 0-255, alphanumeric tag); dnspython is untyped here.
        rdatas = tuple(
            dns.rdtypes.ANY.CAA.CAA(  # type: ignore[no-untyped-call]
                dns.rdataclass.IN, dns.rdatatype.CAA, flags, tag.encode(), value.encode()
            )
            for flags, tag, value in records
        )
        owner = self._name(name)
        with self.batch():
            self._put(owner, dns.rdatatype.CAA, ttl, rdatas)

    def set_records(
        self, name: str, rdtype: str, values: Sequence[str], *, ttl: int = RECORD_TTL
    ) -> None:
        """Make ``values`` (presentation format, e.g. TXT ``'"a b"'``) the ``rdtype`` set.

        Domain names inside ``values`` are relative to the zone unless they end
        in a dot, as in a zone file. An empty ``values`` removes the set.
        """
        kind = dns.rdatatype.RdataType.make(rdtype)
        if kind in (dns.rdatatype.SOA, dns.rdatatype.NS):
            raise ValueError(f"{rdtype} records are fixed by RealDns")
        rdatas = tuple(
            dns.rdata.from_text(dns.rdataclass.IN, kind, value, origin=self._zone)
            for value in values
        )
        owner = self._name(name)
        with self.batch():
            self._put(owner, kind, ttl, rdatas)

    def clear(self, name: str) -> None:
        """Remove every record of ``name`` (the apex keeps its SOA and NS)."""
        owner = self._name(name)
        with self.batch():
            for rdtype in list(self._data.get(owner, {})):
                self._put(owner, rdtype, RECORD_TTL, ())

    @contextlib.contextmanager
    def batch(self) -> Iterator[RealDns]:
        """Group edits into one zone reload, applied (and verified) when the block ends.

        An exception in the block discards its edits. Nested batches join the
        outermost one. Other threads' edits wait until the batch is done.
        """
        with self._lock:
            outer = self._depth == 0
            if outer:
                self._check_running()
                # Shallow is enough: the record tuples are never mutated.
                self._snapshot = {owner: dict(node) for owner, node in self._data.items()}
                self._touched = {}
            self._depth += 1
            try:
                yield self
            except BaseException:
                if outer:
                    self._data, self._touched = self._snapshot, {}
                raise
            finally:
                self._depth -= 1
            if outer and self._touched:
                self._commit()

    def fail_lookups(self, name: str, rdtypes: Sequence[str]) -> None:
        """Make Unbound answer SERVFAIL for ``name``'s ``rdtypes`` (empty: answer
        normally again), the records in Knot untouched; returns once Unbound does.
        Needs ``start_real_dns(..., failures=True)``."""
        if not self._failures:
            raise StackError("start_real_dns(..., failures=True) to fail lookups")
        owner = self._name_any(name)
        kinds = [dns.rdatatype.RdataType.make(t) for t in rdtypes]
        with self._lock:
            rules = self._failing_rules()
            rules = {r for r in rules if r[0] != owner.to_text().lower()}
            rules |= {(owner.to_text().lower(), dns.rdatatype.to_text(k)) for k in kinds}
            path = self._workdir / _FAILURES_FILE
            path.write_text("".join(f"{n} {t}\n" for n, t in sorted(rules)))
            for kind in (dns.rdatatype.A, dns.rdatatype.AAAA, *kinds):
                self._run(
                    "unbound-control",
                    [
                        self._unbound_control, "-c", str(self._workdir / "unbound.conf"),
                        "flush_type", owner.to_text(), dns.rdatatype.to_text(kind),
                    ],
                    self._unbound,
                )
            deadline = time.monotonic() + _DEADLINE_S
            for kind in kinds:
                self._until(
                    deadline,
                    functools.partial(self._servfails, owner, kind),
                    f"Unbound to SERVFAIL {owner} {dns.rdatatype.to_text(kind)}",
                )

    def _failing_rules(self) -> set[tuple[str, str]]:
        path = self._workdir / _FAILURES_FILE
        if not path.exists():
            return set()
        return {
            (parts[0], parts[1])
            for parts in (line.split() for line in path.read_text().splitlines())
            if len(parts) == 2
        }

    def _servfails(self, owner: dns.name.Name, rdtype: dns.rdatatype.RdataType) -> bool:
        response = self._try_ask(owner, rdtype)
        return response is not None and response.rcode() == dns.rcode.SERVFAIL

    # ------------------------------------------------------------------- querying

    def query(self, name: str, rdtype: str) -> dns.message.Message:
        """Ask Unbound (recursion desired) for ``name``/``rdtype``; return the response."""
        return self._ask(self._name_any(name), dns.rdatatype.RdataType.make(rdtype))

    # ------------------------------------------------------------------- lifetime

    def stop(self) -> None:
        """Stop Unbound and Knot (idempotent); files in the work directory stay."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        self._unbound.stop()
        self._knot.stop()
        if self._socket_dir != self._workdir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> RealDns:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _name(self, name: str) -> dns.name.Name:
        owner = self._name_any(name)
        if not owner.is_subdomain(self._zone):
            raise ValueError(f"{name!r} is not inside the zone {self.zone}")
        if owner == self._ns_name:
            raise ValueError(f"{owner} is RealDns's own NS host; pick another name")
        return owner

    def _name_any(self, name: str) -> dns.name.Name:
        text = name.strip()
        if text in ("", "@"):
            return self._zone
        absolute = dns.name.from_text(text)
        if text.endswith(".") or absolute.is_subdomain(self._zone):
            return absolute
        return dns.name.from_text(text, origin=self._zone)

    def _check_running(self) -> None:
        if self._stopped:
            raise StackError("RealDns is stopped")

    def _put(
        self,
        owner: dns.name.Name,
        rdtype: dns.rdatatype.RdataType,
        ttl: int,
        rdatas: tuple[dns.rdata.Rdata, ...],
    ) -> None:
        if not 0 <= ttl <= 2**31 - 1:
            raise ValueError(f"TTL out of range: {ttl}")
        node = self._data.setdefault(owner, {})
        if rdatas:
            # CNAME and other data exclude each other (RFC 1034 3.6.2): replace.
            is_cname = rdtype == dns.rdatatype.CNAME
            for other in [t for t in node if (t == dns.rdatatype.CNAME) != is_cname]:
                del node[other]
                self._touched[(owner, other)] = None
            unique = tuple(dict.fromkeys(rdatas))
            node[rdtype] = (ttl, unique)
        else:
            node.pop(rdtype, None)
        if not node:
            del self._data[owner]
        self._touched[(owner, rdtype)] = None

    def _render(self, serial: int) -> str:
        zone, ns = self._zone.to_text(), self._ns_name.to_text()
        lines = [
            f"; written by devstack.realdns, serial {serial}",
            f"$TTL {RECORD_TTL}",
            # refresh/retry/expire only matter to secondaries; minimum = negative TTL.
            f"{zone} {RECORD_TTL} IN SOA {ns} hostmaster.{zone} {serial}"
            f" 3600 600 86400 {RECORD_TTL}",
            f"{zone} {RECORD_TTL} IN NS {ns}",
            f"{ns} {RECORD_TTL} IN A 127.0.0.1",
        ]
        for owner in sorted(self._data):
            for rdtype, (ttl, rdatas) in sorted(self._data[owner].items()):
                type_text = dns.rdatatype.to_text(rdtype)
                for rdata in rdatas:
                    # Absolute names everywhere; to_text escapes quotes and bytes.
                    lines.append(f"{owner.to_text()} {ttl} IN {type_text} {rdata.to_text()}")
        return "\n".join(lines) + "\n"

    def _write_zone(self, serial: int) -> None:
        tmp = self.zone_file.with_suffix(".zone.tmp")
        tmp.write_text(self._render(serial))
        os.replace(tmp, self.zone_file)  # Knot never reads a half-written file

    def _commit(self) -> None:
        serial = self._serial + 1
        self._write_zone(serial)
        try:
            self._run(
                "knotc",
                [self._knotc, "-c", str(self._workdir / "knot.conf"),
                 "-s", str(self._socket_dir / "knot.sock"), "-t", "30",
                 "-b", "zone-reload", self.zone],
                self._knot,
            )
        except StackError:
            # Knot keeps serving the old zone: go back to it, file included.
            self._data, self._touched = self._snapshot, {}
            self._write_zone(self._serial)
            raise
        self._serial = serial
        deadline = time.monotonic() + _DEADLINE_S
        self._until(deadline, lambda: self._knot_serial() == serial, f"Knot at serial {serial}")
        self._flush()
        pending = list(self._touched)
        self._touched = {}
        for owner, rdtype in pending:
            node = self._data.get(owner, {})
            if rdtype != dns.rdatatype.CNAME and dns.rdatatype.CNAME in node:
                continue  # the CNAME check covers it (other data cannot be there)
            _, want = node.get(rdtype, (0, ()))
            what = f"Unbound answering {owner} {dns.rdatatype.to_text(rdtype)} with " + (
                ", ".join(r.to_text() for r in want) or "no records"
            )
            self._until(
                deadline, lambda: self._unbound_has(owner, rdtype, want), what, retry=self._flush
            )

    def _until(
        self,
        deadline: float,
        check: Callable[[], bool],
        what: str,
        retry: Callable[[], None] | None = None,
    ) -> None:
        delay = 0.01
        while not check():
            if time.monotonic() > deadline:
                raise StackError(
                    f"timed out waiting for {what}; see knot.log and unbound.log in {self._workdir}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
            if retry is not None:
                retry()

    def _flush(self) -> None:
        # An answer already in flight when Knot reloaded could land after a single
        # flush, so verification re-flushes until the new data shows.
        for command in (
            ["flush_requestlist"],
            ["flush_zone", self.zone],
            ["flush_negative"],
            ["flush_infra", "all"],
        ):
            self._run(
                "unbound-control",
                [self._unbound_control, "-c", str(self._workdir / "unbound.conf"), *command],
                self._unbound,
            )

    def _run(self, name: str, argv: list[str], server: _Process) -> None:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise StackError(f"{name} failed: {exc!r}") from exc
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            try:
                tail = "\n".join(server.log.read_text(errors="replace").splitlines()[-20:])
            except OSError as exc:
                tail = f"(cannot read log: {exc})"
            raise StackError(
                f"`{name} {' '.join(argv[1:])}` failed: {output}\n"
                f"--- tail of {server.log} ---\n{tail}"
            )

    def _ask(
        self,
        name: dns.name.Name,
        rdtype: dns.rdatatype.RdataType,
        port: int | None = None,
        timeout: float = _QUERY_TIMEOUT_S,
    ) -> dns.message.Message:
        query = dns.message.make_query(name, rdtype)
        response, _ = dns.query.udp_with_fallback(
            query, "127.0.0.1", port=port or self._unbound_port, timeout=timeout
        )
        return response

    def _try_ask(
        self,
        name: dns.name.Name,
        rdtype: dns.rdatatype.RdataType,
        port: int | None = None,
        timeout: float = _QUERY_TIMEOUT_S,
    ) -> dns.message.Message | None:
        try:
            return self._ask(name, rdtype, port, timeout)
        except (dns.exception.DNSException, OSError):
            return None

    def _knot_serial(self, timeout: float = _QUERY_TIMEOUT_S) -> int | None:
        response = self._try_ask(self._zone, dns.rdatatype.SOA, self._knot_port, timeout)
        return None if response is None else _soa_serial(response, self._zone)

    def _unbound_has(
        self,
        owner: dns.name.Name,
        rdtype: dns.rdatatype.RdataType,
        want: tuple[dns.rdata.Rdata, ...],
    ) -> bool:
        response = self._try_ask(owner, rdtype)
        if response is None:
            return False
        if response.rcode() not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
            return False
        got: set[dns.rdata.Rdata] = set()
        for rrset in response.answer:
            if rrset.name == owner and rrset.rdtype == rdtype:
                got.update(rrset)
        return got == set(want)


def _soa_serial(response: dns.message.Message, zone: dns.name.Name) -> int | None:
    for rrset in response.answer:
        if rrset.name == zone and rrset.rdtype == dns.rdatatype.SOA:
            for rdata in rrset:
                serial: int = rdata.serial
                return serial
    return None


# --------------------------------------------------------------------------- start


def _knot_conf(workdir: Path, socket_dir: Path, port: int, zone: dns.name.Name) -> str:
    return f"""\
# written by devstack.realdns
server:
    rundir: "{workdir}"
    listen: 127.0.0.1@{port}
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
control:
    listen: "{socket_dir / 'knot.sock'}"
log:
  - target: stdout
    any: info
database:
    storage: "{workdir / 'knot-db'}"
template:
  - id: default
    storage: "{workdir}"
    file: "%s.zone"
    # The zone file is the only source: no journal, never written back.
    zonefile-load: whole
    zonefile-sync: -1
    journal-content: none
    semantic-checks: on
zone:
  - domain: {zone.to_text()}
"""


_FAILURES_FILE = "servfail.rules"
_FAILURES_SCRIPT = "servfail_policy.py"
# Unbound's Python module (python3-unbound): SERVFAIL for the "<name> <TYPE>"
# lines of the rules file, read on every query; every other query goes on to the
# iterator untouched.
_FAILURES_POLICY = """\
import os

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "servfail.rules")


def _failing():
    try:
        with open(RULES) as rules:
            return {tuple(line.split()) for line in rules if line.strip()}
    except OSError:
        return set()


def init_standard(id, env):
    return True


def deinit(id):
    return True


def inform_super(id, qstate, superqstate, qdata):
    return True


def operate(id, event, qstate, qdata):
    if event in (MODULE_EVENT_NEW, MODULE_EVENT_PASS):
        asked = (qstate.qinfo.qname_str.lower(), qstate.qinfo.qtype_str)
        if asked in _failing():
            qstate.return_rcode = RCODE_SERVFAIL
            qstate.ext_state[id] = MODULE_FINISHED
        else:
            qstate.ext_state[id] = MODULE_WAIT_MODULE
        return True
    if event == MODULE_EVENT_MODDONE:
        qstate.ext_state[id] = MODULE_FINISHED
        return True
    qstate.ext_state[id] = MODULE_ERROR
    return True
"""
# Where Debian's python3-unbound puts unboundmodule.py, which the module imports.
_UNBOUND_PYTHONPATH = "/usr/lib/python3/dist-packages"


def _unbound_conf(
    workdir: Path,
    socket_dir: Path,
    port: int,
    knot_port: int,
    zone: dns.name.Name,
    failures: bool = False,
    resolver_host: str | None = None,
    stubs: dict[str, list[str]] | None = None,
) -> str:
    name = zone.to_text()
    more_stubs = "".join(
        f'stub-zone:\n    name: "{stub}."\n'
        + "".join(f"    stub-addr: {address}\n" for address in addresses)
        for stub, addresses in (stubs or {}).items()
    )
    modules = "python iterator" if failures else "iterator"
    policy = f'python:\n    python-script: "{workdir / _FAILURES_SCRIPT}"\n' if failures else ""
    extra = f"    interface: {resolver_host}@53\n" if resolver_host else ""
    return f"""\
# written by devstack.realdns
server:
    interface: 127.0.0.1@{port}
{extra}    access-control: 127.0.0.0/8 allow
    do-ip6: no
    # Knot lives on loopback, which Unbound refuses to query by default.
    do-not-query-localhost: no
    username: ""
    chroot: ""
    directory: "{workdir}"
    pidfile: "{workdir / 'unbound.pid'}"
    use-syslog: no
    logfile: ""
    log-time-ascii: yes
    log-servfail: yes
    verbosity: 1
    num-threads: 1
    so-reuseport: no
    # No DNSSEC: the zone is unsigned and there is no trust anchor to reach.
    module-config: "{modules}"
    qname-minimisation: yes
    prefetch: no
    serve-expired: no
    # A local zone of our own name replaces any built-in one (test., invalid.,
    # ...), which would answer NXDOMAIN for every name; with no local data it
    # lets queries through to the stub.
    local-zone: "{name}" transparent
{policy}remote-control:
    control-enable: yes
    control-interface: "{socket_dir / 'unbound.ctl'}"
    control-use-cert: no
stub-zone:
    name: "{name}"
    stub-addr: 127.0.0.1@{knot_port}
{more_stubs}"""


def start_real_dns(
    workdir: Path,
    zone: str = "test",
    *,
    failures: bool = False,
    resolver_host: str | None = None,
    stubs: dict[str, list[str]] | None = None,
) -> RealDns:
    """Start Knot (authoritative for ``zone``) and Unbound (recursive) in ``workdir``.

    Blocks until Unbound answers the zone's SOA. The zone starts with just its
    SOA and NS; records get a 1 s TTL and negative answers a 1 s TTL.
    ``failures``: Unbound can be told to SERVFAIL chosen lookups
    (:meth:`RealDns.fail_lookups`; needs python3-unbound).
    ``resolver_host``: a loopback IPv4 address (e.g. ``"127.0.3.1"``) where
    Unbound also listens on port 53 (:attr:`RealDns.resolver_ip`), for clients
    that cannot be given a port; binding port 53 needs root.
    ``stubs``: more zones Unbound asks given servers for (``{"acme.test":
    ["127.0.2.1@53"]}``), e.g. devstack.dns01zone's.
    """
    if resolver_host is not None:
        address = ipaddress.ip_address(resolver_host)
        if address.version != 4 or not address.is_loopback:
            raise ValueError(f"resolver_host must be a loopback IPv4 address: {resolver_host!r}")
        resolver_host = str(address)
    knotd, unbound = _find_sbin("knotd"), _find_sbin("unbound")
    for tool in ("knotc", "unbound-control"):
        _find_sbin(tool)
    origin = dns.name.from_text(zone.strip() or ".")
    if origin == dns.name.root:
        raise ValueError("RealDns serves a named zone, not the root")
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if len(str(workdir / "unbound.ctl")) <= _MAX_SOCKET_PATH:
        socket_dir = workdir
    else:
        socket_dir = Path(tempfile.mkdtemp(prefix="realdns-"))
    for stale in ("knot.sock", "unbound.ctl"):
        (socket_dir / stale).unlink(missing_ok=True)
    # Fresh Knot state: its timer database remembers serials from a previous run.
    shutil.rmtree(workdir / "knot-db", ignore_errors=True)
    (workdir / "knot-db").mkdir()

    knot_port, unbound_port = free_port(), free_port()
    _require_free("knotd", knot_port)
    _require_free("unbound", unbound_port)
    if resolver_host is not None and _tcp_open(53, resolver_host):
        raise StackError(f"unbound cannot start: {resolver_host}:53 is already in use")
    (workdir / "knot.conf").write_text(_knot_conf(workdir, socket_dir, knot_port, origin))
    (workdir / "unbound.conf").write_text(
        _unbound_conf(
            workdir, socket_dir, unbound_port, knot_port, origin, failures, resolver_host, stubs
        )
    )
    unbound_env = None
    if failures:
        if not Path(_UNBOUND_PYTHONPATH, "unboundmodule.py").exists():
            raise StackError(f"Unbound's Python module is missing; {REALDNS_HINT}")
        (workdir / _FAILURES_SCRIPT).write_text(_FAILURES_POLICY)
        (workdir / _FAILURES_FILE).write_text("")
        unbound_env = {"PYTHONPATH": _UNBOUND_PYTHONPATH}
    knot = _Process("knotd", [knotd, "-c", str(workdir / "knot.conf")], workdir / "knot.log")
    resolver = _Process(
        "unbound",
        [unbound, "-d", "-c", str(workdir / "unbound.conf")],
        workdir / "unbound.log",
        env=unbound_env,
    )
    dns_ = RealDns(
        zone=origin,
        workdir=workdir,
        socket_dir=socket_dir,
        knot=knot,
        unbound=resolver,
        knot_port=knot_port,
        unbound_port=unbound_port,
        failures=failures,
        resolver_host=resolver_host,
    )
    dns_._write_zone(dns_._serial)
    atexit.register(dns_.stop)
    try:
        knot.start()
        knot.wait_ready(
            lambda: (socket_dir / "knot.sock").exists()
            and dns_._knot_serial(_PROBE_TIMEOUT_S) == dns_._serial,
            _DEADLINE_S,
        )
        resolver.start()
        resolver.wait_ready(lambda: _resolver_ready(dns_), _DEADLINE_S)
    except BaseException:
        dns_.stop()
        raise
    return dns_


def _resolver_ready(real: RealDns) -> bool:
    # SERVFAILs while Unbound is still starting are retried by the caller.
    # A UDP query to a port nobody listens on yet just times out: keep it short.
    response = real._try_ask(real._zone, dns.rdatatype.SOA, timeout=_PROBE_TIMEOUT_S)
    if response is None or _soa_serial(response, real._zone) != real._serial:
        return False
    if real._resolver_host is not None:
        try:
            query = dns.message.make_query(real._zone, dns.rdatatype.SOA)
            extra = dns.query.udp(query, real._resolver_host, port=53, timeout=_PROBE_TIMEOUT_S)
        except (dns.exception.DNSException, OSError):
            return False
        if _soa_serial(extra, real._zone) != real._serial:
            return False
    control = subprocess.run(
        [real._unbound_control, "-c", str(real._workdir / "unbound.conf"), "status"],
        capture_output=True,
        timeout=30,
    )
    return control.returncode == 0
