"""`neurosandbox runs index` lists the gateway's runs and the demo's, each with its source:

- a study sent by storescu to the gateway's DICOM node (the in-process gateway on the session
  Orthanc, the reference models): its run is in DATA_DIR/runs, listed as ``gateway`` in
  ``--json`` and in the table, beside a run of ``neurosandbox eval`` (``cli``);
- the demo's own path without ``make demo`` (gateway/cli/demo.py's helpers): its routing rule and
  gateway environment (``NEUROSANDBOX_RUN_SOURCE=demo`` among them) with a phantom suite as the
  registered cases, its ``neurosandbox serve`` process, storescu from the demo's AE and its wait
  for the run, one phantom case sent: the run is listed as ``demo``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from phantom_fixture import PhantomSuite
from typer.testing import CliRunner

from evaluation.log import CatalogEntry
from gateway.cli import app
from gateway.runs import RunStatus, StudyRunStore

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _index_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: Path) -> None:
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(data))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NEUROSANDBOX_DATABASE_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "300")


def _index() -> tuple[dict[str, CatalogEntry], str]:
    """The catalog by run id (``runs index --json``) and the table ``runs index`` prints."""
    res = CliRunner().invoke(app, ["runs", "index", "--json"])
    assert res.exit_code == 0, res.output
    entries = [CatalogEntry.model_validate(r) for r in json.loads(res.stdout)["runs"]]
    table = CliRunner().invoke(app, ["runs", "index"])
    assert table.exit_code == 0, table.output
    return {e.run_id: e for e in entries}, table.output


def _row_of(table: str, run_id: str) -> str:
    """The table's text from the run's id to the next row's rule (the source is under the id)."""
    at = table.index(run_id)
    return table[at : at + 2000]


@pytest.mark.integration
def test_a_study_sent_to_the_gateway_is_listed_as_a_gateway_run_beside_a_cli_run(
    orthanc_server: OrthancServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_helpers import write_nmb

    data = tmp_path / "data"
    routing = rules_file(tmp_path / "rules.yaml", ["differential"], "index")
    gw = start_gateway(orthanc_server, data, routing, 1.0)
    try:
        study = make_study(tmp_path / "study", classes=("FLAIR",), n_slices=4, patient_id="IDX-1")
        send(gw.scp.port, study.files)
        [run] = finished_runs(gw, 1, study.study_uid)
    finally:
        gw.stop()
    assert run.status is RunStatus.DONE, run

    _index_env(monkeypatch, tmp_path, data)
    suite, answers = write_nmb(tmp_path / "nmb", 2)
    out = tmp_path / "runs" / "cli-run"
    res = CliRunner().invoke(app, ["eval", "--suite", str(suite), "--answers", str(answers),
                                   "--samples", "1", "--no-bertscore", "--out", str(out),
                                   "--model", "reference/text-prior"])  # fmt: skip
    assert res.exit_code == 0, res.output

    entries, table = _index()
    assert len(entries) == 2, entries
    e = entries[run.run_id]
    assert e.source == "gateway" and e.status == "complete" and e.error is None
    assert e.run_dir and Path(e.run_dir).is_relative_to(data / "runs")
    assert run.route is not None and e.models == run.route.models == ["reference/image-rules"]
    assert e.dataset_hash and e.n_samples > 0
    assert {m.model for m in e.metrics} == set(e.models)
    assert e.cost.usd == 0.0 and e.cost.unknown_calls == 0  # the reference models: a known $0
    [cli] = [x for x in entries.values() if x.run_id != run.run_id]
    assert cli.source == "cli" and cli.run_dir == str(out)
    # the table names each run's source under its id
    assert "(gateway)" in _row_of(table, run.run_id)
    assert "(cli)" in _row_of(table, cli.run_id)
    # and the filter by model finds the gateway's run
    res = CliRunner().invoke(app, ["runs", "index", "--json", "--model", "reference/image-rules"])
    assert [r["run_id"] for r in json.loads(res.stdout)["runs"]] == [run.run_id]
    res = CliRunner().invoke(app, ["runs", "index", "--json", "--model", "reference/text-prior"])
    assert [r["run_id"] for r in json.loads(res.stdout)["runs"]] == [cli.run_id]


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_made_the_demos_way_is_listed_as_the_demos(
    orthanc_server: OrthancServer,
    phantom_suite: PhantomSuite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.cli import demo

    ep = orthanc_server.endpoints
    data = tmp_path / "var"
    settings = orthanc_server.settings.model_copy(update={"data_dir": data})
    out = tmp_path / "demo"
    out.mkdir()
    suite = phantom_suite.root  # the session's phantom suite (the demo's generator), one case sent
    models = demo.REFERENCE_MODELS
    routing = demo._routing(out, models, {"test": "index"}, ep.orthanc_aet)
    env = demo._gateway_env(settings, suite, routing)
    assert env["NEUROSANDBOX_RUN_SOURCE"] == "demo"
    env.update(  # the session Orthanc (the demo starts its own) and this process's code
        NEUROSANDBOX_ORTHANC_URL=ep.orthanc_url,
        NEUROSANDBOX_ORTHANC_PASSWORD_FILE=str(ep.password_file or ""),
        NEUROSANDBOX_GATEWAY_DICOM_PORT=str(ep.gateway_dicom_port),
        NEUROSANDBOX_API_PORT=str(ep.api_port),
        NEUROSANDBOX_ORTHANC_STABLE_AGE=orthanc_server.env["NEUROSANDBOX_ORTHANC_STABLE_AGE"],
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    env.pop("NEUROSANDBOX_DATABASE_URL", None)
    gw = demo.GatewayProcess(settings, data / "gateway.log")
    store = StudyRunStore(data)
    try:
        gw.start(env, f"http://127.0.0.1:{ep.api_port}")
        ms = phantom_suite.case_dir("ms").name
        [(case_id, uid, folder)] = [s for s in demo._studies(suite) if s[0] == ms]
        after = "0" * 16
        demo._send(folder, ep)
        runs = demo._wait_runs(store, {uid: case_id}, after, gw, 300)
    finally:
        gw.stop()
    run_id = runs[case_id]

    _index_env(monkeypatch, tmp_path, data)
    entries, table = _index()
    e = entries[run_id]
    assert e.source == "demo" and e.status == "complete" and e.error is None, e
    assert set(e.models) == set(models) and e.n_samples > 0
    assert e.metrics and all(m.n_scored > 0 for m in e.metrics)  # scored against the case's truth
    assert "(demo)" in _row_of(table, run_id)
    res = CliRunner().invoke(app, ["runs", "list"])
    assert res.exit_code == 0 and "demo" in res.output
