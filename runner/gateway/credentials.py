"""Per-job gateway credentials: what an agent shows the admission gateway.

The job runner mints one credential for each agent it starts
(:func:`mint_credential`) and hands it over with the gateway's URL; the agent sends it
as ``Authorization: Bearer <secret>``, as it would an OpenAI API key. The credential
names the grant it stands for: the eval-run (so its desk and bound), the job and its
attempt, the upstream endpoint and the request timeouts. Only the SHA-256 of the
secret is stored, as the key ``slotrunner:gateway:credential:{digest}``
(``runner/core/keys.py``) holding the grant's JSON, with the job's deadline as its
TTL; the secret itself is never written anywhere. A credential stops working when
its TTL runs out, when it is revoked (:func:`revoke_credential`, at the job's end),
and for an attempt another attempt of its job has superseded
(docs/architecture.md §Gateway).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

import redis
import redis.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runner.core import keys

SECRET_PREFIX = "srgw-"  # recognisable in a leaked log, like a provider's key prefix
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_ADMISSION_WAIT_S = 30.0


class Grant(BaseModel):
    """What one credential lets its holder do: requests of one job, attempt and run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    eval_run: str = Field(pattern=r"^[^\s{}]{1,200}$")  # as the desk requires
    job_id: str = Field(min_length=1, max_length=200)
    attempt: int = Field(ge=1)
    upstream: str = Field(min_length=1, max_length=2000)  # an API base, e.g. http://h:p/v1
    bound: int = Field(ge=1)  # the eval-run's admission bound
    # The name of the *gateway's* environment variable holding the upstream's API key;
    # the agent never sees the key, nor sends one.
    api_key_env: str | None = Field(default=None, min_length=1, max_length=200)
    request_timeout_s: float = Field(default=DEFAULT_REQUEST_TIMEOUT_S, gt=0, le=86_400)
    admission_wait_s: float = Field(default=DEFAULT_ADMISSION_WAIT_S, ge=0, le=86_400)

    @field_validator("upstream")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")


@dataclass(frozen=True)
class Credential:
    """A minted credential: the secret (shown once) and where to send it."""

    secret: str
    gateway_url: str

    def __repr__(self) -> str:  # never the secret in a log or a traceback
        return f"Credential(gateway_url={self.gateway_url!r})"


@dataclass(frozen=True)
class Caller:
    """A request's authenticated holder: the grant, and how long its credential lives."""

    grant: Grant
    ttl_s: float
    superseded_by: int | None  # the job's current attempt, when it is past the grant's


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint_credential(
    client: redis.Redis,
    *,
    gateway_url: str,
    ttl_s: float,
    eval_run: str,
    job_id: str,
    attempt: int,
    upstream: str,
    bound: int,
    api_key_env: str | None = None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    admission_wait_s: float = DEFAULT_ADMISSION_WAIT_S,
) -> Credential:
    """A fresh credential for one agent of ``job_id``'s ``attempt``, valid ``ttl_s`` (the
    job's deadline): its requests hold leases of ``eval_run``'s desk of ``bound`` and go to
    ``upstream``. ``gateway_url`` is the gateway's API base (``Settings.gateway_url``).
    ValueError (pydantic's) on a value the gateway could not use."""
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
    grant = Grant(
        eval_run=eval_run,
        job_id=job_id,
        attempt=attempt,
        upstream=upstream,
        bound=bound,
        api_key_env=api_key_env,
        request_timeout_s=request_timeout_s,
        admission_wait_s=admission_wait_s,
    )
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    client.set(
        keys.gateway_credential(digest(secret)),
        grant.model_dump_json(),
        px=math.ceil(ttl_s * 1000),
    )
    return Credential(secret, gateway_url.rstrip("/"))


def revoke_credential(client: redis.Redis, secret: str) -> bool:
    """End a credential now (the job is over); True when it still existed."""
    return bool(client.delete(keys.gateway_credential(digest(secret))))


class Authenticator:
    """The caller a secret stands for, or None when it is unknown, expired or revoked
    (or its stored grant is unreadable: a credential that cannot be judged is refused).

    One Redis round trip, on the gateway's event loop (``redis.asyncio``), for a
    credential seen before: the grant stored under a digest never changes (the secret
    is random and minted once), so its parsed form is kept here, by digest, with the
    JSON it was parsed from. Each call still reads the stored JSON, its TTL and the
    job's attempt in one pipeline, and the kept grant is used only when the JSON read
    is the JSON kept, so a revoked or expired credential is refused on the very next
    call, as before. At most ``max_kept`` grants are kept, the oldest dropped first.
    """

    def __init__(self, client: redis.asyncio.Redis, max_kept: int = 4096) -> None:
        self._client = client
        self._max_kept = max_kept
        self._kept: dict[str, tuple[str | bytes, Grant]] = {}

    async def __call__(self, secret: str) -> Caller | None:
        if not secret.startswith(SECRET_PREFIX):
            return None
        hashed = digest(secret)
        key = keys.gateway_credential(hashed)
        kept = self._kept.get(hashed)
        pipe = self._client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        if kept is not None:
            pipe.get(keys.job_attempt(kept[1].job_id))
        replies = await pipe.execute()
        raw, ttl_ms = replies[0], replies[1]
        if raw is None or ttl_ms is None or int(ttl_ms) <= 0:
            self._kept.pop(hashed, None)
            return None
        if kept is not None and kept[0] == raw:
            grant, current = kept[1], replies[2]
        else:
            try:
                grant = Grant.model_validate_json(raw)
            except ValidationError:
                return None
            self._keep(hashed, raw, grant)
            current = await self._client.get(keys.job_attempt(grant.job_id))
        superseded_by = None
        if current is not None and int(current) > grant.attempt:
            superseded_by = int(current)
        return Caller(grant, int(ttl_ms) / 1000, superseded_by)

    def _keep(self, hashed: str, raw: str | bytes, grant: Grant) -> None:
        while len(self._kept) >= self._max_kept:
            del self._kept[next(iter(self._kept))]
        self._kept[hashed] = (raw, grant)
