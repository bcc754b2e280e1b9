"""TLS peers for the tests: a hospital CA made with openssl, and an Orthanc speaking DICOM TLS
and HTTPS (DICOMweb) with a certificate that CA signed, on free loopback ports.

``tls_pki`` makes two CAs (the hospital's, and another one a client must not trust) and a
server certificate for 127.0.0.1/localhost signed by the first. ``tls_orthanc`` starts Debian's
Orthanc with that certificate for its DICOM port (DicomTlsEnabled), with the DICOMweb plugin,
and stops it by PID at the end of the session. Its HTTP server stays plain: Debian's Orthanc
1.10.1 crashes (SIGSEGV) on the first HTTPS request with SslEnabled; HTTPS is served the way
hospitals usually put it in front of a PACS, by a TLS-terminating proxy (``TlsProxy``: the
standard library's ssl on a loopback port, forwarding to Orthanc's HTTP port).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from guard import stop

from gateway.pacs_local import free_port

TLS_AE = "TLSPACS"
PLUGINS = Path("/usr/share/orthanc/plugins")


@dataclass
class Pki:
    ca: Path  # the hospital's CA certificate (PEM)
    other_ca: Path  # a CA that signed nothing here
    cert: Path  # the server's certificate, for 127.0.0.1 and localhost
    key: Path
    client_cert: Path  # a client certificate the hospital's CA signed (for our receiver)
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, crt = folder / f"{name}.key", folder / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", str(key), "-out", str(crt), cwd=folder)  # fmt: skip
    return key, crt


def _signed(folder: Path, name: str, ca_key: Path, ca_crt: Path) -> tuple[Path, Path]:
    key, csr, crt = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.crt"
    ext = folder / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
             str(key), "-out", str(csr), cwd=folder)  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt),
             cwd=folder)  # fmt: skip
    return key, crt


@pytest.fixture(scope="session")
def tls_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca = _ca(folder, "hospital-ca")
    _, other = _ca(folder, "other-ca")
    key, cert = _signed(folder, "pacs", ca_key, ca)
    client_key, client_cert = _signed(folder, "sandbox", ca_key, ca)
    return Pki(ca, other, cert, key, client_cert, client_key)


@dataclass
class TlsOrthanc:
    dicom_port: int
    http_port: int
    pki: Pki

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def upload(self, path: Path) -> None:
        with httpx.Client(timeout=30) as c:
            c.post(f"{self.url}/instances", content=path.read_bytes()).raise_for_status()


@pytest.fixture(scope="session")
def tls_orthanc(tls_pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsOrthanc]:
    if shutil.which("Orthanc") is None:
        pytest.skip("Orthanc is not installed (apt-get install orthanc orthanc-dicomweb)")
    folder = tmp_path_factory.mktemp("tls-orthanc")
    dicom_port, http_port = free_port(), free_port()
    config = {
        "Name": "tls-test",
        "StorageDirectory": str(folder / "db"),
        "IndexDirectory": str(folder / "db"),
        "HttpPort": http_port,
        "DicomPort": dicom_port,
        "DicomAet": TLS_AE,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "DicomTlsEnabled": True,
        "DicomTlsCertificate": str(tls_pki.cert),
        "DicomTlsPrivateKey": str(tls_pki.key),
        "DicomTlsTrustedCertificates": str(tls_pki.ca),
        "DicomTlsRemoteCertificateRequired": False,
        "DicomCheckCalledAet": False,
        "DicomAlwaysAllowFind": True,
        "DicomAlwaysAllowGet": True,
        "DicomAlwaysAllowStore": True,
        "DicomAlwaysAllowEcho": True,
        "DefaultEncoding": "Utf8",
        "Plugins": [str(PLUGINS / "libOrthancDicomWeb.so")] if PLUGINS.exists() else [],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
    }
    cfg = folder / "orthanc.json"
    cfg.write_text(json.dumps(config))
    log = open(folder / "orthanc.log", "wb")  # noqa: SIM115 (closed at the end)
    proc = subprocess.Popen(["Orthanc", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError((folder / "orthanc.log").read_text(errors="replace")[-2000:])
            try:
                httpx.get(f"http://127.0.0.1:{http_port}/system", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        yield TlsOrthanc(dicom_port, http_port, tls_pki)
    finally:
        stop(proc, 20)  # by PID: SIGTERM, then SIGKILL
        log.close()


class TlsProxy:
    """HTTPS on a free loopback port, forwarding each connection to a plain HTTP port."""

    def __init__(self, pki: Pki, target_port: int) -> None:
        import socket
        import ssl
        import threading

        self.target_port = target_port
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(str(pki.cert), str(pki.key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        import threading

        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: object) -> None:
        import socket
        import ssl
        import threading

        assert isinstance(conn, socket.socket)
        try:
            conn.settimeout(30)
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):  # the client did not trust us: its side says why
            conn.close()
            return
        up = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(1 << 16):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        t = threading.Thread(target=pipe, args=(up, tls), daemon=True)
        t.start()
        pipe(tls, up)
        t.join(timeout=30)
        tls.close()
        up.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def https_orthanc(tls_orthanc: TlsOrthanc) -> Iterator[TlsProxy]:
    """Orthanc's HTTP API (DICOMweb at /dicom-web/) behind HTTPS with the hospital's CA."""
    proxy = TlsProxy(tls_orthanc.pki, tls_orthanc.http_port)
    try:
        yield proxy
    finally:
        proxy.close()
