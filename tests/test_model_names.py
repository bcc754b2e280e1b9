"""Model names are checked before the first call: an unknown reference name, a models-file key
nobody reads, a name litellm cannot route; and ``models check`` asks the endpoint what it serves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from openai_server import OpenAIServer, Script
from typer.testing import CliRunner

from evaluation.errors import ModelConfigError
from evaluation.models import load_models_file, resolve_specs
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
COLOUR = '{"colour": "red"}'


def _models_file(tmp: Path, entries: list[dict[str, object]], **top: object) -> Path:
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump({"models": entries, **top}))
    return path


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("reference/image-rule", "reference/image-rules"),
        ("reference/text_prior", "reference/text-prior"),
        ("Reference/Image-Rules", "reference/image-rules"),
    ],
)
def test_an_unknown_reference_name_is_refused_with_the_one_it_could_be(
    name: str, meant: str
) -> None:
    with pytest.raises(ModelConfigError) as err:
        resolve_specs([name])
    text = str(err.value)
    assert name in text and f"did you mean {meant!r}" in text


def test_a_models_file_entry_naming_a_misspelt_reference_model_is_refused(tmp_path: Path) -> None:
    f = _models_file(tmp_path, [{"name": "baseline", "model": "reference/image-rule"}])
    with pytest.raises(ModelConfigError, match=r"entry 1.*did you mean 'reference/image-rules'"):
        load_models_file(f)


def test_a_models_file_key_nobody_reads_is_refused_with_the_key_it_could_be(
    tmp_path: Path,
) -> None:
    entry = {"name": "vlm", "model": "openai/vlm", "api_bse": "http://127.0.0.1:9/v1"}
    with pytest.raises(ModelConfigError) as err:
        load_models_file(_models_file(tmp_path, [entry]))
    text = str(err.value)
    assert "entry 1" in text and "api_bse" in text and "did you mean 'api_base'" in text
    # a top-level key other than 'models' is refused too
    good = {"name": "vlm", "model": "openai/vlm"}
    with pytest.raises(ModelConfigError, match=r"'defaults'.*only 'models'"):
        load_models_file(_models_file(tmp_path, [good], defaults={"concurrency": 2}))
    # what is passed on to litellm stays free: 'extra' is not checked key by key
    extra = {"name": "vlm", "model": "openai/vlm", "extra": {"anything_litellm_takes": 1}}
    assert load_models_file(_models_file(tmp_path, [extra]))["vlm"].extra


def test_a_name_litellm_cannot_route_is_refused_with_what_it_could_be(tmp_path: Path) -> None:
    f = _models_file(tmp_path, [{"name": "vlm-stroke", "model": "openai/stroke-vlm"}])
    with pytest.raises(ModelConfigError) as err:
        resolve_specs(["vlm-strok"], models_file=f)
    text = str(err.value)
    assert "did you mean 'vlm-stroke'" in text and str(f) in text
    # no models file: the providers it could be, by their prefix
    with pytest.raises(ModelConfigError) as err:
        resolve_specs(["vlm-strok"], api_base="http://127.0.0.1:9/v1")
    text = str(err.value)
    assert "no provider prefix" in text
    for route in ("openai/vlm-strok", "hosted_vllm/vlm-strok", "ollama_chat/vlm-strok"):
        assert route in text
    # a prefix that is no provider of litellm's
    with pytest.raises(ModelConfigError, match=r"'opanai' is not a provider.*'openai'"):
        resolve_specs(["opanai/gpt-4o"])
    # a misspelt known model: litellm's own names
    with pytest.raises(ModelConfigError, match=r"did you mean 'gpt-4o-mini'"):
        resolve_specs(["gpt-4o-minii"])
    # names litellm routes pass as before
    names = ["gpt-4o", "openai/my-vlm", "hosted_vllm/medgemma", "anthropic/claude-sonnet-4-5"]
    assert [s.name for s in resolve_specs(names)] == names


def test_eval_refuses_a_misspelt_model_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NEUROSANDBOX_MODELS_FILE", raising=False)
    suite = tmp_path / "suite"
    suite.mkdir()
    with OpenAIServer(Script()) as server:
        for name in ("vlm-strok", "reference/image-rule"):
            res = CliRunner().invoke(
                app,
                [
                    "eval",
                    "--suite",
                    str(suite),
                    "--out",
                    str(tmp_path / name.replace("/", "_")),
                    "--model",
                    name,
                    "--api-base",
                    server.url,
                ],
            )
            assert res.exit_code == 2, res.output
            assert "loading dataset" not in res.output
            assert name in _flat(res.output)
        assert server.stats.calls == 0


def _check(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["models", "check", *args])
    return res.exit_code, res.output


def test_models_check_fails_for_a_model_the_endpoint_does_not_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("NEUROSANDBOX_MODELS_FILE", raising=False)
    served = ["stroke-vlm", "qwen2.5-vl-7b"]
    with OpenAIServer(Script(default_reply=COLOUR, models=served)) as server:
        wrong = _check("openai/stroke-vml", "--api-base", server.url, "--json")
        right = _check("openai/stroke-vlm", "--api-base", server.url, "--json")
        shown = _check("openai/stroke-vml", "--api-base", server.url)
    assert wrong[0] == 1 and right[0] == 0, (wrong, right)
    items = {i["name"]: i for i in json.loads(wrong[1])["items"]}
    assert items["served"]["level"] == "fail"
    detail = items["served"]["detail"]
    assert "stroke-vml" in detail and "did you mean 'stroke-vlm'" in detail
    assert "qwen2.5-vl-7b" in detail  # what it does serve
    assert "does not work" in shown[1] and "not served" in _flat(shown[1])
    ok = {i["name"]: i for i in json.loads(right[1])["items"]}
    assert ok["served"]["level"] == "ok"


def test_models_check_says_unchecked_when_the_endpoint_lists_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("NEUROSANDBOX_MODELS_FILE", raising=False)
    with OpenAIServer(Script(default_reply=COLOUR)) as server:
        code, raw = _check("openai/any-vlm", "--api-base", server.url, "--json")
    assert code == 0, raw
    items = {i["name"]: i for i in json.loads(raw)["items"]}
    assert items["served"]["level"] == "info" and "unchecked" in items["served"]["detail"]
