"""One ``atomic_write`` (dicom/atomic.py): a reader sees the old content or the new, never half,
and a failed write leaves no temporary file. No other module renames a temporary file of its
own over a target; the renames left are moves of whole folders or of files already complete
(listed below, each with why)."""

from __future__ import annotations

import ast
import stat
import zipfile
from pathlib import Path

import pytest

from dicom import atomic_write

ROOT = Path(__file__).resolve().parents[1]

# (module, function, call): renames that are not a write of the module's own temporary file
RENAMES = {
    ("gateway/pacs/dicomweb.py", "keep", "os.replace(self.tmp, final)"): (
        "names an instance streamed from a WADO-RS answer by the hash of its bytes"
    ),
    ("dicom/atomic.py", "_atomic_write", "os.replace(tmp, dest)"): "the helper itself",
    ("evaluation/datasets/rendering.py", "render_study", "os.replace(tmp, folder)"): (
        "publishes a rendered study's folder"
    ),
    (
        "evaluation/datasets/rendering.py",
        "_render_round",
        "os.replace(folder / img.file, out / name)",
    ): "moves finished PNGs between folders",
    ("gateway/cli/export.py", "_publish", "os.rename(work, out)"): (
        "renames the checked bundle folder into place (refusing one that appeared)"
    ),
    ("gateway/runs/report.py", "publish", "shutil.move(checklist.folder, tmp)"): (
        "moves a report bundle folder beside its final place"
    ),
    ("gateway/runs/report.py", "publish", "os.replace(tmp, final)"): "publishes that folder",
    ("gateway/runs/report.py", "republish", "os.replace(final, old)"): (
        "swaps a rebuilt report bundle folder in"
    ),
    ("gateway/runs/report.py", "republish", "os.replace(tmp, final)"): "(the same swap)",
    ("gateway/scp.py", "_recover", "os.replace(d, target)"): (
        "renames a recovered spool study folder to its key"
    ),
    ("gateway/scp.py", "_place", "os.replace(f.path, dest)"): (
        "moves staged instances into their study folder"
    ),
    ("gateway/spool.py", "quarantine", "os.replace(folder, dest)"): "moves a staging folder aside",
    ("gateway/scp.py", "remove_committed_staging", "os.replace(staging, done)"): (
        "renames a committed staging folder before removing it (a late journal line finds none)"
    ),
    # The C-STORE hot path: its fsync may be deferred to the association's batch *after* the
    # rename (FsyncPolicy "association": the fd is handed to a syncer thread), which a context
    # manager that closes its file before the rename cannot do.
    ("gateway/spool.py", "write_instance", "os.replace(tmp, dest)"): (
        "a spooled instance, its fsync deferred past the rename"
    ),
}


def test_the_target_is_the_new_content_after_the_block(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "x.bin"
    with atomic_write(dest) as fh:
        fh.write(b"one")
        assert not dest.exists()  # nothing published before the block ends
    assert dest.read_bytes() == b"one"
    with atomic_write(dest, "w", fsync=False) as fh:
        fh.write("twø")
    assert dest.read_text(encoding="utf-8") == "twø"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["x.bin"]


@pytest.mark.parametrize("mode", ["wb", "w", "w+b"])
def test_an_error_in_the_block_leaves_the_old_content_and_no_temporary_file(
    tmp_path: Path, mode: str
) -> None:
    dest = tmp_path / "x"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="sender went away"), atomic_write(dest, mode) as fh:  # type: ignore[call-overload]
        fh.write(b"half" if "b" in mode else "half")
        fh.flush()
        raise RuntimeError("sender went away")
    assert dest.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_a_failure_while_publishing_leaves_no_temporary_file(tmp_path: Path) -> None:
    dest = tmp_path / "is-a-folder"
    dest.mkdir()
    (dest / "keep").write_text("k")
    with pytest.raises(OSError), atomic_write(dest) as fh:
        fh.write(b"new")  # the rename over a non-empty folder fails after the block
    assert (dest / "keep").read_text() == "k"
    assert [p.name for p in tmp_path.iterdir()] == ["is-a-folder"]


def test_nothing_new_appears_when_the_first_write_fails(tmp_path: Path) -> None:
    dest = tmp_path / "new.json"
    with pytest.raises(ValueError), atomic_write(dest, "w") as fh:
        fh.write("{")
        raise ValueError("not serialisable")
    assert list(tmp_path.iterdir()) == []


