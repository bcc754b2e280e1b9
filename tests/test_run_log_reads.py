"""Everything reads the run log: one C-STORE study through the in-process gateway (real storescu,
the session Orthanc, the built-in evaluator), then the review queue, the case page, the API's
``/runs/{id}/report.json`` and re-issue read the run's store, never its report bundle.

- ``neurosandbox runs rescore`` with a changed parsing rule changes what ``/review`` shows for
  the case (the queue read the published ``rundata.json`` before: it kept the old answers);
- the published ``rundata.json`` deleted: the queue, the case page, ``report.json`` and a
  sign-off that re-issues the VERIFIED SR to the PACS still work;
- every file the run leaves under the data folder is listed: the run log is the one source;
  the exports (the bundle's JSON, HTML, checklists) corrupted, every reader still gives the
  run as the log holds it.

Each test runs on both engines of the run log: the run folder's ``run.sqlite``, and the
install's PostgreSQL (``NEUROSANDBOX_DATABASE_URL``; a server the tests start), where the run
folder holds only the marker naming the run's rows.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from pg_server import fresh_pg_database
from review_server import bearer
from typer.testing import CliRunner

from evaluation.log import RunData, upgrade
from evaluation.parsing import ParsedAnswer
from evaluation.reports import case_slug
from evaluation.scores import ParseStatus
from gateway.api import create_app
from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway

pytestmark = pytest.mark.integration
PLANTED = "NSBX-RULE-CHANGED no diagnosis key under the new rule"


@dataclass
class World:
    gw: Gateway
    client: TestClient
    data: Path
    run: RunRecord
    case_id: str
    database_url: str | None  # the install's PostgreSQL run log; None: run.sqlite per run

    @property
    def run_dir(self) -> Path:
        return self.gw.ctx.runs.run_dir(self.run.run_id)

    @property
    def bundle(self) -> Path:
        return self.gw.ctx.runs.report_folder(self.run.run_id)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine_url(request: pytest.FixtureRequest) -> str | None:
    """The run log of the test's gateway: None (a run.sqlite per run) or a fresh PostgreSQL
    database, migrated as `neurosandbox db upgrade` does."""
    if request.param == "sqlite":
        return None
    url = fresh_pg_database(request.getfixturevalue("pg_url"))
    upgrade(url)
    return url


@pytest.fixture
def world(
    orthanc_server: OrthancServer,
    tmp_path: Path,
    engine_url: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    study = make_study(tmp_path / "study", classes=("FLAIR",), n_slices=4, patient_id="NSBX-LOG-1")
    data = tmp_path / "data"
    routing = rules_file(tmp_path / "rules.yaml", ["differential"], "log")
    if engine_url is not None:  # what the CLI's commands read (`runs rescore`)
        monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", engine_url)
    gw = start_gateway(orthanc_server, data, routing, 1.0, database_url=engine_url)
    try:
        send(gw.scp.port, study.files)
        [run] = finished_runs(gw, 1, study.study_uid)
        assert run.status is RunStatus.DONE, run
        with TestClient(create_app(gw.ctx), base_url="http://testserver") as client:
            client.headers.update(bearer(gw.ctx, "Dr Log", "Log^Lena"))
            svc_run = _report_json(client, run.run_id)
            [case] = svc_run.cases
            yield World(gw, client, data, run, case.case_id, engine_url)
    finally:
        gw.stop()


def _report_json(client: TestClient, run_id: str) -> RunData:
    r = client.get(f"/runs/{run_id}/report.json")
    assert r.status_code == 200, r.text[:300]
    return RunData.model_validate_json(r.content)


def _row(client: TestClient, run_id: str, case_id: str) -> str:
    page = client.get("/review")
    assert page.status_code == 200
    rows = re.findall(r'<tr class="queue-row[^"]*"[^>]*>.*?</tr>', page.text, re.S)
    mine = [r for r in rows if f'data-run="{run_id}"' in r and f'data-case="{case_id}"' in r]
    assert len(mine) == 1, page.text[:3000]
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", mine[0])).split())


def _new_rule(text: str, family: object, **_: object) -> ParsedAnswer:
    """A parsing rule changed since the run: no answer passes it."""
    return ParsedAnswer(status=ParseStatus.FORMAT_FAILURE, error=PLANTED)


def test_rescore_changes_what_the_review_queue_shows_for_the_case(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.cli import app

    before = _row(world.client, world.run.run_id, world.case_id)
    assert "NSBX-RULE-CHANGED" not in before and "failed the answer format" not in before
    samples = _report_json(world.client, world.run.run_id).samples
    assert samples and all(s.scored.status is ParseStatus.OK for s in samples)

    monkeypatch.setattr("evaluation.scoring_bridge.parse_answer", _new_rule)
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(world.data))
    out = CliRunner().invoke(app, ["runs", "rescore", str(world.run_dir)])
    assert out.exit_code == 0, out.output

    after = _row(world.client, world.run.run_id, world.case_id)
    assert "failed the answer format" in after and "NSBX-RULE-CHANGED" in after, after
    run = _report_json(world.client, world.run.run_id)
    assert all(s.scored.status is ParseStatus.FORMAT_FAILURE for s in run.samples)
    # the case page shows the rescored answers too
    page = world.client.get(f"/review/runs/{world.run.run_id}/cases/{case_slug(world.case_id)}")
    assert page.status_code == 200 and "NSBX-RULE-CHANGED" in unescape(page.text)
    # and the published bundle (an export) was rebuilt from the log
    exported = RunData.model_validate_json((world.bundle / "rundata.json").read_bytes())
    assert all(s.scored.status is ParseStatus.FORMAT_FAILURE for s in exported.samples)
    assert exported.config["gateway"]["run_id"] == world.run.run_id


def _accept_all_and_sign_off(world: World, models: list[str]) -> None:
    url = f"/review/api/runs/{world.run.run_id}/cases/{case_slug(world.case_id)}"
    c = world.client
    for model in models:
        r = c.post(f"{url}/accept-remaining", json={"model": model})
        assert r.status_code in (200, 409), r.text
    preview = c.get(f"{url}/signoff").json()
    assert preview["missing"] == [], preview
    r = c.post(f"{url}/signoff", json={"digest": preview["digest"]})
    assert r.status_code == 200, r.text[:500]


def test_without_the_published_rundata_json_queue_page_api_and_reissue_work(world: World) -> None:
    from gateway.review.reissue import stored_srs

    (world.bundle / "rundata.json").unlink()
    row = _row(world.client, world.run.run_id, world.case_id)
    assert world.case_id in row
    slug = case_slug(world.case_id)
    page = world.client.get(f"/review/runs/{world.run.run_id}/cases/{slug}")
    assert page.status_code == 200, page.text[:300]
    run = _report_json(world.client, world.run.run_id)
    assert run.run_id == world.run.run_id and [c.case_id for c in run.cases] == [world.case_id]
    assert run.config["gateway"]["unverified_sr"], run.config  # the write-back's SR per model
    images = world.client.get(f"/runs/{world.run.run_id}/images")
    assert images.status_code == 200 and images.json()

    study_uid = world.run.study_uid or ""
    assert stored_srs(world.gw.ctx.orthanc, study_uid, "sr-verified") == []
    _accept_all_and_sign_off(world, sorted({s.scored.model for s in run.samples}))
    verified = stored_srs(world.gw.ctx.orthanc, study_uid, "sr-verified")
    assert verified and all(d.VerificationFlag == "VERIFIED" for d in verified)
    # the VERIFIED SR names the UNVERIFIED one of the run as its predecessor
    named = set(run.config["gateway"]["unverified_sr"].values())
    assert named


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_one_study_leaves_one_source_the_run_log_and_exports_never_read_back(
    world: World,
) -> None:
    run_id = world.run.run_id
    files = _files(world.data)
    run_files = [f for f in files if run_id in f]
    sources = [f for f in run_files if f.startswith(f"runs/{run_id}/run.sqlite")]
    if world.database_url is None:
        assert sources, run_files
    else:  # the rows are in the install's database; the folder names them
        assert not sources, run_files
        sources = [f"runs/{run_id}/run.db.json"]
        assert sources[0] in run_files
    exports = [f for f in run_files if f.startswith(f"reports/{run_id}/")]
    assert f"reports/{run_id}/rundata.json" in exports
    assert any(f.endswith(".html") for f in exports) and any(f.endswith(".json") for f in exports)
    # what else the run leaves: its rendered images and SR copies beside the log (served by the
    # API, named as predecessors), the study's state; no second record of the run's answers
    others = [f for f in run_files if f not in sources and f not in exports]
    for f in others:
        assert not f.endswith(("rundata.json", "run.json")), f
    # the SR's evidence is in the run's record (GatewayRun.evidence), not a file of its own
    assert not [f for f in files if f.endswith("evidence.json")], files
    print("\n".join(["sources:", *sources, "exports:", *exports, "beside the log:", *others]))

    truth = _report_json(world.client, run_id)
    queue_before = _row(world.client, run_id, world.case_id)
    page_before = world.client.get(f"/review/runs/{run_id}/cases/{case_slug(world.case_id)}")
    # corrupt every JSON and HTML export of the run: a reader of an export would now fail or
    # show the planted text
    for f in exports:
        p = world.data / f
        if p.suffix in (".json", ".html"):
            p.write_text('{"planted": "NSBX-EXPORT-READ-BACK"}')
    after = _report_json(world.client, run_id)
    assert after.model_dump() == truth.model_dump()
    assert _row(world.client, run_id, world.case_id) == queue_before
    page = world.client.get(f"/review/runs/{run_id}/cases/{case_slug(world.case_id)}")
    assert page.status_code == 200 and "NSBX-EXPORT-READ-BACK" not in page.text
    assert page.text == page_before.text
    # the bundle gone altogether: the run is still in the queue, from its log
    shutil.rmtree(world.bundle)
    assert _row(world.client, run_id, world.case_id) == queue_before
    assert json.loads(world.client.get(f"/runs/{run_id}/report.json").content)["run_id"] == run_id


@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
def test_a_run_made_on_sqlite_is_reviewed_and_rescored_after_the_switch_to_postgresql(
    world: World, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.cli import app

    url = fresh_pg_database(pg_url)
    upgrade(url)
    runs = world.gw.ctx.runs
    run_id = world.run.run_id
    truth = _report_json(world.client, run_id)
    before = _row(world.client, run_id, world.case_id)
    # the install switches to PostgreSQL (NEUROSANDBOX_DATABASE_URL): a run made since ...
    runs.database_url = url
    newer = runs.new_id()
    runs.create(RunRecord(run_id=newer, trigger="api", status=RunStatus.DONE))
    # ... is listed first, the run of before from its run.sqlite after it
    assert runs.ids() == [newer, run_id] and [r.run_id for r in runs.list()] == [newer, run_id]
    assert _report_json(world.client, run_id).model_dump() == truth.model_dump()
    assert _row(world.client, run_id, world.case_id) == before
    # `runs rescore` on the PostgreSQL install rescores it in its file, and the queue shows it
    monkeypatch.setattr("evaluation.scoring_bridge.parse_answer", _new_rule)
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(world.data))
    monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", url)
    out = CliRunner().invoke(app, ["runs", "rescore", str(world.run_dir)])
    assert out.exit_code == 0, out.output
    assert "NSBX-RULE-CHANGED" in _row(world.client, run_id, world.case_id)
    assert not (world.run_dir / "run.db.json").exists()  # never moved half into the database
