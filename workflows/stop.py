"""Stopping: cancel, and for delete the revocation (when asked) and the rows'
removal; then the run ends."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.acme import AcmeActivities
    from activities.records import RecordActivities
    from certflow.models import CertificateStatus, Phase, ValidationMethod
    from certflow.workflow_payloads import CertificateState
    from workflows.run_state import StopRequest
    from workflows.steps import (
        BEST_EFFORT,
        CA,
        POSTGRES,
        failure_of,
        run,
    )

from workflows import publish, rows
from workflows.base import CertificateBase


class Stopping(CertificateBase):
    """Cancel or delete, then the end of the run."""

    async def _finish_stop(self, stop: StopRequest) -> CertificateState:
        """Cancel (and for delete: revoke if asked, then remove the rows)."""
        record = self._record
        self._enter(Phase.CANCELING)
        open_order = await run(POSTGRES, RecordActivities.cancel_certificate, record.certificate_id)
        record = rows.set_written(
            self._state,
            open_order.row,
            record,
            status=CertificateStatus.CANCELED,
            order_url=None,
            challenge_url=None,
        )
        if open_order.order_url and record.validation_method is ValidationMethod.DNS_01:
            await self._withdraw_dns01(record)
        if open_order.order_url:
            try:
                await run(
                    BEST_EFFORT, AcmeActivities.deactivate_authorizations, open_order.order_url
                )
            except ActivityError:
                workflow.logger.warning("could not deactivate the open authorization")
        await publish.notify(self._state, "canceled")
        if stop.delete:
            if stop.revoke and record.expires_at is not None:
                self._enter(Phase.REVOKING)
                try:
                    await run(CA, AcmeActivities.revoke_certificate, record.certificate_id)
                except ActivityError as err:
                    failure = failure_of(err)
                    rows.set_record(self._state, record.model_copy(
                        update={"error_code": failure.code, "error_message": failure.message}
                    ))
                    return await self._end(Phase.NOT_DELETED)
            await run(POSTGRES, RecordActivities.delete_certificate, record.certificate_id)
            return await self._end(Phase.DELETED)
        return await self._end(Phase.CANCELED)

    async def _end(self, phase: Phase) -> CertificateState:
        self._enter(phase)
        self._state.stopped = True
        self._state.retry_requested = self._state.renew_requested = False
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._view()
