"""Who is calling: API keys, JWT bearer tokens and service identities.

Credentials arrive as ``authorization: Bearer <credential>`` (or
``x-api-key: <key>``). A credential with two dots is a JWT, verified with
PyJWT against the issuer's JWKS (a mounted file or a URL): signature, ``iss``,
``aud``, ``exp``/``nbf``/``iat`` with a clock-skew leeway. Anything else is an
API key, looked up by its SHA-256 in a mounted keys file that is re-read when
it changes, so keys are added, revoked and rotated without a restart. The
keys file never holds a key itself::

    keys:
      - id: team-a-2026-12        # shown in logs, never the key
        sha256: 9f86d08…           # hashlib.sha256(key.encode()).hexdigest()
        tenant: team-a
        scopes: [ask, ingest]
        revoked: false             # optional; a revoked key is UNAUTHENTICATED

The tenant and the scopes of a call come from its credential only. Scopes:
``ask`` (AnswerService), ``ingest`` (IngestService), ``admin`` (everything,
reflection included) and ``internal``, the scope of a service identity: the
lexical, semantic, rerank, generate and knowledge services accept only
callers holding it. A service identity (or an admin) may name the tenant it
acts for in ``x-attest-tenant`` (``tenant_metadata``); from anyone else that
header is ignored, and without it a service call acts for tenant ``default``.
Services name it on every call to a store: the answer pipeline the request's
or the queued job's tenant, ingest's writers the job's, and any other call
made while serving a request carries that request's (``attest.core.channels``).
On an internal listener that requires client certificates, a verified
certificate is a service identity too (mTLS).

Nothing here touches grpc: the interceptor hands in the call's metadata and
the peer's verified certificate names.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import jwt
import yaml  # type: ignore[import-untyped]

from attest.core.context import DEFAULT_TENANT
from attest.core.errors import InvalidArgument, PermissionDenied, Unauthenticated
from attest.core.metadata import API_KEY_KEY, AUTHORIZATION_KEY, TENANT_KEY
from attest.core.settings import AuthSettings

log = logging.getLogger(__name__)

SCOPES = frozenset({"ask", "ingest", "admin", "internal"})
ALL_SCOPES = SCOPES

#: Services on the public listener and the scope each needs.
PUBLIC_SERVICES: Mapping[str, str] = {
    "attest.answer.v1.AnswerService": "ask",
    "attest.ingest.v1.IngestService": "ingest",
}
#: Services anyone may call, authenticated or not (probes).
OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})
_REFLECTION_PREFIX = "grpc.reflection."

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

Surface = Literal["public", "internal"]


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller."""

    subject: str
    tenant: str
    scopes: frozenset[str]
    kind: Literal["api-key", "jwt", "service", "dev"]

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


DEV_IDENTITY = Identity("dev", DEFAULT_TENANT, ALL_SCOPES, "dev")


def service_of(method: str) -> str:
    """``/attest.lexical.v1.LexicalService/Search`` → ``attest.lexical.v1.LexicalService``."""
    parts = method.split("/")
    return parts[1] if len(parts) > 2 else method


def surface_of(service: str) -> Surface:
    return "public" if service in PUBLIC_SERVICES or service in OPEN_SERVICES else "internal"


def required_scope(method: str) -> str | None:
    """The scope a method needs; None for the open ones (health)."""
    service = service_of(method)
    if service in OPEN_SERVICES:
        return None
    if service in PUBLIC_SERVICES:
        return PUBLIC_SERVICES[service]
    if service.startswith(_REFLECTION_PREFIX):
        return "admin"
    return "internal"


