"""Authentication for the SLO gateway, as Trino does it: password files, JWTs, TLS only.

Clients authenticate the way they authenticate to a Trino coordinator:

* **Password file** (Trino's ``password-authenticator.name=file``): HTTP Basic
  (``trino.auth.BasicAuthentication``) checked against ``user:hash`` lines,
  bcrypt (``$2y$``/``$2b$``/``$2a$``, cost >= 8) or PBKDF2 (``iterations:salt:hash``,
  hex, >= 1000 iterations), the file format and limits of Trino's
  ``EncryptionUtil``. ``htpasswd -B -C 10 FILE USER`` writes such lines, and so
  does :func:`set_password`.
* **JWT** (Trino's ``http-server.authentication.type=JWT``): ``Authorization:
  Bearer`` (``trino.auth.JWTAuthentication``) signed with the key in
  ``key_file``: a PEM public key (RS*/ES*/EdDSA) or a base64-encoded HMAC secret
  (HS*), as Trino's ``jwt.key-file`` reads it. ``issuer``, ``audience`` and
  ``principal_field`` are ``jwt.required-issuer``, ``jwt.required-audience``
  and ``jwt.principal-field`` (default ``sub``).

Credentials travel only over TLS: with authentication on, a request over plain
HTTP is refused (403, Trino's "Authentication over HTTP is not enabled") unless
``allow_insecure`` says a TLS terminator or mesh sidecar in front encrypts the
hop (the Trino client's ``allow_insecure_auth``). Unlike Trino's
``allow-insecure-over-http`` (which then accepts a user name with no password
over HTTP), the gateway never accepts an unauthenticated user once
authentication is on. With authentication off, as Trino's insecure
authenticator does, the user is ``X-Trino-User`` and a password is refused.

A principal acts as itself. ``X-Trino-User`` naming someone else is
impersonation; only an admin (``admin_users``) may impersonate. A principal
reads its own queries; an admin reads every query (:func:`may_read`).

The admin API (``/v1/gateway/backends`` and every write under
``/v1/gateway``) always needs an admin, one rule per mode: with
authentication on, a user in ``admin_users``; with it off, the holder of the
admin token (:func:`admin_token`), a random secret the gateway writes at start
into ``LOG_DIR/admin.token`` (mode 0600, readable by its owner only) and a
client sends as the ``X-Sloctl-Admin-Token`` header. A backend added through
the API must sit at an address of the operator's allow-list
(:func:`check_backend_url`).

:meth:`GatewayAuth.authenticate` may run bcrypt (tens of milliseconds of CPU):
call it from a thread (a plain ``def`` FastAPI dependency runs in the thread
pool), never on the event loop.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloctl.core.errors import SloctlError

__all__ = [
    "ADMIN_ROLE",
    "ADMIN_TOKEN_ENV",
    "ADMIN_TOKEN_FILE",
    "ADMIN_TOKEN_HEADER",
    "AdminToken",
    "AuthError",
    "GatewayAuth",
    "JwtVerifier",
    "PasswordFile",
    "Principal",
    "admin_token",
    "allowed_origins",
    "check_admin_token",
    "check_backend_url",
    "hash_password",
    "may_read",
    "read_admin_token",
    "self_signed_cert",
    "set_password",
    "url_origin",
]

log = logging.getLogger(__name__)

ADMIN_ROLE = "admin"
REALM = "sloctl"
BCRYPT_MIN_COST = 8  # Trino's EncryptionUtil.BCRYPT_MIN_COST
PBKDF2_MIN_ITERATIONS = 1000  # Trino's EncryptionUtil.PBKDF2_MIN_ITERATIONS
BCRYPT_MAX_PASSWORD_BYTES = 72  # bcrypt reads no further; the bcrypt package refuses longer ones
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
# An unknown user is checked against this hash (of a random password nobody knows), so that
# "no such user" takes as long as "wrong password" and the timing names no users.
_DUMMY_HASH = b"$2b$10$SMpKHWrQ5GiJlEBRc43KVuyOqrCOdzL9M.F4EFhlfdh/ozvQMunuq"


class AuthError(SloctlError, PermissionError):
    """A request the gateway refuses for who sent it, or how.

    Attributes:
        status: the HTTP status to answer: 401 (no or bad credentials), 403 (credentials
            over plain HTTP, or impersonation refused), 400 (no user at all with
            authentication off), 500 (the password file cannot be read).
        message: what to tell the client; never a secret, never a hash.
        www_authenticate: the ``WWW-Authenticate`` header value for a 401, else None.
        field: the request field at fault, for a 400 (``x-trino-user``), else None.
    """

    def __init__(self, message: str, *, status: int = 401, www_authenticate: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.www_authenticate = www_authenticate
        self.field = field

    def headers(self) -> dict[str, str]:
        """The response headers the refusal carries (``WWW-Authenticate`` on a 401)."""
        return {"WWW-Authenticate": self.www_authenticate} if self.www_authenticate else {}


@dataclass(frozen=True)
class Principal:
    """Who a request acts as.

    Attributes:
        user: the user the request acts as (the session user).
        roles: ``{"admin"}`` for the users in ``admin_users``, else empty.
        impersonated_by: the authenticated admin who asked to act as ``user``, else None.
    """

    user: str
    roles: frozenset[str] = frozenset()
    impersonated_by: str | None = None

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles


def may_read(principal: Principal, owner: str) -> bool:
    """Whether ``principal`` may read what ``owner`` submitted (a query, its record): its owner or an admin."""
    return principal.user == owner or principal.is_admin


# ---------------------------------------------------------------------------------------------- password file


@dataclass(frozen=True)
class _Hashed:
    """One user's stored hash; ``kind`` is ``bcrypt`` or ``pbkdf2``."""

    kind: str
    value: str

    def matches(self, password: str) -> bool:
        secret = password.encode("utf-8")
        if self.kind == "bcrypt":
            import bcrypt

            if len(secret) > BCRYPT_MAX_PASSWORD_BYTES:
                return False  # bcrypt cannot have hashed it; Trino's bcrypt refuses such passwords too
            return bcrypt.checkpw(secret, self.value.encode("ascii"))
        iterations, salt, digest = _parse_pbkdf2(self.value)
        # Trino's EncryptionUtil: PBKDF2WithHmacSHA1, key length = the stored hash's length
        derived = hashlib.pbkdf2_hmac("sha1", secret, salt, iterations, dklen=len(digest))
        return hmac.compare_digest(derived, digest)


