"""DICOM objects checked by the field's validator: dicom3tools' dciodvfy (Debian `dicom3tools`)."""

from __future__ import annotations

import io
import subprocess
import tempfile
from pathlib import Path

import pydicom

DCIODVFY = "/usr/bin/dciodvfy"


def dciodvfy_errors(obj: pydicom.Dataset | bytes | Path) -> list[str]:
    """The "Error" lines dciodvfy prints for one object (warnings are not errors)."""
    if isinstance(obj, pydicom.Dataset):
        buf = io.BytesIO()
        pydicom.dcmwrite(buf, obj, enforce_file_format=True)
        obj = buf.getvalue()
    with tempfile.TemporaryDirectory() as tmp:
        path = obj if isinstance(obj, Path) else Path(tmp) / "object.dcm"
        if not isinstance(obj, Path):
            path.write_bytes(obj)
        r = subprocess.run([DCIODVFY, str(path)], capture_output=True, text=True, timeout=60)
    lines = (r.stdout + r.stderr).splitlines()
    return [ln for ln in lines if ln.startswith("Error")]


def assert_dciodvfy_clean(obj: pydicom.Dataset | bytes | Path) -> None:
    errors = dciodvfy_errors(obj)
    assert not errors, "dciodvfy: " + "\n".join(errors)
