"""TLS to and from a PACS: one place for the contexts a PACS's ``tls:`` settings ask for.

Verification is always on (no setting turns it off): a hospital with its own CA names it in
``ca_file``. A client presents ``cert_file``/``key_file`` when the PACS asks for one; a server of
ours (the C-MOVE receiver) needs them.
"""

from __future__ import annotations

import ssl

from gateway.pacs.config import PacsConfigError, TlsConfig


def _load(ctx: ssl.SSLContext, tls: TlsConfig) -> ssl.SSLContext:
    try:
        if tls.ca_file:
            ctx.load_verify_locations(cafile=str(tls.ca_file))
        if tls.cert_file and tls.key_file:
            ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise PacsConfigError(f"tls: cannot load the CA or certificate files: {exc}") from None
    return ctx


def client_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """The context for connecting to a PACS (None: no TLS settings given)."""
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return _load(ctx, tls)


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """The context of a listener of ours a PACS connects to: our certificate and, with
    ``ca_file``, the PACS's certificate required and checked against that CA (the calling AE
    title a receiver also checks is only a string anyone on the network may send)."""
    if not (tls.cert_file and tls.key_file):
        raise PacsConfigError("tls: a receiver needs cert_file and key_file (our certificate)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.ca_file else ssl.CERT_NONE
    return _load(ctx, tls)


def describe_tls_error(exc: BaseException) -> str | None:
    """A sentence for a TLS failure (untrusted certificate, wrong name), None if not one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS: the PACS's certificate is not trusted ({exc.verify_message}); check tls.ca_file"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return None
