"""Model names from the API are the server's, never a client's path or provider string.

`POST /studies/{id}/evaluations` used to take any name from any token: `replay:/etc/passwd` was
read by the pipeline (its error said what the file was), `replay:<a named pipe>` hung the
pipeline, `replay:/dev/zero` would have been read without bound. Now starting an evaluation is
an admin action (a routing file may grant reviewers), and a model must be one the server
configures (reference models, models-file entries, the routing file's models; never a replay).
The replay loader of the command line opens only regular files, and reads them with a size cap.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from review_server import build_context

from evaluation import ModelConfigError
from evaluation.models import replay, resolve_specs
from evaluation.models.spec import BUILTIN
from gateway.api import GatewayContext, create_app
from gateway.auth import Role
from gateway.cache import InstanceCache
from gateway.orthanc import StudySummary
from gateway.pipeline import StudyPipeline
from gateway.routing import REFERENCE_MODELS, Router
from gateway.study_run import DefaultEvaluator

STUDY = "0123abcd-0123abcd-0123abcd-0123abcd-0123abcd"
URL = f"/studies/{STUDY}/evaluations"
MODELS_FILE = """models:
  - name: ward-vlm
    model: openai/gpt-4o
  - name: canned
    model: replay
    replay_file: /etc/passwd
"""
ROUTING = """{grant}rules:
  - name: mr
    match: {{modality: [MR]}}
    evaluate:
      models: [reference/image-rules, openai/routed-vlm, "replay:/etc/hostname"]
"""
GRANT = "api:\n  reviewers_may_evaluate: true\n"
ALLOWED = ["openai/routed-vlm", "reference/image-rules", "reference/text-prior", "ward-vlm"]


class StubOrthanc:
    """Orthanc with one study (the API looks the study up before it queues a run)."""

    def study(self, orthanc_id: str) -> StudySummary:
        return StudySummary(orthanc_id=orthanc_id, study_uid="1.2.3.4.5.6")

    def close(self) -> None:
        pass


def _context(tmp_path: Path, grant: bool = False) -> GatewayContext:
    routing = tmp_path / "routing.yaml"
    routing.write_text(ROUTING.format(grant=GRANT if grant else ""))
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_FILE)
    ctx = build_context(tmp_path / "data", routing_file=routing, models_file=models)
    ctx.orthanc = StubOrthanc()  # type: ignore[assignment]
    # A pipeline that is never started: an accepted evaluation stays queued, nothing runs.
    ctx.pipeline = StudyPipeline(
        ctx.orthanc,
        DefaultEvaluator(ctx.settings),
        Router.from_file(routing),
        ctx.runs,
        ctx.audit,
        InstanceCache(tmp_path / "cache"),
    )
    return ctx


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "answers.jsonl"
    os.mkfifo(path)
    return path


def _hostile(fifo: Path) -> list[str]:
    return [
        "replay:/etc/passwd",
        f"replay:{fifo}",
        "replay:/dev/zero",
        "replay:/etc/hostname",  # named by the routing file: still not for the API
        "canned",  # a models-file replay entry: not for the API either
        "openai/gpt-4o",  # a provider string the server does not list
        "hosted_vllm/../../etc/passwd",
        "etc/passwd",
    ]


def _post(c: TestClient, token: str, models: list[str]) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = c.post(URL, json={"models": models}, headers={"Authorization": f"Bearer {token}"})
    return r.status_code, r.text, time.monotonic() - t0


def _leaks(text: str) -> list[str]:
    """What a refusal must never say: file content, or what a path is."""
    hostname = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else ""
    marks = ["root:", "/bin/", "named pipe", "character device", "not JSON", "No such file"]
    return [m for m in [*marks, hostname] if m and m in text]


def test_a_reviewer_without_the_routing_grant_may_not_start_any_evaluation(
    tmp_path: Path, fifo: Path
) -> None:
    ctx = _context(tmp_path)
    _, reviewer = ctx.tokens.create(Role.REVIEWER, "r", "Reviewer^Test")
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        for name in [*_hostile(fifo), "reference/image-rules"]:
            code, text, took = _post(c, reviewer, [name])
            assert code == 403, (name, code, text)
            assert "admin" in text and not _leaks(text), (name, text)
            assert took < 5, (name, took)
    assert ctx.runs.list() == []  # nothing was queued, no path was touched


def test_an_admin_may_name_only_configured_models_and_is_told_which(
    tmp_path: Path, fifo: Path
) -> None:
    ctx = _context(tmp_path)
    _, admin = ctx.tokens.create(Role.ADMIN, "a")
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        for name in _hostile(fifo):
            code, text, took = _post(c, admin, ["reference/image-rules", name])
            # 403, not 400/422: the request is schema-valid, the server's policy refuses it
            assert code == 403 and "admin token" not in text, (name, code, text)
            assert not _leaks(text), (name, text)
            assert all(m in text for m in ALLOWED), text  # the refusal names the allowed ones
            assert took < 5, (name, took)
        assert ctx.runs.list() == []
        code, text, _ = _post(c, admin, ["reference/image-rules", "ward-vlm", "openai/routed-vlm"])
        assert code == 202, text
    (run,) = ctx.runs.list()
    assert run.route is not None
    assert run.route.models == ["reference/image-rules", "ward-vlm", "openai/routed-vlm"]


def test_the_routing_file_may_grant_reviewers_configured_models_only(
    tmp_path: Path, fifo: Path
) -> None:
    ctx = _context(tmp_path, grant=True)
    _, reviewer = ctx.tokens.create(Role.REVIEWER, "r", "Reviewer^Test")
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        for name in _hostile(fifo):
            code, text, _ = _post(c, reviewer, [name])
            assert code == 403 and not _leaks(text), (name, code, text)
            assert all(m in text for m in ALLOWED), text
        code, text, _ = _post(c, reviewer, ["reference/text-prior", "ward-vlm"])
        assert code == 202, text
    assert [r.requested_by for r in ctx.runs.list()] == [ctx.tokens.list()[0].id]


def test_the_gateway_knows_the_engine_reference_models() -> None:
    assert set(REFERENCE_MODELS) == set(BUILTIN)


# --------------------------------------------------------------------------- command line


def _unblock(path: Path) -> None:
    """Open the pipe's write end (and close it): a reader blocked in open() gets EOF."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_replay_of_a_named_pipe_is_refused_without_opening_it(fifo: Path) -> None:
    with pytest.raises(ModelConfigError, match="not a regular file"):
        resolve_specs([f"replay:{fifo}"])
    errors: list[BaseException] = []

    def load() -> None:
        try:
            replay.load_answers(fifo)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    hung = t.is_alive()
    _unblock(fifo)
    t.join(5)
    assert not hung, "the replay loader blocked on a named pipe"
    assert len(errors) == 1 and isinstance(errors[0], ModelConfigError), errors
    assert "not a regular file" in str(errors[0])