def _parse_pbkdf2(value: str) -> tuple[int, bytes, bytes]:
    parts = value.split(":")
    if len(parts) != 3:
        raise ValueError("a PBKDF2 hash must be iterations:salt:hash (hex)")
    try:
        return int(parts[0]), bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        raise ValueError("a PBKDF2 hash must be iterations:salt:hash, the salt and hash in hex") from None


def _parse_hash(value: str) -> _Hashed:
    """One stored hash, checked as Trino's ``EncryptionUtil.getHashingAlgorithm`` checks it."""
    if value.startswith(("$2a$", "$2b$", "$2y$")):
        m = _BCRYPT.match(value)
        if m is None:
            raise ValueError("the bcrypt hash is malformed (expected $2y$NN$ and 53 characters)")
        if int(m.group(1)) < BCRYPT_MIN_COST:
            raise ValueError(f"the bcrypt cost must be >= {BCRYPT_MIN_COST}, got {int(m.group(1))}")
        return _Hashed("bcrypt", value)
    if ":" in value:
        iterations, salt, digest = _parse_pbkdf2(value)
        if iterations < PBKDF2_MIN_ITERATIONS:
            raise ValueError(f"the PBKDF2 iterations must be >= {PBKDF2_MIN_ITERATIONS}, got {iterations}")
        if not salt or not digest:
            raise ValueError("the PBKDF2 salt and hash must not be empty")
        return _Hashed("pbkdf2", value)
    raise ValueError("the password hashing algorithm cannot be determined (expected bcrypt $2y$... or PBKDF2)")


def _parse_lines(text: str, path: Path) -> dict[str, _Hashed]:
    """``user:hash`` lines as Trino's ``PasswordStore`` reads them: blank lines skipped, no duplicates."""
    users: dict[str, _Hashed] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        user, sep, hashed = line.partition(":")
        try:
            if not sep or not user or not hashed:
                raise ValueError("expected user:hash")
            if user in users:
                raise ValueError(f"duplicate user {user!r}")
            users[user] = _parse_hash(hashed)
        except ValueError as e:
            raise ValueError(f"Line {number} of the password file {str(path)!r} is invalid: {e}.") from None
    return users


