"""The CA's HTTP as certflow needs it: the status and Retry-After that the acme
library's ``messages.Error`` drops (:class:`AcmeNetwork`), and every failure of a
call to the CA as a typed :class:`~certflow.errors.AcmeProblemError`
(:func:`classify_acme_failure`)."""

from __future__ import annotations

import email.utils
from datetime import datetime, timezone
from typing import Any

import requests
from acme import client as acme_client
from acme import errors as acme_errors
from acme import messages

from certflow.acme.problems import problem_error
from certflow.errors import AcmeProblemError, CertflowError, ErrorCode

USER_AGENT = "certflow"
DEFAULT_RATE_LIMIT_SECONDS = 3600.0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date).

    A past date means 0; absent or unparseable gives None.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    return max(0.0, (when - now).total_seconds())


class HttpStatusError(CertflowError, acme_errors.ClientError):
    """An error response from the CA without an RFC 7807 problem document."""

    def __init__(self, status: int, retry_after: str | None, body: str) -> None:
        super().__init__(f"HTTP {status} from the CA: {body[:200]}")
        self.http_status = status
        self.retry_after = retry_after


class AcmeNetwork(acme_client.ClientNetwork):
    """Keeps the HTTP status and Retry-After that ``messages.Error`` drops."""

    @classmethod
    def _check_response(
        cls, response: requests.Response, content_type: str | None = None
    ) -> requests.Response:
        try:
            return super()._check_response(response, content_type=content_type)
        except messages.Error as err:
            err.http_status = response.status_code
            err.retry_after = response.headers.get("Retry-After")
            raise
        except acme_errors.ConflictError:
            raise
        except acme_errors.ClientError:
            if not response.ok:
                raise HttpStatusError(
                    response.status_code, response.headers.get("Retry-After"), response.text
                ) from None
            raise


def _problem_suffix(problem_type: str) -> str:
    return problem_type.rsplit(":", 1)[-1].lower() if problem_type else ""


def classify_acme_failure(exc: BaseException) -> AcmeProblemError:
    """Translate whatever a CA call raised into the typed error (in this order: rate
    limit, then invalid order, then temporary; docs/lifecycle.md, "Statuses and
    errors"), with the meaning
    ``certflow.acme.problems`` gives it: a rate limit's scope, a refusal's code
    (ACME_REJECTED, ACME_CAA, ACME_INVALID_ORDER), a refused ``replaces``."""
    if isinstance(exc, AcmeProblemError):
        return exc
    problem_type = ""
    detail = str(exc)
    status: int | None = None
    retry_after_header: str | None = None
    subproblems: list[dict[str, Any]] = []
    if isinstance(exc, messages.Error):
        problem_type = exc.typ or ""
        detail = exc.detail or exc.description or problem_type
        status = getattr(exc, "http_status", None)
        retry_after_header = getattr(exc, "retry_after", None)
        subproblems = [
            {
                "type": sp.typ,
                "detail": sp.detail,
                "identifier": sp.identifier.value if sp.identifier else None,
            }
            for sp in (exc.subproblems or ())
        ]
    elif isinstance(exc, HttpStatusError):
        status = exc.http_status
        retry_after_header = exc.retry_after
    elif isinstance(exc, requests.RequestException):
        detail = f"cannot reach the CA: {type(exc).__name__}: {exc}"

    err = problem_error(
        problem_type,
        detail,
        http_status=status,
        retry_after_seconds=parse_retry_after(retry_after_header),
        subproblems=subproblems,
    )
    bare_gateway_error = isinstance(exc, HttpStatusError) and status in (502, 503, 504)
    if isinstance(exc, requests.RequestException) or bare_gateway_error:
        err.unreachable = err.code is ErrorCode.ACME_TEMPORARY
    return err
