"""HTTPS and CORS configured as TorchServe configures them, on all three ports and both servers.

The certificate is made here with `cryptography`; clients verify it (httpx with the certificate as
its only CA, curl with --cacert), and TorchServe's own HTTPS curl lines (docs/use_cases.md, with
``-k``) are run as they are written.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from tests.support.server import LanternServer, echo_archive

HTTPS = [
    "--inference-address",
    "https://127.0.0.1:0",
    "--management-address",
    "https://127.0.0.1:0",
    "--metrics-address",
    "https://127.0.0.1:0",
]
CORS = {
    "cors_allowed_origin": "https://yourdomain.com",
    "cors_allowed_methods": "GET, POST, PUT, OPTIONS",
    "cors_allowed_headers": "X-Custom-Header",
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate for localhost/127.0.0.1: PEM files and a PKCS12 keystore."""
    root = tmp_path_factory.mktemp("pki")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    files = {"key": root / "mykey.key", "cert": root / "mycert.pem", "p12": root / "keystore.p12"}
    files["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # "BEGIN RSA PRIVATE KEY", as openssl
            serialization.NoEncryption(),
        )
    )
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["p12"].write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"ts", key, cert, None, serialization.BestAvailableEncryption(b"changeit")
        )
    )
    return files


def verified(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def wait_ready(server: LanternServer, context: ssl.SSLContext, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{server.inference}/ping", verify=context, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(server.console_text())


@pytest.fixture(scope="module")
def pem_server(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]
) -> Iterator[LanternServer]:
    """hypercorn; PEM key and certificate and CORS from a TorchServe config.properties."""
    root = tmp_path_factory.mktemp("pem")
    store = root / "store"
    store.mkdir()
    echo_archive(store)
    props = root / "config.properties"
    lines = [f"private_key_file={pki['key']}", f"certificate_file={pki['cert']}"]
    lines += [f"{k}={v}" for k, v in CORS.items()]
    props.write_text("\n".join(lines) + "\n")
    server = LanternServer(
        root,
        store,
        ["echo=echo.mar"],
        args=[*HTTPS, "--ts-config", str(props), "--enable-model-api"],
        http_server="hypercorn",
    )
    server.start(healthy=False)
    try:
        wait_ready(server, verified(pki["cert"]))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def keystore_server(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]
) -> Iterator[LanternServer]:
    """uvicorn; a PKCS12 keystore from a Lantern YAML config; token auth on; no CORS."""
    root = tmp_path_factory.mktemp("p12")
    store = root / "store"
    store.mkdir()
    echo_archive(store)
    config = root / "lantern.yaml"
    config.write_text(
        yaml.safe_dump(
            {"keystore": str(pki["p12"]), "keystore_pass": "changeit", "keystore_type": "PKCS12"}
        )
    )
    server = LanternServer(
        root,
        store,
        ["echo=echo.mar"],
        args=[*HTTPS, "--config", str(config)],
        token_auth=True,
        http_server="uvicorn",
    )
    server.start(healthy=False)
    try:
        wait_ready(server, verified(pki["cert"]))
        yield server
    finally:
        server.stop()


def test_all_three_ports_serve_the_pem_certificate(
    pem_server: LanternServer, pki: dict[str, Path]
) -> None:
    context = verified(pki["cert"])
    assert pem_server.inference.startswith("https://127.0.0.1:")
    with httpx.Client(verify=context, timeout=30) as client:
        assert client.get(f"{pem_server.inference}/ping").json() == {"status": "Healthy"}
        assert client.get(f"{pem_server.management}/models").json()["models"][0]["modelName"] == (
            "echo"
        )
        assert "ts_inference_requests_total" in client.get(f"{pem_server.metrics}/metrics").text
        # OPTIONS / describes the metrics port's API over HTTPS too, as TorchServe's does.
        described = client.options(f"{pem_server.metrics}/").json()
        assert "get" in described["paths"]["/metrics"]
    # Plain HTTP on an https port is refused; a client that trusts nothing refuses the server.
    plain = pem_server.inference.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/ping", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{pem_server.inference}/ping", timeout=5)


