"""authio's Python client: management calls, permission checks (coalesced on the async client)
and local session verification, with retries by the service's error codes.

    from authio_client import AuthioClient, AsyncAuthioClient

    with AuthioClient("https://auth.example.com", api_key) as authio:
        store = authio.create_store("main")
        w = authio.write_tuples(store.id, writes=[("doc:1", "viewer", "user:anne")])
        assert authio.check(store.id, "doc:1", "viewer", "user:anne", at_least_revision=w.revision).allowed

Middleware for Starlette/FastAPI (``authio_client.starlette``) and aiohttp
(``authio_client.aiohttp``) import their framework only when imported themselves.
"""

from authio_client._async import AsyncAuthioClient
from authio_client._core import RetryPolicy
from authio_client._operations import MAX_BATCH, UNSET
from authio_client._sync import AuthioClient
from authio_client.errors import (
    AuthenticationError,
    AuthioError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    InvalidSession,
    NoSession,
    NotFound,
    RateLimited,
    ServerError,
    Timeout,
    Unavailable,
)
from authio_client.models import (
    ApiKey,
    AuditEvent,
    CheckResult,
    DataSubjectRequest,
    Deleted,
    Fulfilment,
    Invitation,
    Membership,
    OAuthProvider,
    Organization,
    Page,
    Passkey,
    PortalLink,
    Project,
    Revision,
    RiskDecision,
    RiskPolicy,
    ScimToken,
    Session,
    SignalPolicy,
    SignalResult,
    SigningKey,
    Store,
    StoredTuple,
    TupleKey,
    User,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WriteResult,
)
from authio_client.webhooks import WebhookVerificationError, verify_webhook

__version__ = "0.1.0"

__all__ = [
    "MAX_BATCH",
    "UNSET",
    "ApiKey",
    "AsyncAuthioClient",
    "AuditEvent",
    "AuthenticationError",
    "AuthioClient",
    "AuthioError",
    "CheckResult",
    "Conflict",
    "ConnectionFailed",
    "DataSubjectRequest",
    "Deleted",
    "Forbidden",
    "Fulfilment",
    "InvalidRequest",
    "InvalidSession",
    "Invitation",
    "Membership",
    "NoSession",
    "NotFound",
    "OAuthProvider",
    "Organization",
    "Page",
    "Passkey",
    "PortalLink",
    "Project",
    "RateLimited",
    "RetryPolicy",
    "Revision",
    "RiskDecision",
    "RiskPolicy",
    "ScimToken",
    "ServerError",
    "Session",
    "SignalPolicy",
    "SignalResult",
    "SigningKey",
    "Store",
    "StoredTuple",
    "Timeout",
    "TupleKey",
    "Unavailable",
    "User",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookVerificationError",
    "WriteResult",
    "verify_webhook",
]