def hash_key(key: str) -> str:
    """What the keys file stores for ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    """A fresh random API key (256 bits)."""
    return "atk_" + secrets.token_urlsafe(32)


def valid_tenant(value: object) -> str | None:
    return value if isinstance(value, str) and _TENANT.fullmatch(value) else None


def _scopes(value: object) -> frozenset[str]:
    if isinstance(value, str):
        items = value.split()
    elif isinstance(value, list | tuple):
        items = [v for v in value if isinstance(v, str)]
    else:
        items = []
    return frozenset(items) & SCOPES


T = TypeVar("T")


class WatchedFile(Generic[T]):
    """A file parsed on first use and again whenever its mtime or size changes.

    A change that does not parse keeps the previous content (and logs why):
    a half-written secret must not lock every caller out. The file is looked
    at no more often than every ``check_seconds``.
    """

    def __init__(self, path: Path, parse: Callable[[bytes], T], check_seconds: float) -> None:
        self._path = path
        self._parse = parse
        self._check_seconds = check_seconds
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._value: T | None = None

    def get(self) -> T:
        now = time.monotonic()
        if self._value is not None and now - self._checked < self._check_seconds:
            return self._value
        self._checked = now
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                value = self._parse(self._path.read_bytes())
                self._value, self._stamp = value, stamp
                log.info("loaded %s", self._path)
        except (OSError, ValueError) as exc:
            if self._value is None:
                raise Unauthenticated("credentials cannot be checked now") from exc
            log.error("keeping the previous %s: %s", self._path, exc)
        assert self._value is not None
        return self._value


@dataclass(frozen=True, slots=True)
class _Key:
    key_id: str
    tenant: str
    scopes: frozenset[str]
    revoked: bool


def parse_keys_file(raw: bytes) -> dict[str, _Key]:
    """The keys file (YAML or JSON) by SHA-256; raises ValueError on any bad entry."""
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"not YAML or JSON: {exc}") from exc
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("expected a mapping with a `keys` list")
    keys: dict[str, _Key] = {}
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"keys[{n}] is not a mapping")
        digest = str(entry.get("sha256", "")).lower()
        if not _SHA256.fullmatch(digest):
            raise ValueError(f"keys[{n}].sha256 is not 64 hex digits")
        tenant = valid_tenant(entry.get("tenant"))
        if tenant is None:
            raise ValueError(f"keys[{n}].tenant is missing or not [A-Za-z0-9._-]{{1,64}}")
        scopes = entry.get("scopes")
        if not isinstance(scopes, list) or not set(scopes) <= SCOPES:
            raise ValueError(f"keys[{n}].scopes must be a list of {sorted(SCOPES)}")
        keys[digest] = _Key(
            key_id=str(entry.get("id") or digest[:12]),
            tenant=tenant,
            scopes=frozenset(scopes),
            revoked=bool(entry.get("revoked", False)),
        )
    return keys


def _parse_jwks(raw: bytes) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, jwt.PyJWKSetError, jwt.InvalidKeyError) as exc:
        raise ValueError(f"not a usable JWKS: {exc}") from exc


class Authenticator:
    """Turns a call's credential into an ``Identity`` (or raises Unauthenticated)."""

    def __init__(self, settings: AuthSettings) -> None:
        self._settings = settings
        self._keys = (
            WatchedFile(settings.keys_file, parse_keys_file, settings.reload_check_seconds)
            if settings.keys_file is not None
            else None
        )
        self._service_keys = frozenset(h.lower() for h in settings.service_key_sha256)
        self._jwks_file = (
            WatchedFile(settings.jwks_file, _parse_jwks, settings.reload_check_seconds)
            if settings.jwks_file is not None
            else None
        )
        self._jwks_client = (
            jwt.PyJWKClient(
                settings.jwks_url,
                lifespan=settings.jwks_cache_seconds,
                timeout=5,
                cooldown_duration=10,
            )
            if settings.jwks_url is not None
            else None
        )

    def check(self) -> None:
        """Load every configured file now, so that a bad mount fails at start-up."""
        try:
            if self._keys is not None:
                self._keys.get()
            if self._jwks_file is not None:
                self._jwks_file.get()
        except Unauthenticated as exc:
            raise ValueError(f"authentication files cannot be loaded: {exc.__cause__}") from exc

    async def identify(
        self, metadata: Mapping[str, Any], peer_names: list[str] | None = None
    ) -> Identity:
        """The caller of a call with ``metadata``; ``peer_names`` are the names of a
        client certificate the listener verified (mTLS), if any."""
        credential = _credential(metadata)
        if credential is None:
            if peer_names:
                return Identity(
                    f"cert:{peer_names[0]}", DEFAULT_TENANT, frozenset({"internal"}), "service"
                )
            raise Unauthenticated("no credential: send `authorization: Bearer <API key or JWT>`")
        if credential.count(".") == 2:
            return await self._jwt(credential)
        return self._api_key(credential)

    def _api_key(self, key: str) -> Identity:
        digest = hash_key(key)
        if digest in self._service_keys:
            return Identity("service", DEFAULT_TENANT, frozenset({"internal"}), "service")
        entry = self._keys.get().get(digest) if self._keys is not None else None
        if entry is None:
            raise Unauthenticated("unknown API key")
        if entry.revoked:
            raise Unauthenticated("revoked API key")
        return Identity(f"key:{entry.key_id}", entry.tenant, entry.scopes, "api-key")

    async def _jwt(self, token: str) -> Identity:
        s = self._settings
        try:
            if self._jwks_client is not None:
                # May fetch the JWKS over the network: never on the event loop.
                client = self._jwks_client
                key: Any = await asyncio.to_thread(client.get_signing_key_from_jwt, token)
            elif self._jwks_file is not None:
                key = _key_from_set(self._jwks_file.get(), token)
            else:
                raise Unauthenticated("this server accepts no JWTs")
            claims = jwt.decode(
                token,
                key=key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise Unauthenticated("token is for another audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise Unauthenticated("token is from another issuer") from exc
        except (jwt.PyJWTError, ValueError) as exc:
            raise Unauthenticated("invalid token") from exc
        tenant = valid_tenant(claims.get(s.tenant_claim))
        if tenant is None:
            raise Unauthenticated(f"token has no valid `{s.tenant_claim}` claim")
        scopes = _scopes(claims.get(s.scope_claim, claims.get("scp")))
        return Identity(f"jwt:{claims.get('sub', '?')}", tenant, scopes, "jwt")


def _key_from_set(keys: jwt.PyJWKSet, token: str) -> Any:
    kid = jwt.get_unverified_header(token).get("kid")
    if kid is None:
        if len(keys.keys) != 1:
            raise Unauthenticated("token names no key (kid) and the JWKS has several")
        return keys.keys[0]
    try:
        return keys[kid]
    except KeyError as exc:
        raise Unauthenticated("token signed by an unknown key") from exc


CREDENTIAL_HEADERS = (AUTHORIZATION_KEY, API_KEY_KEY)


def check_one_credential(pairs: Iterable[tuple[str, Any]]) -> None:
    """Refuse a call that carries more than one credential header.

    Metadata read as a mapping keeps the last of repeated headers, so with two
    the call would be authenticated by whichever came last; no client means
    to send two, and a proxy that adds one beside the caller's must not
    decide who the caller is. Needs the call's raw (name, value) pairs.
    """
    names = [name for name, _ in pairs if name in CREDENTIAL_HEADERS]
    if len(names) > 1:
        raise Unauthenticated(
            f"more than one credential header ({', '.join(names)}): which one counts would be "
            "ambiguous, so the call is refused; send exactly one, "
            "`authorization: Bearer <API key or JWT>`"
        )


def _credential(metadata: Mapping[str, Any]) -> str | None:
    value = metadata.get(AUTHORIZATION_KEY)
    if isinstance(value, str) and value:
        scheme, _, rest = value.strip().partition(" ")
        if scheme.lower() not in ("bearer", "apikey") or not rest.strip():
            raise Unauthenticated("authorization must be `Bearer <API key or JWT>`")
        return rest.strip()
    key = metadata.get(API_KEY_KEY)
    return key.strip() if isinstance(key, str) and key.strip() else None


def authorize(identity: Identity, method: str) -> None:
    """Raise PermissionDenied unless ``identity`` may call ``method``."""
    scope = required_scope(method)
    if scope is not None and not identity.allows(scope):
        raise PermissionDenied(f"{service_of(method)} needs the `{scope}` scope")


def tenant_metadata(tenant: str) -> tuple[tuple[str, str]]:
    """Call metadata by which a service names the tenant it acts for downstream.

    Sent by the caller with the tenant it was handed (from the request's
    identity, a job record, a Celery message): a store written for one tenant
    must be read for the same one. A call made while serving a request that
    names none carries the request's tenant (``attest.core.channels``); outside
    a request nothing is implied, and the callee acts for ``default``.
    """
    return ((TENANT_KEY, tenant),)


def tenant_for(identity: Identity, metadata: Mapping[str, Any]) -> str:
    """The tenant a call acts for: the credential's, or, for a service identity,
    the one the calling service names."""
    if identity.allows("internal") and identity.kind != "dev":
        value = metadata.get(TENANT_KEY)
        if value is None:
            return identity.tenant
        named = valid_tenant(value)
        if named is None:
            # Acting for the credential's own tenant instead would read and
            # write another tenant's data without a word.
            raise InvalidArgument(
                f"{TENANT_KEY} {str(value)[:80]!r} is not a tenant id (a letter or digit, "
                "then up to 63 letters, digits, '.', '_' or '-')"
            )
        return named
    return identity.tenant