def test_a_secret_is_never_readable_by_others_not_even_while_written(tmp_path: Path) -> None:
    dest = tmp_path / "secret"
    with atomic_write(dest, "w", perm=0o600) as fh:
        (tmp,) = [p for p in tmp_path.iterdir() if p.name.startswith(".secret.")]
        assert stat.S_IMODE(tmp.stat().st_mode) & 0o077 == 0
        fh.write("s3cret")
    assert stat.S_IMODE(dest.stat().st_mode) & 0o077 == 0


def test_the_block_may_read_back_what_it_wrote_before_it_is_published(tmp_path: Path) -> None:
    dest = tmp_path / "bundle.zip"
    with atomic_write(dest, "w+b", fsync=False) as fh:
        with zipfile.ZipFile(fh, "w") as zf:
            zf.writestr("a/b.txt", "x")
        fh.seek(0)
        with zipfile.ZipFile(fh) as zf:
            assert zf.testzip() is None
    with zipfile.ZipFile(dest) as zf:
        assert zf.read("a/b.txt") == b"x"


def test_a_temporary_folder_of_its_own_and_a_bad_mode(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    with atomic_write(tmp_path / "out" / "x", tmp_dir=staging) as fh:
        fh.write(b"x")
        assert len(list(staging.iterdir())) == 1
    assert (tmp_path / "out" / "x").read_bytes() == b"x" and list(staging.iterdir()) == []
    with pytest.raises(ValueError, match="mode"):
        atomic_write(tmp_path / "y", "a")  # type: ignore[call-overload]


def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """O_EXCL | O_NOFOLLOW: the temporary name is random, and even a planted link is refused."""
    import uuid

    victim = tmp_path / "victim"
    victim.write_text("v")
    fixed = uuid.UUID(int=1)
    (tmp_path / f".x.{fixed.hex}.part").symlink_to(victim)
    mp = pytest.MonkeyPatch()
    mp.setattr(uuid, "uuid4", lambda: fixed)
    try:
        with pytest.raises(FileExistsError), atomic_write(tmp_path / "x") as fh:
            fh.write(b"evil")
    finally:
        mp.undo()
    assert victim.read_text() == "v"


# ----------------------------------------------------------------- former hand-written copies


def test_former_copies_write_through_the_helper(tmp_path: Path) -> None:
    from evaluation.datasets.images import cache_png
    from gateway.pacs_local import write_secret

    path, _ = cache_png(b"\x89PNG fake", tmp_path / "cache")
    assert path.read_bytes() == b"\x89PNG fake"
    write_secret(tmp_path / "s" / "pw", "hunter2")
    assert (tmp_path / "s" / "pw").read_text() == "hunter2"
    assert stat.S_IMODE((tmp_path / "s" / "pw").stat().st_mode) == 0o600
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith((".part", ".tmp"))]
    assert leftovers == []


def _renames(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, call) of every rename in ``source``: os.replace/rename/renames,
    shutil.move, and ``x.replace(y)`` / ``x.rename(y)`` (Path's; str.replace takes two)."""
    tree = ast.parse(source)
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        named = isinstance(f.value, ast.Name) and (f.value.id, f.attr) in {
            ("os", "replace"),
            ("os", "rename"),
            ("os", "renames"),
            ("shutil", "move"),
        }
        path_like = (
            f.attr in ("replace", "rename")
            and len(node.args) == 1
            and not node.keywords
            and not isinstance(f.value, ast.Constant)
        )
        if named or path_like:
            q: ast.AST = node
            while q in parents and not isinstance(q, ast.FunctionDef | ast.AsyncFunctionDef):
                q = parents[q]
            out.append((node.lineno, getattr(q, "name", "<module>"), ast.unparse(node)))
    return out


def test_no_module_renames_a_temporary_file_of_its_own() -> None:
    found: set[tuple[str, str, str]] = set()
    offenders = []
    for top in ("dicom", "evaluation", "gateway"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, func, call in _renames(path.read_text()):
                if (rel, func, call) in RENAMES:
                    found.add((rel, func, call))
                else:
                    offenders.append(f"{rel}:{line} in {func}: {call}")
    assert offenders == [], "write through dicom.atomic_write"
    assert found == set(RENAMES), f"allowed renames gone: {sorted(set(RENAMES) - found)}"


def test_the_scan_sees_the_shapes_of_a_hand_written_copy() -> None:
    src = (
        "import os\n"
        "def f(p, tmp):\n"
        "    tmp.write_text('x')\n"
        "    tmp.replace(p)\n"
        "def g(p, tmp):\n"
        "    os.replace(tmp, p)\n"
        "def h(s):\n"
        "    return s.replace('a', 'b')\n"
    )
    assert [(f, c) for _, f, c in _renames(src)] == [
        ("f", "tmp.replace(p)"),
        ("g", "os.replace(tmp, p)"),
    ]