def _stamp(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev


class _PasswordState:
    """The mutable part of a :class:`PasswordFile`: its users, their file's stamp, the cache."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stamp: tuple[int, int, int, int] | None = None
        self.users: dict[str, _Hashed] = {}
        self.generation = 0
        self.cache: dict[bytes, float] = {}  # key -> monotonic expiry; insertion order = age
        self.cache_key = secrets.token_bytes(32)


@dataclass(frozen=True)
class PasswordFile:
    """A Trino password file (``user:hash`` lines), reloaded when it changes.

    Successful checks are cached for ``cache_ttl_s`` (at most ``cache_max_size``
    entries, Trino's ``file.auth-token-cache.max-size``): bcrypt costs tens of
    milliseconds of CPU by design, and the Trino client sends its Basic header
    on every request (the ``POST`` and every ``nextUri`` poll), so without a
    cache a query would pay it many times. The cache is keyed by
    HMAC-SHA256(a random per-process key, user NUL password), so it holds
    neither passwords nor anything useful outside this process. Failures are
    never cached (each wrong guess pays the full bcrypt cost), and the whole
    cache is dropped when the file changes, so a changed or removed password
    stops working at the next request.

    The file is stat'ed on every check and re-read when its mtime, size or
    inode changes (Trino re-reads it every ``file.refresh-period``). A file
    that no longer parses fails closed: every check raises until it is fixed.

    Build it with :meth:`load`, which reads the file at once so that a bad file
    stops the gateway at start.
    """

    path: Path
    cache_ttl_s: float = 60.0
    cache_max_size: int = 1000
    _state: _PasswordState = field(default_factory=_PasswordState, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not self.cache_ttl_s >= 0:
            raise ValueError(f"The 'cache_ttl_s' parameter of PasswordFile must be >= 0, got {self.cache_ttl_s!r}.")
        if not isinstance(self.cache_max_size, int) or self.cache_max_size < 0:
            raise ValueError(
                f"The 'cache_max_size' parameter of PasswordFile must be an int >= 0, got {self.cache_max_size!r}.")

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, cache_ttl_s: float = 60.0,
             cache_max_size: int = 1000) -> PasswordFile:
        """Read and check the password file at ``path``.

        Raises:
            ValueError: the file cannot be read, or a line is invalid (the message names the line).
        """
        pf = cls(Path(path), cache_ttl_s=cache_ttl_s, cache_max_size=cache_max_size)
        pf._refresh()
        return pf

    @property
    def users(self) -> frozenset[str]:
        """The users the file names now (re-read if it changed)."""
        self._refresh()
        return frozenset(self._state.users)

    def verify(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s password. An unknown user is simply False.

        Raises:
            ValueError: the file has become unreadable or invalid (fail closed).
        """
        state = self._state
        self._refresh()
        key = hmac.new(state.cache_key, user.encode("utf-8") + b"\0" + password.encode("utf-8"),
                       hashlib.sha256).digest()
        now = time.monotonic()
        with state.lock:
            expiry = state.cache.get(key)
            if expiry is not None:
                if expiry > now:
                    return True
                del state.cache[key]
            hashed, generation = state.users.get(user), state.generation
        if hashed is None:
            import bcrypt

            bcrypt.checkpw(b"not the password", _DUMMY_HASH)  # as slow as a wrong password
            return False
        ok = hashed.matches(password)  # outside the lock: bcrypt is slow
        if ok and self.cache_ttl_s > 0 and self.cache_max_size > 0:
            with state.lock:
                if state.generation == generation:  # not a success against a hash since replaced
                    state.cache[key] = now + self.cache_ttl_s
                    while len(state.cache) > self.cache_max_size:
                        del state.cache[next(iter(state.cache))]
        return ok

    def _refresh(self) -> None:
        state = self._state
        try:
            stamp = _stamp(self.path)
        except OSError as e:
            raise ValueError(f"The password file {str(self.path)!r} cannot be read: {e.strerror}.") from None
        if stamp == state.stamp:
            return
        with state.lock:
            if stamp == state.stamp:
                return
            try:  # stat'ed before the read: a change after it shows as a new stamp at the next check
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"The password file {str(self.path)!r} cannot be read: {e}.") from None
            users = _parse_lines(text, self.path)
            state.users, state.stamp = users, stamp
            state.generation += 1
            state.cache.clear()
        log.info("password file %s loaded: %d users", self.path, len(users))


def hash_password(password: str, rounds: int = 10) -> str:
    """A bcrypt hash of ``password`` for a password file (``$2y$``, as Trino's docs and htpasswd write it).

    Args:
        password: the password; at most 72 bytes in UTF-8 (bcrypt reads no further).
        rounds: the bcrypt cost, log2 of the work; Trino requires >= 8.

    Raises:
        ValueError: an empty or too long password, or a cost outside 8..31.
    """
    import bcrypt

    secret = password.encode("utf-8")
    if not secret:
        raise ValueError("The 'password' must not be empty.")
    if len(secret) > BCRYPT_MAX_PASSWORD_BYTES:
        raise ValueError(f"The 'password' must be at most {BCRYPT_MAX_PASSWORD_BYTES} bytes in UTF-8 "
                         f"(bcrypt reads no further), got {len(secret)}.")
    if not isinstance(rounds, int) or not BCRYPT_MIN_COST <= rounds <= 31:
        raise ValueError(f"The 'rounds' parameter of hash_password must be an int in {BCRYPT_MIN_COST}..31, "
                         f"got {rounds!r}.")
    hashed = bcrypt.hashpw(secret, bcrypt.gensalt(rounds)).decode("ascii")
    return "$2y$" + hashed[4:]  # $2y$ and $2b$ are the same algorithm; $2y$ is what Trino documents


def set_password(path: str | os.PathLike[str], user: str, password: str, *, rounds: int = 10) -> None:
    """Add ``user`` to the password file at ``path``, or change its password (``sloctl gateway passwd``).

    The file is created if missing. It is rewritten whole, atomically (a
    temporary file in the same folder, then a rename), with mode 0600; other
    lines stay as they are. A running gateway picks the change up at its next
    request. Two concurrent runs on one file may lose one of the two changes.

    Raises:
        ValueError: a user name that is empty or holds ``:`` or whitespace; a bad password
            (see :func:`hash_password`); an existing file that is not a valid password file.
    """
    if not user or ":" in user or any(c.isspace() for c in user):
        raise ValueError(f"The 'user' must be non-empty, without ':' or whitespace, got {user!r}.")
    line = f"{user}:{hash_password(password, rounds)}"
    target = Path(path)
    lines: list[str] = []
    if target.exists():
        text = target.read_text(encoding="utf-8")
        _parse_lines(text, target)  # refuse to rewrite a file the gateway would refuse anyway
        lines = text.splitlines()
    replaced = False
    for i, old in enumerate(lines):
        if old.strip().partition(":")[0] == user:
            lines[i], replaced = line, True
    if not replaced:
        lines.append(line)
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------------------------------------- JWT

_HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}  # RFC 7518 3.2: a key as long as the hash
_KEY_KINDS = {
    "hmac": ("HS256", "HS384", "HS512"),
    "rsa": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "ec": ("ES256", "ES384", "ES512"),
    "okp": ("EdDSA",),
}
_EC_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


