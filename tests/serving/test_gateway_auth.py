"""The gateway's authentication: Trino password files, JWTs, TLS only, impersonation by admins only.

Real bcrypt hashes, real PyJWT tokens, real keys from ``cryptography``; one
end-to-end run over TLS with uvicorn and httpx.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import stat
import threading
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import Depends, FastAPI, HTTPException, Request  # module level: the routes' annotations are strings

from sloctl.serving.gateway.auth import (
    AuthError,
    GatewayAuth,
    JwtVerifier,
    PasswordFile,
    Principal,
    hash_password,
    may_read,
    self_signed_cert,
    set_password,
)

ROUNDS = 8  # the least Trino accepts; the tests need no more


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def pw_path(tmp_path):
    path = tmp_path / "password.db"
    set_password(path, "alice", "wonderland", rounds=ROUNDS)
    set_password(path, "root", "toor", rounds=ROUNDS)
    return path


@pytest.fixture
def hs_key(tmp_path):
    secret = os.urandom(32)
    path = tmp_path / "hmac.key"
    path.write_text(base64.b64encode(secret).decode() + "\n")  # as Trino's jwt.key-file holds it
    return path, secret


@pytest.fixture(scope="module")
def rsa_private():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def rsa_key(tmp_path, rsa_private):
    path = tmp_path / "rsa.pub.pem"
    path.write_bytes(rsa_private.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return path, rsa_private


def token(key, alg="HS256", **claims) -> str:
    body = {"sub": "alice", "exp": int(time.time()) + 300} | claims
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=alg)


# ---------------------------------------------------------------------------------------------- password file


def test_password_file_accepts_the_right_password_only(pw_path):
    pf = PasswordFile.load(pw_path)
    assert pf.users == {"alice", "root"}
    assert pf.verify("alice", "wonderland")
    assert pf.verify("alice", "wonderland")  # again, from the cache
    assert not pf.verify("alice", "Wonderland")
    assert not pf.verify("root", "wonderland")


def test_unknown_user_is_refused(pw_path):
    assert not PasswordFile.load(pw_path).verify("mallory", "wonderland")


def test_password_change_takes_effect_at_the_next_check(pw_path):
    pf = PasswordFile.load(pw_path)
    assert pf.verify("alice", "wonderland")  # cached now
    set_password(pw_path, "alice", "looking-glass", rounds=ROUNDS)
    assert not pf.verify("alice", "wonderland")  # the cache went with the old file
    assert pf.verify("alice", "looking-glass")
    set_password(pw_path, "bob", "builder", rounds=ROUNDS)
    assert pf.users == {"alice", "root", "bob"}


def test_removed_user_is_refused_after_reload(pw_path):
    pf = PasswordFile.load(pw_path)
    assert pf.verify("root", "toor")
    lines = [line for line in pw_path.read_text().splitlines() if not line.startswith("root:")]
    pw_path.write_text("\n".join(lines) + "\n")
    assert not pf.verify("root", "toor")


@pytest.mark.parametrize("line, reason", [
    ("bob", "expected user:hash"),
    (":" + hash_password("x", ROUNDS), "expected user:hash"),
    ("bob:plaintext", "cannot be determined"),
    ("bob:$2y$04$" + "a" * 53, "cost must be >= 8, got 4"),
    ("bob:$2y$10$tooshort", "malformed"),
    ("bob:999:abcd:abcd", "iterations must be >= 1000, got 999"),
    ("bob:1000:zz:abcd", "hex"),
    ("alice:" + hash_password("x", ROUNDS), "duplicate user 'alice'"),
], ids=["no-hash", "no-user", "plaintext", "low-cost", "short-bcrypt", "few-iterations", "bad-hex", "duplicate"])
def test_bad_line_is_an_error_naming_its_number(pw_path, line, reason):
    pw_path.write_text(pw_path.read_text() + "\n" + line + "\n")  # line 4: a blank line 3 is skipped
    with pytest.raises(ValueError, match="Line 4 of the password file") as e:
        PasswordFile.load(pw_path)
    assert reason in str(e.value)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        PasswordFile.load(tmp_path / "nope.db")


def test_file_broken_after_start_fails_closed(pw_path):
    auth = GatewayAuth(password_file=PasswordFile.load(pw_path))
    assert auth.authenticate(basic("alice", "wonderland"), trino_user="alice", secure=True).user == "alice"
    pw_path.write_text(pw_path.read_text() + "garbage\n")
    with pytest.raises(AuthError) as e:
        auth.authenticate(basic("alice", "wonderland"), trino_user="alice", secure=True)
    assert e.value.status == 500 and "garbage" not in e.value.message


def test_pbkdf2_line_as_trino_writes_it(tmp_path):
    salt = os.urandom(9)
    digest = hashlib.pbkdf2_hmac("sha1", b"s3cret", salt, 1000, dklen=64)  # Trino: PBKDF2WithHmacSHA1
    path = tmp_path / "password.db"
    path.write_text(f"test:1000:{salt.hex()}:{digest.hex()}\n")
    pf = PasswordFile.load(path)
    assert pf.verify("test", "s3cret")
    assert not pf.verify("test", "s3cret!")


def test_htpasswd_style_2y_hash_is_accepted(tmp_path):
    hashed = hash_password("pw", ROUNDS)
    assert hashed.startswith("$2y$08$")
    path = tmp_path / "password.db"
    path.write_text(f"test:{hashed}\n")
    assert PasswordFile.load(path).verify("test", "pw")


def test_set_password_writes_mode_0600_and_keeps_other_lines(pw_path):
    before = pw_path.read_text().splitlines()
    set_password(pw_path, "alice", "new-password", rounds=ROUNDS)
    after = pw_path.read_text().splitlines()
    assert stat.S_IMODE(os.stat(pw_path).st_mode) == 0o600
    assert len(after) == 2 and after[1] == before[1]  # root's line untouched
    assert after[0].startswith("alice:$2y$08$") and after[0] != before[0]
    assert not [p for p in pw_path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("user", ["", "a:b", "a b", "a\nb"])
def test_set_password_refuses_a_bad_user_name(tmp_path, user):
    with pytest.raises(ValueError, match="'user'"):
        set_password(tmp_path / "password.db", user, "pw", rounds=ROUNDS)


def test_hash_password_refuses_what_bcrypt_or_trino_would():
    with pytest.raises(ValueError, match="'rounds'"):
        hash_password("pw", rounds=4)
    with pytest.raises(ValueError, match="at most 72 bytes"):
        hash_password("x" * 73)
    with pytest.raises(ValueError, match="must not be empty"):
        hash_password("")


def test_password_longer_than_bcrypt_reads_is_refused_not_an_error(pw_path):
    assert not PasswordFile.load(pw_path).verify("alice", "wonderland" * 10)


# ---------------------------------------------------------------------------------------------- JWT


def test_hs256_token_names_its_subject(hs_key):
    path, secret = hs_key
    assert JwtVerifier(path).verify(token(secret)) == "alice"


def test_rs256_token_names_its_subject(rsa_key):
    path, private = rsa_key
    assert JwtVerifier(path).verify(token(private, "RS256")) == "alice"


def test_es256_token_from_a_certificate_file(tmp_path):
    from cryptography import x509

    folder = tmp_path / "tls"
    certfile, keyfile = self_signed_cert(folder)  # an EC P-256 key and its certificate
    private = serialization.load_pem_private_key(keyfile.read_bytes(), password=None)
    assert isinstance(x509.load_pem_x509_certificate(certfile.read_bytes()).public_key(), ec.EllipticCurvePublicKey)
    verifier = JwtVerifier(certfile)
    assert verifier.algorithms == ("ES256",)
    assert verifier.verify(token(private, "ES256")) == "alice"


def test_expired_token_is_refused_with_a_reason(hs_key):
    path, secret = hs_key
    with pytest.raises(AuthError, match="expired") as e:
        JwtVerifier(path).verify(token(secret, exp=int(time.time()) - 60))
    assert e.value.status == 401 and e.value.www_authenticate.startswith("Bearer")


def test_token_without_exp_is_refused_unless_allowed(hs_key):
    path, secret = hs_key
    with pytest.raises(AuthError, match="'exp'"):
        JwtVerifier(path).verify(token(secret, exp=None))
    assert JwtVerifier(path, require_exp=False).verify(token(secret, exp=None)) == "alice"


def test_wrong_issuer_or_audience_is_refused(hs_key):
    path, secret = hs_key
    verifier = JwtVerifier(path, issuer="https://idp.example", audience="sloctl")
    assert verifier.verify(token(secret, iss="https://idp.example", aud="sloctl")) == "alice"
    assert verifier.verify(token(secret, iss="https://idp.example", aud=["other", "sloctl"])) == "alice"
    with pytest.raises(AuthError, match="issuer"):
        verifier.verify(token(secret, iss="https://evil.example", aud="sloctl"))
    with pytest.raises(AuthError, match="audience"):
        verifier.verify(token(secret, iss="https://idp.example", aud="trino"))
    with pytest.raises(AuthError, match="'aud'"):
        verifier.verify(token(secret, iss="https://idp.example"))


def test_audience_is_not_checked_unless_required(hs_key):
    path, secret = hs_key
    assert JwtVerifier(path).verify(token(secret, aud="anyone")) == "alice"


def test_bad_signature_and_garbage_are_refused(hs_key, rsa_key):
    path, _ = hs_key
    with pytest.raises(AuthError, match="signature"):
        JwtVerifier(path).verify(token(os.urandom(32)))
    with pytest.raises(AuthError, match="malformed"):
        JwtVerifier(path).verify("not.a.jwt")
    rsa_path, private = rsa_key
    with pytest.raises(AuthError, match="algorithm"):  # an RSA key never checks an HMAC token
        JwtVerifier(rsa_path).verify(token(os.urandom(32), "HS256"))


def test_principal_field_names_the_claim(hs_key):
    path, secret = hs_key
    verifier = JwtVerifier(path, principal_field="preferred_username")
    assert verifier.verify(token(secret, preferred_username="bob")) == "bob"
    with pytest.raises(AuthError, match="'preferred_username' claim"):
        verifier.verify(token(secret))


def test_key_file_problems_are_errors(tmp_path, rsa_private):
    private = tmp_path / "private.pem"
    private.write_bytes(rsa_private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    with pytest.raises(ValueError, match="private key"):
        JwtVerifier(private)
    short = tmp_path / "short.key"
    short.write_text(base64.b64encode(b"too short").decode())
    with pytest.raises(ValueError, match=">= 32 bytes"):
        JwtVerifier(short)
    junk = tmp_path / "junk.key"
    junk.write_text("not base64 at all!")
    with pytest.raises(ValueError, match="PEM public key or a base64-encoded HMAC secret"):
        JwtVerifier(junk)
    with pytest.raises(ValueError, match="cannot be read"):
        JwtVerifier(tmp_path / "missing.key")


def test_algorithms_must_fit_the_key(rsa_key):
    path, _ = rsa_key
    with pytest.raises(ValueError, match="'algorithms'.*cannot check"):
        JwtVerifier(path, algorithms=("HS256",))
    assert JwtVerifier(path, algorithms=("RS256",)).algorithms == ("RS256",)


# ---------------------------------------------------------------------------------------------- GatewayAuth


@pytest.fixture
def auth(pw_path, hs_key):
    return GatewayAuth(password_file=PasswordFile.load(pw_path), jwt=JwtVerifier(hs_key[0]), admin_users={"root"})


def test_basic_and_bearer_give_the_principal(auth, hs_key):
    assert auth.authenticate(basic("alice", "wonderland"), trino_user="alice", secure=True) == Principal("alice")
    assert auth.authenticate(basic("root", "toor"), trino_user=None, secure=True) == Principal("root",
                                                                                             frozenset({"admin"}))
    assert auth.authenticate("Bearer " + token(hs_key[1]), trino_user="alice", secure=True).user == "alice"


def test_missing_credentials_answer_401_with_the_challenges(auth):
    with pytest.raises(AuthError) as e:
        auth.authenticate(None, trino_user="alice", secure=True)
    assert e.value.status == 401
    assert e.value.headers() == {"WWW-Authenticate": 'Basic realm="sloctl", Bearer realm="sloctl"'}


def test_password_only_gateway_challenges_basic_only(pw_path):
    auth = GatewayAuth(password_file=PasswordFile.load(pw_path))
    with pytest.raises(AuthError) as e:
        auth.authenticate("Bearer abc.def.ghi", trino_user="alice", secure=True)
    assert e.value.status == 401 and e.value.www_authenticate == 'Basic realm="sloctl"'


@pytest.mark.parametrize("header", [
    "Basic", "Basic !!!not-base64!!!", "Basic " + base64.b64encode(b"no-colon").decode(),
    "Basic " + base64.b64encode(b":no-user").decode(), "Bearer", "Digest username=alice", "alice:wonderland",
])
def test_malformed_authorization_header_is_401(auth, header):
    with pytest.raises(AuthError) as e:
        auth.authenticate(header, trino_user="alice", secure=True)
    assert e.value.status == 401 and "Basic" in e.value.www_authenticate


@pytest.mark.parametrize("user, password", [("alice", "nope"), ("mallory", "wonderland")])
def test_wrong_password_or_unknown_user_is_401(auth, user, password):
    with pytest.raises(AuthError, match="Invalid credentials") as e:
        auth.authenticate(basic(user, password), trino_user=user, secure=True)
    assert e.value.status == 401


def test_credentials_over_plain_http_are_refused_unless_allowed(pw_path):
    pf = PasswordFile.load(pw_path)
    with pytest.raises(AuthError, match="over HTTP") as e:
        GatewayAuth(password_file=pf).authenticate(basic("alice", "wonderland"), trino_user="alice", secure=False)
    assert e.value.status == 403
    with pytest.raises(AuthError, match="over HTTP"):  # nor a user name alone, as Trino's default would take
        GatewayAuth(password_file=pf).authenticate(None, trino_user="alice", secure=False)
    allowed = GatewayAuth(password_file=pf, allow_insecure=True)
    assert allowed.authenticate(basic("alice", "wonderland"), trino_user="alice", secure=False).user == "alice"
    with pytest.raises(AuthError, match="Invalid credentials"):
        allowed.authenticate(basic("alice", "nope"), trino_user="alice", secure=False)


def test_impersonation_is_refused_unless_admin(auth):
    with pytest.raises(AuthError, match="only admin users may impersonate") as e:
        auth.authenticate(basic("alice", "wonderland"), trino_user="root", secure=True)
    assert e.value.status == 403
    p = auth.authenticate(basic("root", "toor"), trino_user="alice", secure=True)
    assert p == Principal("alice", frozenset(), impersonated_by="root")
    assert not p.is_admin  # acting as alice, with alice's rights


def test_authentication_off_takes_the_trino_user(pw_path):
    off = GatewayAuth.off()
    assert not off.enabled
    assert off.authenticate(None, trino_user="me", secure=False) == Principal("me")
    assert off.authenticate(basic("me", ""), trino_user=None, secure=False).user == "me"  # a user name, no password
    with pytest.raises(AuthError, match="Password not allowed") as e:
        off.authenticate(basic("me", "secret"), trino_user="me", secure=False)
    assert e.value.status == 401
    with pytest.raises(AuthError, match="X-Trino-User") as e:
        off.authenticate(None, trino_user="  ", secure=False)
    assert e.value.status == 400 and e.value.field == "x-trino-user"


def test_may_read_own_queries_or_any_as_admin():
    assert may_read(Principal("alice"), "alice")
    assert not may_read(Principal("alice"), "bob")
    assert may_read(Principal("root", frozenset({"admin"})), "bob")


def test_admin_users_must_be_a_collection_of_names():
    with pytest.raises(ValueError, match="'admin_users'.*not one string"):
        GatewayAuth(admin_users="root")
    with pytest.raises(ValueError, match="'admin_users'.*non-empty"):
        GatewayAuth(admin_users={""})


def test_trino_client_headers_are_understood(auth, hs_key):
    """The headers ``trino.auth.BasicAuthentication`` / ``JWTAuthentication`` put on a request."""
    import requests
    import trino.auth

    def header(a) -> str:
        session = a.set_http_session(requests.Session())
        return session.prepare_request(requests.Request("GET", "https://gw/v1/info")).headers["Authorization"]

    assert auth.authenticate(header(trino.auth.BasicAuthentication("alice", "wonderland")),
                             trino_user="alice", secure=True).user == "alice"
    assert auth.authenticate(header(trino.auth.JWTAuthentication(token(hs_key[1]))),
                             trino_user="alice", secure=True).user == "alice"


# ---------------------------------------------------------------------------------------------- over TLS


def test_over_tls_basic_auth_answers_200_and_no_credentials_401(tmp_path, pw_path):
    """A tiny FastAPI app with GatewayAuth as a dependency, under uvicorn with a self-signed certificate."""
    import uvicorn

    certfile, keyfile = self_signed_cert(tmp_path / "tls")
    assert stat.S_IMODE(os.stat(keyfile).st_mode) == 0o600
    auth = GatewayAuth(password_file=PasswordFile.load(pw_path))

    def principal(request: Request) -> Principal:  # a plain def: bcrypt runs in the thread pool
        try:
            return auth.authenticate(request.headers.get("authorization"),
                                     trino_user=request.headers.get("x-trino-user"),
                                     secure=request.url.scheme == "https")
        except AuthError as e:
            raise HTTPException(e.status, e.message, headers=e.headers()) from None

    app = FastAPI()

    @app.get("/v1/whoami")
    def whoami(p: Principal = Depends(principal)) -> dict:
        return {"user": p.user, "secure": True}

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ssl_certfile=str(certfile), ssl_keyfile=str(keyfile)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{port}/v1/whoami"
        with httpx.Client(verify=ssl.create_default_context(cafile=str(certfile)), timeout=10) as client:
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.05)
            ok = client.get(url, auth=("alice", "wonderland"), headers={"X-Trino-User": "alice"})
            assert ok.status_code == 200 and ok.json() == {"user": "alice", "secure": True}
            refused = client.get(url, headers={"X-Trino-User": "alice"})
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == 'Basic realm="sloctl"'
            assert client.get(url, auth=("alice", "nope")).status_code == 401
        with httpx.Client(timeout=10) as untrusting, pytest.raises(httpx.ConnectError):
            untrusting.get(url, auth=("alice", "wonderland"))  # the certificate is trusted only when named
    finally:
        server.should_exit = True
        thread.join(timeout=10)
