"""Who a request belongs to, and which radix namespace its KV lives in.

The namespace is derived here, in the server, from the API key the request authenticated with (and its
optional ``cache_salt``); it is never taken from the client. Requests in different namespaces never share a
cached prefix, so a cached prefix can only answer faster for the tenant (and salt) that cached it.

``--cache-sharing``:
  * ``global``: every tenant shares one namespace; a ``cache_salt`` splits off a namespace of its tenant's own.
  * ``tenant`` (the default with keys): one namespace per tenant; a salt splits its tenant's further.
  * ``salt``: only requests of one tenant with the same salt share; a request without a salt shares nothing.
A salt is always scoped by its tenant, so two tenants sending the same salt never meet.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

SHARING = ("global", "tenant", "salt")
TENANT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_SALT_CHARS = 256


def load_api_keys(path: str) -> dict[str, str]:
    """``KEY TENANT`` per line (blank lines and ``#`` comments skipped) -> {key: tenant}."""
    keys: dict[str, str] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"api_keys_file: cannot read {path!r}: {e.strerror}") from e
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"api_keys_file: line {n} must be 'KEY TENANT', got {len(parts)} fields")
        key, tenant = parts
        if len(key) < 8:
            raise ValueError(f"api_keys_file: line {n}: a key must be at least 8 characters")
        if not TENANT_NAME.fullmatch(tenant) or tenant == "default":
            raise ValueError(f"api_keys_file: line {n}: tenant names are 1-64 of A-Z a-z 0-9 _ . - "
                             "('default' is reserved for requests without a tenant)")
        if key in keys:
            raise ValueError(f"api_keys_file: line {n}: the key is listed twice")
        keys[key] = tenant
    if not keys:
        raise ValueError(f"api_keys_file: {path!r} lists no keys")
    return keys


@dataclass(frozen=True)
class Tenancy:
    """``keys``: {api key: tenant}; empty: no authentication, one anonymous tenant (None)."""

    keys: dict[str, str] = field(default_factory=dict)
    sharing: str = "global"

    def __post_init__(self) -> None:
        if self.sharing not in SHARING:
            raise ValueError(f"cache_sharing must be one of {SHARING}, got {self.sharing!r}")

    @classmethod
    def from_config(cls, api_key: str | None, api_keys_file: str | None, sharing: str | None) -> Tenancy:
        if api_key and api_keys_file:
            raise ValueError("api_key: give --api-key or --api-keys-file, not both")
        keys = load_api_keys(api_keys_file) if api_keys_file else {api_key: "default"} if api_key else {}
        return cls(keys, sharing or ("tenant" if api_keys_file else "global"))

    @property
    def required(self) -> bool:
        return bool(self.keys)

    @property
    def several(self) -> bool:
        """More than one tenant: the dashboard shows each only its own."""
        return len(set(self.keys.values())) > 1

    def authenticate(self, authorization: str) -> str | None:
        """The tenant whose key the header carries, or None. Compares against every key in constant time
        per key, so the time taken does not say which key (or how much of one) matched."""
        given = authorization.removeprefix("Bearer ").strip().encode()
        found = None
        for key, tenant in self.keys.items():
            if hmac.compare_digest(given, key.encode()):
                found = tenant
        return found

    def namespace(self, tenant: str | None, salt: str | None, rid: str) -> str | None:
        """The radix namespace of a request (``rid``: its parent rid, shared by its n samples)."""
        if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= MAX_SALT_CHARS):
            raise ValueError(f"cache_salt: must be a string of 1 to {MAX_SALT_CHARS} characters")
        base = tenant or "default"
        if salt is not None:  # hashed: a salt never shows on the dashboard or in logs
            return f"{base}/salt:{hashlib.sha256(salt.encode()).hexdigest()[:16]}"
        if self.sharing == "salt":
            return f"{base}/request:{rid}"
        if self.sharing == "tenant" and tenant is not None:
            return tenant
        return None

    def owns(self, tenant: str | None, namespace: str) -> bool:
        """Whether ``tenant`` may see ``namespace`` (as the dashboard names it) on the dashboard. With one
        tenant, everything; with several, only its own namespaces (the shared "default" of ``global``
        holds every tenant's prompts, so none of them sees it)."""
        if not self.several:
            return True
        return namespace == tenant or namespace.startswith(f"{tenant}/")