def _load_jwt_key(path: Path) -> tuple[str, Any, tuple[str, ...]]:
    """(kind, key, algorithms the key can check) from a Trino ``jwt.key-file``.

    A PEM public key or certificate, or else a base64-encoded HMAC secret.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} cannot be read: {e.strerror}.") from None
    if b"-----BEGIN" in data:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        if b"PRIVATE KEY-----" in data:
            raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} holds a private key; "
                             "give the public key (the gateway only verifies).")
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                key: Any = x509.load_pem_x509_certificate(data).public_key()
            else:
                key = load_pem_public_key(data)
        except ValueError as e:
            raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} is not a PEM public key: {e}.") from None
        if isinstance(key, rsa.RSAPublicKey):
            return "rsa", key, _KEY_KINDS["rsa"]
        if isinstance(key, ec.EllipticCurvePublicKey):
            alg = _EC_CURVES.get(key.curve.name)
            if alg is None:
                raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} is an EC key on curve "
                                 f"{key.curve.name}; JWTs use P-256, P-384 or P-521.")
            return "ec", key, (alg,)
        if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            return "okp", key, _KEY_KINDS["okp"]
        raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} holds a {type(key).__name__}, "
                         "not an RSA, EC or Ed25519 public key.")
    try:
        secret = base64.b64decode(b"".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"The 'key_file' of JwtVerifier {str(path)!r} must hold a PEM public key or a "
                         "base64-encoded HMAC secret (as Trino's jwt.key-file).") from None
    algs = tuple(a for a, n in _HMAC_MIN_BYTES.items() if len(secret) >= n)
    if not algs:
        raise ValueError(f"The HMAC secret in the 'key_file' of JwtVerifier {str(path)!r} must be >= 32 bytes "
                         f"(256 bits, for HS256), got {len(secret)}.")
    return "hmac", secret, algs


_JWT_REASONS = {
    "ExpiredSignatureError": "The token has expired.",
    "ImmatureSignatureError": "The token is not valid yet (nbf).",
    "InvalidIssuerError": "The token's issuer (iss) is not the one this gateway requires.",
    "InvalidAudienceError": "The token's audience (aud) is not the one this gateway requires.",
    "InvalidSignatureError": "The token's signature does not verify.",
    "InvalidAlgorithmError": "The token is signed with an algorithm this gateway does not accept.",
    "InvalidIssuedAtError": "The token's issue time (iat) is not a number.",
    "InvalidSubjectError": "The token's subject (sub) is not a string.",
    "DecodeError": "The token is malformed.",
}


@dataclass(frozen=True)
class JwtVerifier:
    """Checks JWTs as Trino's JWT authenticator does, with the key in ``key_file``.

    The key file holds a PEM public key (or certificate): RSA (RS256, RS384,
    RS512, PS*), EC (the ES* of its curve) or Ed25519 (EdDSA); or else a
    base64-encoded HMAC secret of >= 32 bytes (HS256, and HS384/HS512 when long
    enough). Which it is comes from its content. A token's ``alg`` must be one
    ``algorithms`` names (default: every one the key can check), so a token
    cannot choose HMAC over a public key.

    Attributes:
        key_file: Trino's ``http-server.authentication.jwt.key-file`` (a path; no JWKS URL).
        issuer: ``jwt.required-issuer``: the ``iss`` every token must carry, or None.
        audience: ``jwt.required-audience``: a value ``aud`` must hold, or None (any ``aud``).
        principal_field: ``jwt.principal-field``: the claim naming the user.
        algorithms: the ``alg`` values accepted; None for all the key can check.
        leeway_s: the clock skew allowed on ``exp`` / ``nbf``.
        require_exp: refuse tokens with no ``exp`` (a token without one never expires).
    """

    key_file: Path
    issuer: str | None = None
    audience: str | None = None
    principal_field: str = "sub"
    algorithms: tuple[str, ...] | None = None
    leeway_s: float = 0.0
    require_exp: bool = True
    _key: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_file", Path(self.key_file))
        for name in ("issuer", "audience"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"The '{name}' parameter of JwtVerifier must be a non-empty string or None, "
                                 f"got {value!r}.")
        if not isinstance(self.principal_field, str) or not self.principal_field:
            raise ValueError(f"The 'principal_field' parameter of JwtVerifier must be a non-empty string, "
                             f"got {self.principal_field!r}.")
        if not self.leeway_s >= 0:
            raise ValueError(f"The 'leeway_s' parameter of JwtVerifier must be >= 0, got {self.leeway_s!r}.")
        kind, key, usable = _load_jwt_key(self.key_file)
        if self.algorithms is None:
            algorithms = usable
        else:
            if isinstance(self.algorithms, str) or not self.algorithms:
                raise ValueError(f"The 'algorithms' parameter of JwtVerifier must be a non-empty tuple of names, "
                                 f"got {self.algorithms!r}.")
            algorithms = tuple(self.algorithms)
            wrong = [a for a in algorithms if a not in usable]
            if wrong:
                raise ValueError(f"The 'algorithms' parameter of JwtVerifier names {wrong}, which the {kind} key in "
                                 f"{str(self.key_file)!r} cannot check; it can check {list(usable)}.")
        object.__setattr__(self, "algorithms", algorithms)
        object.__setattr__(self, "_key", key)

    def verify(self, token: str) -> str:
        """The user a token names (its ``principal_field``), once its signature and claims check out.

        Raises:
            AuthError: 401 with the reason: bad signature, expired, wrong issuer or audience, ...
        """
        import jwt

        challenge = f'Bearer realm="{REALM}", error="invalid_token"'
        options: dict[str, Any] = {"verify_aud": self.audience is not None,
                                   "require": ["exp"] if self.require_exp else []}
        try:
            claims = jwt.decode(token, self._key, algorithms=list(self.algorithms or ()), audience=self.audience,
                                issuer=self.issuer, leeway=self.leeway_s, options=options)
        except jwt.MissingRequiredClaimError as e:
            raise AuthError(f"The token has no '{e.claim}' claim, which this gateway requires.",
                            www_authenticate=challenge) from None
        except jwt.PyJWTError as e:
            reason = next((r for cls in type(e).__mro__ if (r := _JWT_REASONS.get(cls.__name__))),
                          "The token is invalid.")
            raise AuthError(reason, www_authenticate=challenge) from None
        user = claims.get(self.principal_field)
        if not isinstance(user, str) or not user:
            raise AuthError(f"The token's '{self.principal_field}' claim must name the user (a non-empty string).",
                            www_authenticate=challenge)
        return user


# ---------------------------------------------------------------------------------------------- the gateway's door


@dataclass(frozen=True)
class GatewayAuth:
    """How the gateway decides who a request acts as.

    Attributes:
        password_file: checks HTTP Basic credentials, or None.
        jwt: checks Bearer tokens, or None. With neither, authentication is off.
        admin_users: the users with the admin role: they may impersonate and read every query.
        allow_insecure: accept credentials over plain HTTP (a TLS terminator or mesh sidecar in front).
    """

    password_file: PasswordFile | None = None
    jwt: JwtVerifier | None = None
    admin_users: frozenset[str] = frozenset()
    allow_insecure: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.admin_users, str):
            raise ValueError(f"The 'admin_users' parameter of GatewayAuth must be a collection of user names, "
                             f"not one string, got {self.admin_users!r}.")
        admins = frozenset(self.admin_users)
        bad = sorted(repr(u) for u in admins if not isinstance(u, str) or not u)
        if bad:
            raise ValueError(f"The 'admin_users' parameter of GatewayAuth must hold non-empty strings, got {bad}.")
        object.__setattr__(self, "admin_users", admins)

    @classmethod
    def off(cls) -> GatewayAuth:
        """No authentication: the user is whatever ``X-Trino-User`` says (loopback only)."""
        return cls()

    @property
    def enabled(self) -> bool:
        return self.password_file is not None or self.jwt is not None

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401: the schemes this gateway accepts, as Trino lists them."""
        schemes = []
        if self.password_file is not None or not self.enabled:
            schemes.append(f'Basic realm="{REALM}"')
        if self.jwt is not None:
            schemes.append(f'Bearer realm="{REALM}"')
        return ", ".join(schemes)

    def principal(self, user: str, impersonated_by: str | None = None) -> Principal:
        """``user`` as a :class:`Principal`, with the admin role when ``admin_users`` names it."""
        roles = frozenset({ADMIN_ROLE}) if user in self.admin_users else frozenset()
        return Principal(user, roles, impersonated_by)

    def authenticate(self, authorization_header: str | None, *, trino_user: str | None, secure: bool) -> Principal:
        """Who a request acts as.

        Args:
            authorization_header: the ``Authorization`` header, or None.
            trino_user: the ``X-Trino-User`` header, or None.
            secure: whether the request reached the gateway over TLS.

        Raises:
            AuthError: 401 with ``WWW-Authenticate`` (no, malformed or wrong credentials);
                403 (authentication over plain HTTP, or impersonation by a non-admin);
                400 (authentication off and no user named); 500 (the password file broke).
        """
        trino_user = (trino_user or "").strip() or None
        if not self.enabled:
            return self._insecure(authorization_header, trino_user)
        if not secure and not self.allow_insecure:
            raise AuthError("Authentication over HTTP is not enabled: connect with https:// "
                            "(or start the gateway with insecure authentication allowed behind a TLS terminator).",
                            status=403)
        scheme, _, credentials = (authorization_header or "").strip().partition(" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        if not scheme:
            raise AuthError("Authentication is required: send HTTP Basic credentials or a Bearer token "
                            f"({self._accepted()}).", www_authenticate=self.challenge)
        if scheme == "basic" and self.password_file is not None:
            user = self._basic(credentials)
        elif scheme == "bearer" and self.jwt is not None:
            if not credentials:
                raise AuthError("The Authorization header is malformed: 'Bearer' without a token.",
                                www_authenticate=self.challenge)
            user = self.jwt.verify(credentials)
        else:
            raise AuthError(f"The Authorization scheme {scheme!r} is not accepted here; this gateway accepts "
                            f"{self._accepted()}.", www_authenticate=self.challenge)
        if trino_user is None or trino_user == user:
            return self.principal(user)
        if user not in self.admin_users:
            raise AuthError(f"User {user!r} may not act as {trino_user!r} (X-Trino-User): only admin users "
                            "may impersonate.", status=403)
        return self.principal(trino_user, impersonated_by=user)

    def _accepted(self) -> str:
        names = (["Basic"] if self.password_file is not None else []) + (["Bearer"] if self.jwt is not None else [])
        return " or ".join(names)

    def _basic(self, credentials: str) -> str:
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise AuthError("The Authorization header is malformed: Basic credentials must be base64 of "
                            "user:password.", www_authenticate=self.challenge) from None
        user, sep, password = decoded.partition(":")
        if not sep or not user:
            raise AuthError("The Authorization header is malformed: Basic credentials must be base64 of "
                            "user:password.", www_authenticate=self.challenge)
        assert self.password_file is not None
        try:
            ok = self.password_file.verify(user, password)
        except ValueError as e:
            log.error("password authentication is failing closed: %s", e)
            raise AuthError("The gateway cannot check passwords now; its log says why.", status=500) from None
        if not ok:
            raise AuthError("Invalid credentials.", www_authenticate=self.challenge)
        return user

    def _insecure(self, authorization_header: str | None, trino_user: str | None) -> Principal:
        """Trino's insecure authenticator: a user name, never a password."""
        scheme, _, credentials = (authorization_header or "").strip().partition(" ")
        basic_user = None
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                raise AuthError("The Authorization header is malformed: Basic credentials must be base64 of "
                                "user:password.", www_authenticate=self.challenge) from None
            basic_user, _, password = decoded.partition(":")
            if password:
                raise AuthError("Password not allowed: this gateway has authentication off, so it would "
                                "check nothing (Trino answers the same).", www_authenticate=self.challenge)
        user = trino_user or basic_user or None
        if user is None:
            raise AuthError("The X-Trino-User header is required (the Trino client sends it).", status=400,
                            field="x-trino-user")
        return self.principal(user)


# ---------------------------------------------------------------------------------------------- the admin token

#: The header that carries the admin token (authentication off).
ADMIN_TOKEN_HEADER = "X-Sloctl-Admin-Token"
#: The token's file in the gateway's log folder.
ADMIN_TOKEN_FILE = "admin.token"
#: The environment variable ``sloctl gateway backends`` reads the token from, before the file.
ADMIN_TOKEN_ENV = "SLOCTL_GATEWAY_ADMIN_TOKEN"

_TOKENS: dict[str, AdminToken] = {}  # resolved log folder ("" without one) -> its token, for this process
_TOKENS_LOCK = threading.Lock()


@dataclass(frozen=True)
class AdminToken:
    """The admin token of a gateway with authentication off, and the file that holds it.

    Attributes:
        value: the secret (``secrets.token_urlsafe(32)``: 256 random bits).
        path: the file it was written to (mode 0600).
    """

    value: str = field(repr=False)
    path: Path

    def matches(self, presented: str | None) -> bool:
        """Whether ``presented`` is the token (a constant-time comparison: the timing says nothing)."""
        if not presented:
            return False
        return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), self.value.encode())

    def headers(self) -> dict[str, str]:
        """The request header that presents it (for clients and tests)."""
        return {ADMIN_TOKEN_HEADER: self.value}


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that no one but its owner can read it, at any instant.

    A new file created with ``O_EXCL`` and mode 0600 next to ``path``, then
    renamed over it: an existing file (or a link a stranger planted) is
    replaced, never written through, and the content is never world-readable.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # where a platform ignores the mode of os.open
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def admin_token(log_dir: str | os.PathLike[str] | None, *, renew: bool = False) -> AdminToken:
    """The admin token of the gateway logging to ``log_dir``, created and written on the first call.

    ``renew`` writes a new one (``sloctl gateway`` does at every start, so a
    token never outlives its gateway's process). Without a log folder the
    file goes into a private temporary folder (mode 0700) and
    :attr:`AdminToken.path` says where.

    Raises:
        OSError: the file cannot be written.
    """
    key = "" if log_dir is None else str(Path(log_dir).resolve())
    with _TOKENS_LOCK:
        token = _TOKENS.get(key)
        if token is not None and not renew:
            return token
        if log_dir is None:
            folder = Path(tempfile.mkdtemp(prefix="sloctl-gateway-admin-"))  # mode 0700
        else:
            folder = Path(log_dir)
            folder.mkdir(parents=True, exist_ok=True)
        token = AdminToken(secrets.token_urlsafe(32), folder / ADMIN_TOKEN_FILE)
        _write_private(token.path, token.value + "\n")
        _TOKENS[key] = token
        return token


