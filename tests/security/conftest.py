"""Fixtures of the security tests: a test CA with server and client certificates (openssl CLI)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def issue(d: Path, name: str, subject: str, extensions: str) -> None:
    """`name.key` and `name.pem`, signed by the CA in `d`."""
    (d / f"{name}.ext").write_text(extensions)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
            "-out", f"{name}.csr", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=modelplex test CA", cwd=d)
    issue(d, "server", "/CN=localhost",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    issue(d, "client", "/CN=modelplex test client", "extendedKeyUsage=clientAuth\n")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")
