"""Every activity the worker registers, listed once, with what each shows in the
Temporal UI. The Certificate workflow calls them by typed reference
(workflows/steps.py); tests/workflows/fakes.py stands in for exactly
:data:`CERTIFICATE_ACTIVITIES` (a test checks the names match).

Registered names are pinned by ``@activity.defn(name=…)``: histories hold them,
so an activity keeps its name (and stays registered) as long as an old history
may call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.acme import AcmeActivities
from activities.dns import DnsActivities
from activities.obtain import ObtainActivities
from activities.preflight import PreflightActivities
from activities.reconcile import ReconcileActivities
from activities.records import RecordActivities
from activities.renewal_info import RenewalInfoSweep
from activities.retention import RetentionActivities
from activities.webhooks import WebhookActivities

CERTIFICATE_ACTIVITIES: dict[Callable[..., Any], str] = {
    RecordActivities.ensure_certificate: "reading the certificate row",
    RecordActivities.persist_challenge: "storing the HTTP-01 challenge",
    RecordActivities.record_failure: "recording the failure",
    RecordActivities.reload_record: "re-reading the certificate row",
    RecordActivities.reopen_failed: "reopening the failed certificate",
    RecordActivities.begin_renewal: "beginning the renewal",
    RecordActivities.mark_expired: "marking the certificate expired",
    RecordActivities.cancel_certificate: "canceling the certificate",
    RecordActivities.give_up: "giving up on the hostname (abandoned or departed)",
    RecordActivities.delete_certificate: "deleting the certificate rows",
    DnsActivities.check_dns: "checking the validation method and CAA",
    DnsActivities.publish_dns01: "publishing the dns-01 TXT in our zone",
    DnsActivities.withdraw_dns01: "withdrawing the dns-01 TXT from our zone",
    DnsActivities.transfer_certificate: "moving the hostname to its proven owner",
    PreflightActivities.check_http01: "fetching the challenge as the CA will",
    AcmeActivities.place_order: "creating the ACME order and storing its challenge",
    AcmeActivities.create_order: "creating the ACME order",
    AcmeActivities.accept_challenge: "asking the CA to validate",
    AcmeActivities.wait_for_order: "polling the order",
    AcmeActivities.finalize_and_store: "finalizing and storing the certificate",
    ObtainActivities.validate_order: "checking the challenge as the CA will, asking the CA to validate, polling the order",
    ObtainActivities.order_and_validate: "creating the ACME order, storing its challenge, checking it as the CA will, asking the CA to validate, polling the order",
    AcmeActivities.renewal_info: "asking the CA when to renew (ARI)",
    AcmeActivities.deactivate_authorizations: "deactivating the open authorization",
    AcmeActivities.revoke_certificate: "revoking the certificate",
    AcmeActivities.cooldown_remaining: "checking the CA rate-limit cooldown",
}
"""What the Certificate workflow calls, with its summary in the Temporal UI."""

RECONCILE_ACTIVITIES = (ReconcileActivities.reconcile_certificates, RetentionActivities.prune_events)
DOMAIN_CHECK_ACTIVITIES = (PreflightActivities.check_domain,)
RENEWAL_INFO_ACTIVITIES = (RenewalInfoSweep.sweep_renewal_info,)
WEBHOOK_ACTIVITIES = (WebhookActivities.deliver_webhook,)


def bound(*instances: object) -> list[Callable[..., Any]]:
    """Every listed activity of the given instances, bound, as the worker registers
    them; a class with no instance given (webhooks when none are configured)
    contributes nothing."""
    listed = [
        *CERTIFICATE_ACTIVITIES,
        *DOMAIN_CHECK_ACTIVITIES,
        *RENEWAL_INFO_ACTIVITIES,
        *RECONCILE_ACTIVITIES,
        *WEBHOOK_ACTIVITIES,
    ]
    return [
        getattr(instance, method.__name__)
        for method in listed
        for instance in instances
        if getattr(type(instance), method.__name__, None) is method
    ]