def check_admin_token(presented: str | None, log_dir: str | os.PathLike[str] | None) -> AdminToken:
    """Accept a request of the admin API with authentication off only with the gateway's admin token.

    Raises:
        AuthError: 401 (no token sent) or 403 (a wrong one), naming the header and the file it lives in.
    """
    token = admin_token(log_dir)
    where = f"the {ADMIN_TOKEN_HEADER} header must carry the token the gateway wrote to {token.path} at start " \
            f"(readable by the gateway's user only; `sloctl gateway backends` reads it from there)"
    if not presented:
        raise AuthError(f"The admin API needs the admin token: {where}.", status=401,
                        www_authenticate=f'{ADMIN_TOKEN_HEADER} realm="{REALM}"', field=ADMIN_TOKEN_HEADER.lower())
    if not token.matches(presented):
        raise AuthError(f"The admin token is wrong: {where}.", status=403, field=ADMIN_TOKEN_HEADER.lower())
    return token


def read_admin_token(path: str | os.PathLike[str]) -> str:
    """The admin token in ``path`` (what ``sloctl gateway backends`` sends).

    Raises:
        ValueError: the file is missing, unreadable or empty, naming it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read the gateway's admin token from {path} ({exc.strerror or exc}); "
                         f"run as the gateway's user, or pass --admin-token-file or set {ADMIN_TOKEN_ENV}") from None
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{path} does not hold an admin token (one line, no spaces)")
    return text


# ---------------------------------------------------------------------------------------------- backend allow-list

_DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432}


def url_origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a backend URL, normalised: ``postgres`` is ``postgresql``, the host in lower case,
    the scheme's default port filled in. User, password, path and query do not count.

    Raises:
        ValueError: not a URL with a scheme the gateway knows and one host.
    """
    import urllib.parse

    if not isinstance(url, str):
        raise ValueError(f"a backend URL must be a string, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    scheme = "postgresql" if scheme == "postgres" else scheme
    host = (parts.hostname or "").lower().rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host or "," in host:
        raise ValueError(f"{url!r} must be http(s)://host:port or postgresql://host:port/... (one host)")
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def allowed_origins(urls: Any, where: str = "allowed_urls") -> frozenset[tuple[str, str, int]]:
    """The operator's allow-list (``allowed_urls:`` of the backends file) as normalised origins.

    Raises:
        ValueError: not a list of URLs, naming the entry (``where[i]``).
    """
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
        raise ValueError(f"The '{where}' field must be a list of backend URLs, got {urls!r}.")
    out = set()
    for i, url in enumerate(urls):
        try:
            out.add(url_origin(url))
        except ValueError as exc:
            raise ValueError(f"The '{where}[{i}]' entry {exc}.") from None
    return frozenset(out)


def check_backend_url(url: str | None, allowed: Any) -> None:
    """Refuse a backend address the operator did not allow (``allowed``: URLs, matched by scheme, host and port).

    A ``duckdb`` backend (no URL) is the gateway's own worker and always allowed.

    Raises:
        AuthError: 403 naming the ``url`` field and the allow-list.
    """
    if url is None:
        return
    origins = allowed_origins(list(allowed))
    try:
        origin = url_origin(url)
    except ValueError as exc:
        raise AuthError(f"The 'url' field is refused: {exc}.", status=403, field="url") from None
    if origin not in origins:
        listed = ", ".join(f"{s}://{h}:{p}" for s, h, p in sorted(origins)) or "empty: only duckdb backends"
        shown = re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)
        raise AuthError(f"The 'url' field {shown!r} is not in the gateway's allow-list of backend addresses "
                        f"(allowed_urls in the backends file; {listed}).", status=403, field="url")


# ---------------------------------------------------------------------------------------------- TLS for trying it


def self_signed_cert(folder: str | os.PathLike[str], host: str = "127.0.0.1", *,
                     days: int = 30) -> tuple[Path, Path]:
    """A self-signed certificate and its key for ``host``, to try TLS locally (never for production).

    Writes ``gateway-cert.pem`` and ``gateway-key.pem`` (mode 0600) into
    ``folder``. The certificate names ``host`` (an IP address or a DNS name)
    and ``localhost``; a client trusts it by pointing at the certificate file
    (``verify=`` in httpx and the Trino client).

    Returns:
        (certfile, keyfile), as uvicorn's ``ssl_certfile`` / ``ssl_keyfile`` take them.
    """
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not isinstance(days, int) or days < 1:
        raise ValueError(f"The 'days' parameter of self_signed_cert must be an int >= 1, got {days!r}.")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    if host != "localhost":
        names.append(x509.DNSName("localhost"))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sloctl gateway (self-signed)")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = out / "gateway-cert.pem", out / "gateway-key.pem"
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.chmod(keyfile, 0o600)
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return certfile, keyfile