def test_replay_of_dev_zero_is_refused_before_reading() -> None:
    # In a child process under a 2 GB address-space limit: the old loader read it unbounded.
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from pathlib import Path\n"
        "from evaluation.models.replay import load_answers\n"
        "from evaluation import ModelConfigError\n"
        "try:\n"
        "    load_answers(Path('/dev/zero'))\n"
        "except ModelConfigError as exc:\n"
        "    print('refused:', exc)\n"
    )
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the replay loader kept reading /dev/zero for 60 s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused:" in out.stdout and "not a regular file" in out.stdout, out.stdout
    assert time.monotonic() - t0 < 30


def test_a_replay_file_over_the_size_cap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = '{"case_id": "c", "task": "differential", "sample": 0, "text": "%s"}\n'
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_text(line % "ok")
    big.write_text(line % ("x" * 5000))
    monkeypatch.setattr(replay, "MAX_REPLAY_BYTES", 1000)
    assert replay.load_answers(small) == {("c", "differential", 0, None): "ok"}
    with pytest.raises(ModelConfigError, match="over the 1000-byte cap"):
        replay.load_answers(big)


def test_a_models_file_error_names_the_entry_and_the_field_as_people_write_them(
    tmp_path: Path,
) -> None:
    from evaluation.models import load_models_file

    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  - name: ok\n  - name: bad\n    max_retries: lots\n"
        "    max_images_per_request: -1\n"
    )
    with pytest.raises(ModelConfigError) as err:
        load_models_file(path)
    said = str(err.value)
    assert f"models file {path}, entry 2: max_retries: Input should be a valid integer" in said
    assert "('" not in said  # not a Python tuple
