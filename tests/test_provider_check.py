"""The models file example and ``neurosandbox models check`` against the provider servers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from providers import AnthropicServer, GeminiServer, OllamaServer, OpenAICompatServer
from typer.testing import CliRunner

from evaluation.modelio import GenerateConfig, ImagePart, Message, TextPart
from evaluation.models import load_models_file
from evaluation.models.check import tiny_png
from evaluation.models.litellm_adapter import LiteLLMAdapter
from evaluation.models.providers import profile_for
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "models.example.yaml"
COLOUR = '{"colour": "red"}'
SERVERS = {
    "openai": lambda: OpenAICompatServer("openai", reply=COLOUR),
    "anthropic": lambda: AnthropicServer(reply=COLOUR),
    "gemini": lambda: GeminiServer(reply=COLOUR),
    "xai": lambda: OpenAICompatServer("xai", reply=COLOUR),
    "openrouter": lambda: OpenAICompatServer("openrouter", reply=COLOUR),
    "ollama": lambda: OllamaServer(models=("qwen2.5vl:7b",), reply=COLOUR),
    "vllm": lambda: OpenAICompatServer("vllm", reply=COLOUR),
}


def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
        "XAI_API_KEY",
        "OPENROUTER_API_KEY",
    ):
        monkeypatch.setenv(var, "test-key")


def _moved(api_base: str, root: str) -> str:
    """The example's api_base with its host moved to the loopback server (path kept)."""
    parts = urlsplit(api_base)
    return root + parts.path


def test_example_models_file_has_one_working_entry_per_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _keys(monkeypatch)
    specs = load_models_file(EXAMPLE)
    families = {name: profile_for(spec).family for name, spec in specs.items()}
    assert sorted(families.values()) == sorted(SERVERS)
    for name, spec in specs.items():
        hosted = families[name] not in ("ollama", "vllm")
        assert spec.api_base and (spec.api_key_env is not None) == hosted, name
    # Each entry's api_base, moved onto loopback with its path kept, reaches its provider's
    # endpoint: the example's bases are the shapes litellm needs.
    png = tiny_png()
    msg = [
        Message(
            role="user",
            content=[
                TextPart(text="Colour?"),
                ImagePart(png=png, sha256=hashlib.sha256(png).hexdigest()),
            ],
        )
    ]
    for name, spec in specs.items():
        with SERVERS[families[name]]() as server:
            moved = spec.model_copy(update={"api_base": _moved(spec.api_base or "", server.root)})
            out = asyncio.run(LiteLLMAdapter(moved).generate(msg, GenerateConfig(timeout_s=20)))
            assert server.problems() == [] and out.error is None, (name, out.error)
            assert out.text == COLOUR


def test_the_documented_example_is_the_tested_example_file() -> None:
    page = (EXAMPLE.parent / "providers.md").read_text()
    section = page.split("## The models file", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    fields = ("name", "model", "api_base", "api_key_env", "max_images_per_request")

    def entries(doc: str) -> list[dict[str, object]]:
        return [{k: e.get(k) for k in fields} for e in yaml.safe_load(doc)["models"]]

    # One entry per family, the same names, models, endpoints, keys and limits as the file
    # the test above sends requests with (docs/providers.md leaves out concurrency and timeouts).
    assert entries(block) == entries(EXAMPLE.read_text())


def _models_file(tmp: Path, entries: list[dict[str, object]]) -> Path:
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return path


def _check(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["models", "check", *args])
    # --json is standard output's alone: a log line (stderr) an earlier test's logging set-up
    # lets through must not break it
    return res.exit_code, res.stdout if "--json" in args else res.output


def test_models_check_reports_what_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _keys(monkeypatch)
    with AnthropicServer(reply=COLOUR) as server:
        f = _models_file(
            tmp_path,
            [
                {
                    "name": "claude",
                    "model": "anthropic/claude-sonnet-4-5",
                    "api_base": server.api_base,
                    "api_key_env": "ANTHROPIC_API_KEY",
                }
            ],
        )
        code, text = _check("claude", "--models-file", str(f))
        assert code == 0, text
        code, raw = _check("claude", "--models-file", str(f), "--json")
        (ex, _) = server.exchanges
    report = json.loads(raw)
    items = {i["name"]: i for i in report["items"]}
    assert report["ok"] and report["family"] == "anthropic" and report["latency_s"] > 0
    assert items["reachable"]["ok"] and items["images"]["ok"] and items["json_mode"]["ok"]
    assert items["cost"]["ok"] and "price map" in items["cost"]["detail"]
    assert "'red'" in items["image_seen"]["detail"]
    for word in ("reachable", "images", "json_mode", "cost", "works"):
        assert word in text
    # One tiny request: one image, the JSON-mode question.
    assert len(AnthropicServer.images(ex.body)) == 1 and "colour" in json.dumps(ex.body)


def test_models_check_fails_clearly_when_unreachable_images_rejected_or_key_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys(monkeypatch)
    monkeypatch.delenv("NS_MISSING_KEY", raising=False)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with OpenAICompatServer("vllm", limit_mm_per_prompt=0, reply=COLOUR) as text_only:
        f = _models_file(
            tmp_path,
            [
                {"name": "gone", "model": "hosted_vllm/medgemma", "api_base": dead},
                {"name": "blind", "model": "hosted_vllm/medgemma", "api_base": text_only.api_base},
                {"name": "nokey", "model": "openai/gpt-4o", "api_key_env": "NS_MISSING_KEY"},
            ],
        )
        gone = _check("gone", "--models-file", str(f), "--timeout", "5")
        blind = _check("blind", "--models-file", str(f))
        nokey = _check("nokey", "--models-file", str(f))
    assert gone[0] == 1 and "no answer from the endpoint" in gone[1] and "does not work" in gone[1]
    assert blind[0] == 1 and "image request was rejected" in blind[1]
    assert "At most 0 image(s)" in blind[1] and "text-only request was answered" in blind[1]
    assert nokey[0] == 1 and "NS_MISSING_KEY" in nokey[1]


def test_models_check_warns_on_json_and_unknown_price_and_strict_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys(monkeypatch)
    with OpenAICompatServer("xai", reply="The square is red.") as server:
        f = _models_file(
            tmp_path,
            [
                {
                    "name": "grok",
                    "model": "xai/grok-2-vision-1212",
                    "api_base": server.api_base,
                    "api_key_env": "XAI_API_KEY",
                }
            ],
        )
        loose = _check("grok", "--models-file", str(f), "--json")
        strict = _check("grok", "--models-file", str(f), "--strict")
    assert loose[0] == 0 and strict[0] == 1
    items = {i["name"]: i for i in json.loads(loose[1])["items"]}
    assert items["json_mode"]["ok"] is False and "not a JSON object" in items["json_mode"]["detail"]
    assert items["cost"]["ok"] is False and "not in litellm's price map" in items["cost"]["detail"]
