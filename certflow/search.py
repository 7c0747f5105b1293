"""Typed search attributes for the Temporal UI and `temporal workflow list --query`.

Registered by the worker at start when missing; the Certificate workflow keeps
them current. Nothing secret ever goes in them (they are not encrypted).
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

log = logging.getLogger(__name__)

HOSTNAME = SearchAttributeKey.for_keyword("CertificateHostname")
STATUS = SearchAttributeKey.for_keyword("CertificateStatus")
ERROR_CODE = SearchAttributeKey.for_keyword("CertificateErrorCode")
EXPIRES_AT = SearchAttributeKey.for_datetime("CertificateExpiresAt")
TENANT = SearchAttributeKey.for_keyword("TenantId")
ISSUER = SearchAttributeKey.for_keyword("CertificateIssuer")
"""The CA of the current certificate, else of the attempt under way."""

_TYPES = {
    HOSTNAME.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    STATUS.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    ERROR_CODE.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    EXPIRES_AT.name: IndexedValueType.INDEXED_VALUE_TYPE_DATETIME,
    TENANT.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    ISSUER.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
}


async def register_search_attributes(client: Client, namespace: str) -> bool:
    """Add the attributes the namespace lacks; False when the server refuses
    (e.g. no operator permission), in which case workflows do without them."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        missing = {
            name: kind
            for name, kind in _TYPES.items()
            if name not in existing.custom_attributes
        }
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(search_attributes=missing, namespace=namespace)
            )
            log.info("registered search attributes %s", sorted(missing))
    except RPCError as err:
        log.warning("search attributes unavailable (%s); workflows run without them", err)
        return False
    return True
