"""HTTPS for the listeners whose address says ``https://``, configured the TorchServe way.

One of, in TorchServe's order of preference:

1. ``keystore`` (+ ``keystore_pass``, default ``changeit``; ``keystore_type``, default and only
   ``PKCS12``): the first key entry and its certificate chain, read with the ``cryptography``
   package and written as PEM files into the server's private work folder;
2. ``private_key_file`` + ``certificate_file``: PEM files (PKCS#8 or OpenSSL "traditional" keys),
   used as they are;
3. neither: a self-signed certificate for ``localhost``/``127.0.0.1``/``::1``, made at startup
   (TorchServe does the same), with a warning in the log.

Every listener that is https uses the same certificate, with hypercorn and uvicorn alike.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.config import Config, ConfigError

logger = logging.getLogger(__name__)


class TlsError(ConfigError):
    """A TLS setting that cannot be used; the message names the key and the file."""


@dataclass(frozen=True)
class TlsFiles:
    """A PEM certificate chain and its private key, as both HTTP servers take them."""

    certfile: Path
    keyfile: Path

    def apply_to_hypercorn(self, config: Any) -> None:
        config.certfile = str(self.certfile)
        config.keyfile = str(self.keyfile)

    def uvicorn_options(self) -> dict[str, str]:
        return {"ssl_certfile": str(self.certfile), "ssl_keyfile": str(self.keyfile)}


def server_tls_files(config: Config, work_dir: Path) -> TlsFiles:
    """The certificate and key the https listeners serve; raises `TlsError` when unusable."""
    work_dir = work_dir.resolve()
    if config.keystore:
        files = _from_keystore(config, work_dir / "tls")
    elif config.private_key_file or config.certificate_file:
        if not (config.private_key_file and config.certificate_file):
            raise TlsError("Config 'private_key_file' and 'certificate_file' go together")
        for key in ("private_key_file", "certificate_file"):
            if not Path(getattr(config, key)).is_file():
                raise TlsError(f"Config '{key}': no such file {getattr(config, key)}")
        # Absolute: the record hands the certificate to `serve status` run from anywhere.
        files = TlsFiles(
            Path(config.certificate_file).resolve(), Path(config.private_key_file).resolve()
        )
    else:
        files = self_signed(work_dir / "tls")
        logger.warning(
            "An address is https but no keystore or private_key_file/certificate_file is set: "
            "serving a self-signed certificate (%s)",
            files.certfile,
        )
    _check(files)
    return files


def _check(files: TlsFiles) -> None:
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            str(files.certfile), str(files.keyfile)
        )
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"The certificate {files.certfile} and key {files.keyfile} cannot be used: {exc}"
        ) from None


def _crypto() -> Any:
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise TlsError(
            "A keystore or a self-signed certificate needs the 'cryptography' package: "
            "pip install 'lantern-serve[tls]' (or set private_key_file and certificate_file)"
        ) from exc


def _from_keystore(config: Config, folder: Path) -> TlsFiles:
    _crypto()
    from cryptography.hazmat.primitives.serialization import pkcs12

    if str(config.keystore_type).upper() != "PKCS12":
        raise TlsError(
            f"Config 'keystore_type' {config.keystore_type} is not supported; only PKCS12 is "
            "(convert with: keytool -importkeystore -deststoretype PKCS12)"
        )
    try:
        data = Path(str(config.keystore)).read_bytes()
    except OSError as exc:
        raise TlsError(f"Config 'keystore': cannot read {config.keystore}: {exc}") from None
    password = config.keystore_pass.encode() if config.keystore_pass else None
    try:
        key, cert, chain = pkcs12.load_key_and_certificates(data, password)
    except ValueError as exc:
        raise TlsError(
            f"Config 'keystore': {config.keystore} does not open with keystore_pass: {exc}"
        ) from None
    if key is None or cert is None:
        raise TlsError(f"Config 'keystore': no key entry found in {config.keystore}")
    return _write_pem(folder, key, [cert, *chain])


def self_signed(folder: Path, days: int = 365) -> TlsFiles:
    """A new self-signed certificate for localhost, 127.0.0.1 and ::1."""
    _crypto()
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _write_pem(folder, key, [cert])


def _write_pem(folder: Path, key: Any, certs: list[Any]) -> TlsFiles:
    from cryptography.hazmat.primitives import serialization

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    keyfile, certfile = folder / "key.pem", folder / "cert.pem"
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key_pem)
    certfile.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return TlsFiles(certfile, keyfile)
