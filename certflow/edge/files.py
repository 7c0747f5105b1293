"""The files edge: a directory of ``<hostname>.pem`` (the chain, leaf first, then
the private key), for nginx and any edge that reads files per handshake or
watches a directory (Traefik's file provider, Envoy's SDS file watch).

Each file is written whole or not at all: a temporary file in the same
directory (mode 0600 from its creation, owned by the configured user), written,
fsynced, renamed over the old one, and the directory fsynced; a reader opens
either the old file or the new one, never a part. A wildcard's file is named
after it (``*.shop.example.com.pem``). One process owns a directory (a lock
file keeps a second one out) and every ``*.pem`` in it: at start it removes what
a killed push left behind (temporary files), and the follower removes the files
of hostnames no longer served.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

from certflow.errors import ConfigError

SUFFIX = ".pem"
_TEMP_PREFIX = ".certflow-"
_LOCK = ".certflow-edge.lock"
_NAME = re.compile(r"(\*\.)?[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
"""A hostname as a file name: lower case, no ``/``, never ``.`` or ``..``."""


class FileTarget:
    """A directory of ``<hostname>.pem`` files, mode 0600, owned by ``owner``
    (uid, gid) when given (the edge's worker user: nginx's reads them)."""

    def __init__(self, directory: Path, owner: tuple[int, int] | None = None) -> None:
        self.directory = directory
        self.owner = owner
        try:
            if not directory.exists():
                directory.mkdir(mode=0o700, parents=True)
                if owner is not None:
                    os.chown(directory, *owner)
            self._lock = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise ConfigError(f"CERTFLOW_EDGE_DIR: cannot use {directory}: {err.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock)
            raise ConfigError(
                f"CERTFLOW_EDGE_DIR: {directory} is kept by another certflow edge process"
            ) from None
        for leftover in directory.glob(_TEMP_PREFIX + "*.tmp"):  # a push killed midway
            leftover.unlink(missing_ok=True)

    async def restarted(self) -> bool:
        """A directory forgets nothing: nginx reads it as it is."""
        return False

    async def start(self) -> None:
        """The directory and its lock are taken when the target is made."""

    async def stop(self) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock)

    def path(self, hostname: str) -> Path:
        if not _NAME.fullmatch(hostname):
            raise ValueError(f"not a hostname this edge writes a file for: {hostname!r}")
        return self.directory / (hostname + SUFFIX)

    async def put(self, hostname: str, chain_pem: str, key_pem: bytes) -> None:
        """Replace hostname's file with chain then key, atomically; nothing is
        written when the file already holds exactly that (a restart's convergence)."""
        final = self.path(hostname)
        data = chain_pem.encode()
        data += b"" if data.endswith(b"\n") else b"\n"
        data += key_pem
        if self._holds(final, data):
            return
        fd, temp = _temp_file(self.directory)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            Path(temp).unlink(missing_ok=True)
            raise
        os.close(fd)
        try:
            os.replace(temp, final)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        self._sync_directory()

    def _holds(self, final: Path, data: bytes) -> bool:
        try:
            with open(final, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_mode & 0o777 != 0o600:
                    return False
                if self.owner is not None and (st.st_uid, st.st_gid) != self.owner:
                    return False
                return f.read(len(data) + 1) == data
        except OSError:
            return False

    async def remove(self, hostname: str) -> bool:
        if "/" in hostname or hostname.startswith(".") or not hostname:
            raise ValueError(f"not a file name this edge keeps: {hostname!r}")
        try:
            (self.directory / (hostname + SUFFIX)).unlink()
        except FileNotFoundError:
            return False
        self._sync_directory()
        return True

    async def held(self) -> set[str]:
        return {
            entry.name[: -len(SUFFIX)]
            for entry in os.scandir(self.directory)
            if entry.name.endswith(SUFFIX) and not entry.name.startswith(".")
        }

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_file(directory: Path) -> tuple[int, str]:
    """A new file in directory, mode 0600 from its creation (O_EXCL: never an old one)."""
    for _ in range(100):
        name = directory / f"{_TEMP_PREFIX}{os.urandom(8).hex()}.tmp"
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), str(name)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")