def test_curl_verifies_the_certificate(pem_server: LanternServer, pki: dict[str, Path]) -> None:
    out = subprocess.run(
        ["curl", "-sS", "--cacert", str(pki["cert"]), f"{pem_server.inference}/ping"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"status": "Healthy"}
    refused = subprocess.run(
        ["curl", "-sS", f"{pem_server.inference}/ping"], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 60, refused.stderr  # curl: peer certificate cannot be verified


def test_torchserve_https_curl_lines(pem_server: LanternServer, tmp_path: Path) -> None:
    """docs/use_cases.md of TorchServe 0.12, with our ports (and localhost, as written there)."""
    inference = pem_server.inference.replace("127.0.0.1", "localhost")
    management = pem_server.management.replace("127.0.0.1", "localhost")
    echo_archive(pem_server.model_store, "copy")

    def curl(*args: str) -> str:
        out = subprocess.run(["curl", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    registered = curl(
        "-k",
        "-v",
        "-X",
        "POST",
        f"{management}/models?initial_workers=1&synchronous=true&url=copy.mar",
    )
    assert json.loads(registered) == {
        "status": 'Model "copy" Version: 1.0 registered with 1 initial workers'
    }
    described = json.loads(curl("-k", f"{management}/models/copy"))
    assert described[0]["modelName"] == "copy" and described[0]["workers"][0]["status"] == "READY"
    payload = tmp_path / "input.txt"
    payload.write_text("over tls")
    answer = json.loads(curl("-k", f"{inference}/predictions/copy", "-T", str(payload)))
    assert answer["echo"] == "over tls"


def test_cors_headers_and_preflight(pem_server: LanternServer, pki: dict[str, Path]) -> None:
    context = verified(pki["cert"])
    expected = {
        "access-control-allow-origin": "https://yourdomain.com",
        "access-control-allow-methods": "GET, POST, PUT, OPTIONS",
        "access-control-allow-headers": "X-Custom-Header",
    }
    with httpx.Client(verify=context, timeout=30) as client:
        for url in (
            f"{pem_server.inference}/ping",
            f"{pem_server.management}/models",
            f"{pem_server.metrics}/metrics",
            f"{pem_server.inference}/predictions/nope",  # errors too, as in TorchServe
        ):
            got = client.get(url, headers={"Origin": "https://elsewhere.example"})
            assert {k: got.headers.get(k) for k in expected} == expected, url
        preflight = client.options(
            f"{pem_server.inference}/predictions/echo",
            headers={
                "Origin": "https://yourdomain.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "X-Custom-Header",
            },
        )
        assert preflight.status_code == 200
        assert {k: preflight.headers.get(k) for k in expected} == expected
        assert preflight.content == b""
        # An OPTIONS that is not a preflight still gets the API description, as in TorchServe.
        described = client.options(f"{pem_server.inference}/")
        assert described.status_code == 200 and "openapi" in described.json()


def test_keystore_with_uvicorn_on_all_three_ports(
    keystore_server: LanternServer, pki: dict[str, Path]
) -> None:
    context = verified(pki["cert"])
    keys = keystore_server.keys()
    with httpx.Client(verify=context, timeout=30) as client:
        ping = client.get(f"{keystore_server.inference}/ping")
        assert ping.json() == {"status": "Healthy"}
        assert "access-control-allow-origin" not in ping.headers  # CORS is off unless configured
        listed = client.get(
            f"{keystore_server.management}/models",
            headers={"Authorization": f"Bearer {keys['management']['key']}"},
        )
        assert listed.json()["models"][0]["modelName"] == "echo"
        assert client.get(f"{keystore_server.metrics}/metrics").status_code == 200
        assert client.options(f"{keystore_server.metrics}/").status_code == 200  # no token
        answer = client.post(
            f"{keystore_server.inference}/predictions/echo",
            content=b"hi",
            headers={"Authorization": f"Bearer {keys['inference']['key']}"},
        )
        assert answer.json()["echo"] == "hi"


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serve.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_self_signed_when_no_certificate_is_configured(tmp_path: Path) -> None:
    """As TorchServe: https without key or keystore serves a self-signed certificate; and
    `serve start` / `serve status` reach such a server (they trust the certificate it serves)."""
    record = tmp_path / "server.json"
    started = serve(
        "start", "--pid-file", str(record), "--disable-token-auth", "--ncs", *HTTPS, cwd=tmp_path
    )
    try:
        assert started.returncode == 0, started.stderr
        info: dict[str, Any] = json.loads(record.read_text())
        lines = started.stdout.splitlines()
        assert lines[0].startswith("HTTP server: ")  # which server runs, and why
        running = next(i for i, line in enumerate(lines) if line.startswith("Lantern is running"))
        assert lines[running + 1].split() == ["inference", info["addresses"]["inference"]]
        assert info["addresses"]["inference"].startswith("https://")
        status = serve("status", "--pid-file", str(record), cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "health: Healthy" in status.stdout.splitlines()[0]
        cert = x509.load_pem_x509_certificate(Path(info["certificate_file"]).read_bytes())
        assert cert.subject.rfc4514_string() == "CN=localhost"
        log = (tmp_path / "logs" / "lantern.log").read_text()
        assert "serving a self-signed certificate" in log
    finally:
        serve("stop", "--pid-file", str(record), cwd=tmp_path)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"keystore_type": "JKS", "keystore": "{p12}"},
            "Error: Config 'keystore_type' JKS is not supported; only PKCS12 is (convert with: "
            "keytool -importkeystore -deststoretype PKCS12)",
        ),
        (
            {"keystore": "{p12}", "keystore_pass": "wrong"},
            "Error: Config 'keystore': {p12} does not open with keystore_pass: ",
        ),
        (
            {"private_key_file": "{key}"},
            "Error: Config 'private_key_file' and 'certificate_file' go together",
        ),
        (
            {"private_key_file": "{key}", "certificate_file": "/nonexistent/cert.pem"},
            "Error: Config 'certificate_file': no such file /nonexistent/cert.pem",
        ),
    ],
)
def test_unusable_tls_settings_are_usage_errors(
    tmp_path: Path, pki: dict[str, Path], settings: dict[str, str], message: str
) -> None:
    fill = {"p12": str(pki["p12"]), "key": str(pki["key"])}
    config = tmp_path / "lantern.yaml"
    config.write_text(yaml.safe_dump({k: v.format(**fill) for k, v in settings.items()}))
    result = serve(
        "start",
        "--foreground",
        "--config",
        str(config),
        "--pid-file",
        str(tmp_path / "server.json"),
        "--log-dir",
        str(tmp_path / "logs"),
        *HTTPS,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith(message.format(**fill)), result.stderr
