"""The files edge (certflow/edge/files.py): each ``<hostname>.pem`` written whole
or not at all, mode 0600, owned as configured, removed on delete, and what a
killed push left behind cleaned at start."""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from certflow.edge.files import FileTarget
from certflow.errors import ConfigError


async def test_a_file_holds_the_chain_then_the_key_mode_0600(tmp_path: Path) -> None:
    """Red if the key came first, the mode followed the umask (0644 under the usual
    022: the key readable by every local user), or held() missed the file."""
    old = os.umask(0o022)
    try:
        target = FileTarget(tmp_path / "edge")
        await target.put("shop.example.com", "CHAIN\n", b"KEY\n")
    finally:
        os.umask(old)
    path = tmp_path / "edge" / "shop.example.com.pem"
    assert path.read_bytes() == b"CHAIN\nKEY\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "edge").stat().st_mode & 0o777 == 0o700
    assert await target.held() == {"shop.example.com"}
    await target.put("*.shop.example.com", "W\n", b"K\n")  # a wildcard is named after itself
    assert (tmp_path / "edge" / "*.shop.example.com.pem").read_bytes() == b"W\nK\n"
    assert await target.held() == {"shop.example.com", "*.shop.example.com"}
    target.close()


async def test_removal_and_names_that_are_not_hostnames(tmp_path: Path) -> None:
    """Red if remove left the file, or a name with a path in it were written
    outside the directory."""
    target = FileTarget(tmp_path)
    await target.put("a.example.com", "C\n", b"K\n")
    assert await target.remove("a.example.com") is True
    assert await target.remove("a.example.com") is False
    assert await target.held() == set()
    for bad in ("../evil.example.com", "a/b.example.com", ".hidden", "UPPER.example.com", ""):
        with pytest.raises(ValueError):
            await target.put(bad, "C\n", b"K\n")
    assert not (tmp_path.parent / "evil.example.com.pem").exists()
    target.close()


async def test_the_same_content_is_not_written_again(tmp_path: Path) -> None:
    """A restart converges without rewriting every file: same inode when the
    content is the same, a new one (the rename) when it changed. Red if put always
    rewrote (a start at 100,000 certificates writes 100,000 files)."""
    target = FileTarget(tmp_path)
    await target.put("a.example.com", "C\n", b"K\n")
    inode = (tmp_path / "a.example.com.pem").stat().st_ino
    await target.put("a.example.com", "C\n", b"K\n")
    assert (tmp_path / "a.example.com.pem").stat().st_ino == inode
    await target.put("a.example.com", "C2\n", b"K\n")
    assert (tmp_path / "a.example.com.pem").stat().st_ino != inode
    target.close()


async def test_a_reader_racing_the_writer_never_reads_a_partial_file(tmp_path: Path) -> None:
    """nginx opens the file on every handshake, whenever a renewal lands: a reader
    in a loop while the writer replaces the file 300 times must read one whole
    version each time. Red when put writes in place (``open(path, "wb")`` then
    write: shown with that, the reader saw empty and truncated files within the
    first few rounds)."""
    target = FileTarget(tmp_path)
    versions = [(f"CHAIN-{i}\n" * 20_000, f"KEY-{i}\n".encode() * 5_000) for i in range(2)]
    whole = {c.encode() + k for c, k in versions}
    await target.put("race.example.com", *versions[0])
    path = tmp_path / "race.example.com.pem"
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(path.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            await target.put("race.example.com", *versions[i % 2])
    finally:
        done.set()
        reader.join()
    assert seen and all(s in whole for s in seen), {len(s) for s in seen if s not in whole}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    target.close()


def test_a_push_killed_midway_leaves_nothing_at_start_and_one_process_per_directory(
    tmp_path: Path,
) -> None:
    """A temporary file a killed process left is removed at the next start (the
    edge only ever reads ``*.pem``); a second process on the same directory is
    refused in one line. Red without the start's cleanup or the lock."""
    (tmp_path / ".certflow-0123456789abcdef.tmp").write_bytes(b"CHAIN-HALF")
    first = FileTarget(tmp_path)
    assert not (tmp_path / ".certflow-0123456789abcdef.tmp").exists()
    with pytest.raises(ConfigError, match="kept by another certflow edge process"):
        FileTarget(tmp_path)
    first.close()
    FileTarget(tmp_path).close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
async def test_files_are_owned_by_the_configured_user(tmp_path: Path) -> None:
    """nginx's workers (not root) read the files: they must own them. Red if the
    owner were set after the rename (a moment when the file is root's) or not at
    all, or a file with the right content but the wrong owner were left as it is."""
    nobody = pwd.getpwnam("nobody")
    owner = (nobody.pw_uid, nobody.pw_gid)
    before = FileTarget(tmp_path)
    await before.put("a.example.com", "C\n", b"K\n")  # root's, from a run without the owner
    before.close()
    target = FileTarget(tmp_path, owner)
    await target.put("a.example.com", "C\n", b"K\n")
    st = (tmp_path / "a.example.com.pem").stat()
    assert (st.st_uid, st.st_gid) == owner
    target.close()
    created = FileTarget(tmp_path / "edge", owner)  # a directory it creates is theirs too
    assert (os.stat(tmp_path / "edge").st_uid, os.stat(tmp_path / "edge").st_gid) == owner
    created.close()
