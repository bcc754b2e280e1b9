"""The service's log lines carry no PHI: DICOM UIDs are hashed (the last line of defence, even
in tracebacks), and third-party loggers that print datasets, identifiers or URLs speak only at
WARNING. Used by ``neurosandbox serve``, its evaluation worker processes and a worker host's
``runs evaluate-study``."""

from __future__ import annotations

import logging
import re

from pynetdicom import _config as pynetdicom_config

from gateway.scp import uid_key

_UID = re.compile(r"(?<![\d.])[0-9]+(?:\.[0-9]+){4,}(?![\d.])")


def redact_uids(text: str) -> str:
    """DICOM UIDs (study, series, instance) replaced by a short hash: they identify studies."""
    return _UID.sub(lambda m: "uid:" + uid_key(m.group(0)), text)


class RedactUids(logging.Filter):
    """Last line of defence: no DICOM UID reaches a log line, not even in a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_uids(record.getMessage()), None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = redact_uids(text), None
        return True


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("", "pynetdicom"):  # pynetdicom may bring its own handler
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(RedactUids())
    # Third-party loggers that would print datasets, identifiers or URLs at lower levels.
    for name in (
        "pynetdicom",
        "highdicom",
        "httpx",
        "httpcore",
        "uvicorn.access",
        "PIL",
        "matplotlib",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    pynetdicom_config.LOG_REQUEST_IDENTIFIERS = False
    pynetdicom_config.LOG_RESPONSE_IDENTIFIERS = False
