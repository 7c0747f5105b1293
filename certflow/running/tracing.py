"""OpenTelemetry tracing: the Temporal tracing interceptor for workflows and
activities, plus one span per provisioning step with the attributes the
original recorded. Exported over OTLP/HTTP when ``CERTFLOW_OTLP_ENDPOINT`` is
set; otherwise the spans are no-ops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from certflow.errors import AcmeProblemError, ProvisioningError

_tracer = trace.get_tracer("certflow")


def configure_tracing(endpoint: str, service_name: str = "certflow-worker") -> None:
    """Export spans to an OTLP/HTTP collector (e.g. http://otel:4318/v1/traces)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)


@contextmanager
def step_span(phase: str, **attributes: str | int | None) -> Iterator[Span]:
    """A ``certmanager.<phase>`` span; a failure adds its error code and ACME problem."""
    with _tracer.start_as_current_span(
        f"certmanager.{phase}", record_exception=False, set_status_on_exception=False
    ) as span:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        try:
            yield span
        except ProvisioningError as err:
            span.set_status(Status(StatusCode.ERROR, str(err.code)))
            span.set_attribute("provisioning.error_code", str(err.code))
            if isinstance(err, AcmeProblemError):
                span.set_attribute("acme.problem_type", err.problem_type)
                span.set_attribute("acme.detail", err.detail)
            raise
