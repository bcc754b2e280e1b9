"""Only regular files are read: a named pipe or a symlink to /dev/zero inside a folder is a
per-file error (the walk never blocks on it) and the study beside it is indexed; given
directly, such a path is an error, not an empty result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gateway_synth import make_study

from dicom import index_path

pytestmark = pytest.mark.timeout(30)


def test_special_files_in_a_folder_are_per_file_errors(tmp_path: Path) -> None:
    study = make_study(tmp_path / "in" / "study", classes=("FLAIR",), n_slices=4)
    os.mkfifo(tmp_path / "in" / "pipe.dcm")
    (tmp_path / "in" / "zero.dcm").symlink_to("/dev/zero")
    index = index_path(tmp_path / "in")
    assert {s.series_uid for s in index.series} == set(study.series_uids.values())
    errors = {Path(e.path).name: e for e in index.errors}
    assert {"pipe.dcm", "zero.dcm"} <= set(errors), index.errors
    assert "named pipe" in errors["pipe.dcm"].message
    assert "device" in errors["zero.dcm"].message


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_special_file_given_directly_is_an_error(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.dcm"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    index = index_path(path)
    assert index.series == [] and len(index.errors) == 1
    assert "only regular files are read" in index.errors[0].message


def test_inspect_of_a_named_pipe_says_so_and_exits_1(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "pipe.dcm"
    os.mkfifo(path)
    cli = Path(sys.executable).with_name("neurosandbox")
    r = subprocess.run([str(cli), "inspect", str(path)], capture_output=True, text=True, timeout=25)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "named pipe" in " ".join(r.stdout.split())
