"""The SQL of an account's new-order slots (certflow/acme/slots.py): one session
advisory lock per slot, keyed by the CA's directory URL. Expressions, so that a
statement with other work can take or let go of a slot in the same round trip."""

from __future__ import annotations


def take_slot(directory_url: str, slots: str) -> str:
    """The first of the account's ``slots`` slots this session could take (NULL:
    all taken); arguments are the statement's placeholders."""
    return (
        f"(SELECT s FROM generate_series(0, {slots} - 1) AS s"
        f" WHERE pg_try_advisory_lock(hashtext({directory_url}), s) LIMIT 1)"
    )


def let_go(directory_url: str, slot: str) -> str:
    """Let go of a slot this session holds; arguments are placeholders."""
    return f"pg_advisory_unlock(hashtext({directory_url}), {slot})"
