"""The fakes stand in for exactly the activities the Certificate workflow calls,
under the names the worker registers (activities/registry.py): a fake missing,
extra or misnamed would let the workflow tests pass against a workflow that
fails on a real worker."""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.testing import WorkflowEnvironment

from activities.registry import CERTIFICATE_ACTIVITIES

from .fakes import Fakes


def _name(fn: Any) -> str:
    definition = activity._Definition.from_callable(fn)  # the name @activity.defn registered
    assert definition is not None and definition.name, fn
    return definition.name


def test_fakes_mirror_the_registered_activities(workflow_env: WorkflowEnvironment) -> None:
    registered = sorted(_name(fn) for fn in CERTIFICATE_ACTIVITIES)
    faked = sorted(_name(fn) for fn in Fakes(workflow_env).activities())
    assert faked == registered


def test_registered_names_are_the_ones_histories_hold() -> None:
    """Renaming an activity's registered name breaks the replay of every running
    certificate (the histories under tests/workflows/histories hold these)."""
    assert {_name(fn) for fn in CERTIFICATE_ACTIVITIES} == {
        "ensure_certificate", "persist_challenge", "record_failure", "load_certificate",
        "reopen_failed", "begin_renewal", "mark_expired", "cancel_certificate",
        "delete_certificate", "check_dns", "place_order", "create_order", "accept_challenge",
        "wait_for_order", "finalize_and_store", "renewal_info", "deactivate_authorizations",
        "revoke_certificate", "cooldown_remaining", "check_http01", "publish_dns01", "withdraw_dns01", "transfer_certificate", "give_up",
        "validate_order", "order_and_validate",
    }
