"""Ollama's native chat API (``POST /api/chat``), checked as an Ollama server does.

(``/api/generate``, litellm's ``ollama/`` route, is answered too; ``/api/show`` describes a
model, as litellm asks it to.)

Checks: ``messages`` with string ``content`` and ``images`` as raw base64 (Ollama decodes them
as base64 and fails on a ``data:`` URL: "illegal base64 data at input byte 4"); ``stream``
false; decoding in ``options`` (``temperature``, ``top_p``, ``num_predict``, ``seed``); the
model must be "pulled" (404 otherwise). Vision models of the ``mllama`` family (Llama 3.2
Vision) take one image per message, with Ollama's own error otherwise. :meth:`sequence`
places images where Ollama's prompt builder does: at ``[img]`` markers in the content, in
order, else all in front of the message's text. Answers with ``message``, ``done_reason`` and
``prompt_eval_count``/``eval_count``; faults: 503 "server busy" (Ollama's queue is full).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any

from providers.base import Exchange, ProviderServer, Reply, sha256

OPTIONS = {
    "temperature",
    "top_p",
    "top_k",
    "num_predict",
    "seed",
    "num_ctx",
    "stop",
    "repeat_penalty",
    "min_p",
}
PNG = b"\x89PNG\r\n\x1a\n"


class OllamaServer(ProviderServer):
    family = "ollama"

    def __init__(
        self, *, models: tuple[str, ...] = ("llava",), mllama: tuple[str, ...] = (), **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.models = set(models) | set(mllama)
        self.mllama = set(mllama)

    @staticmethod
    def sequence(body: dict[str, Any]) -> list[tuple[str, str]]:
        """User text and images in the order Ollama puts them into the prompt."""
        out: list[tuple[str, str]] = []
        for m in body["messages"]:
            if m["role"] != "user":
                continue
            images = [sha256(base64.b64decode(i)) for i in m.get("images") or []]
            text = m.get("content") or ""
            if "[img]" in text:
                chunks = text.split("[img]")
                for k, chunk in enumerate(chunks):
                    out.append(("text", chunk))
                    if k < len(chunks) - 1 and k < len(images):
                        out.append(("image", images[k]))
                out += [("image", h) for h in images[len(chunks) - 1 :]]
            else:
                out += [("image", h) for h in images] + [("text", text)]
        return out

    @staticmethod
    def images(body: dict[str, Any]) -> list[bytes]:
        return [
            base64.b64decode(i, validate=True)
            for m in body["messages"]
            for i in m.get("images") or []
        ]

    def is_side(self, path: str) -> bool:
        return path in ("/api/show", "/api/tags")

    def _show(self, ex: Exchange) -> Reply:
        """``/api/show``: what litellm asks about a model (template, families, capabilities)."""
        name = str((ex.body or {}).get("name") or (ex.body or {}).get("model") or "")
        if name not in self.models:
            return Reply(404, {"error": f"model '{name}' not found"})
        family = "mllama" if name in self.mllama else "clip"
        return Reply(
            200,
            {
                "modelfile": f"FROM {name}",
                "parameters": "temperature 0.7",
                "template": "{{ .Prompt }}",
                "details": {
                    "format": "gguf",
                    "family": family,
                    "families": [family],
                    "parameter_size": "7B",
                    "quantization_level": "Q4_K_M",
                },
                "model_info": {"general.architecture": family, "llama.context_length": 8192},
                "capabilities": ["completion", "vision"],
            },
        )

    def _check(self, ex: Exchange) -> tuple[int, str] | None:
        if ex.path not in ("/api/chat", "/api/generate"):
            return 404, "404 page not found"
        body = ex.body
        if ex.path == "/api/generate":  # one prompt and its images: checked as one message
            body = {
                **body,
                "messages": [
                    {
                        "role": "user",
                        "content": body.get("prompt", ""),
                        "images": body.get("images") or [],
                    }
                ],
            }
        model = str(body.get("model", ""))
        if model not in self.models:
            return 404, f'model "{model}" not found, try pulling it first'
        if body.get("stream", True) is not False:
            return 400, "this test server answers stream=false requests only"
        unknown = set(body.get("options") or {}) - OPTIONS
        if unknown:
            return 400, f"invalid options: {sorted(unknown)}"
        for m in body.get("messages") or []:
            if not isinstance(m.get("content", ""), str):
                return (
                    400,
                    "json: cannot unmarshal array into Go struct field .content of type string",
                )
            images = m.get("images") or []
            for img in images:
                try:
                    raw = base64.b64decode(img, validate=True)
                except (binascii.Error, ValueError):
                    return 400, "illegal base64 data at input byte 4"
                if not raw.startswith(PNG):
                    return 400, "image: unknown format"
            if model in self.mllama and len(images) > 1:
                return 500, "this model only supports one image while more than one image requested"
        return None

    def handle(self, ex: Exchange, raw: str) -> Reply:
        if ex.path == "/api/show":
            return self._show(ex)
        if ex.path == "/api/tags":
            return Reply(200, {"models": [{"name": m, "model": m} for m in sorted(self.models)]})
        bad = self._check(ex)
        if bad is not None:
            ex.problems = [bad[1]]
            return Reply(bad[0], {"error": bad[1]})
        fault = self.take_fault(raw)
        if fault is not None:
            if fault.kind == "503":
                return Reply(
                    503,
                    {"error": "server busy, please try again.  maximum pending requests exceeded"},
                )
            raise ValueError(fault.kind)
        answer: dict[str, Any] = {"message": {"role": "assistant", "content": self.reply_for(raw)}}
        if ex.path == "/api/generate":
            answer = {"response": self.reply_for(raw)}
        return Reply(
            200,
            {
                "model": ex.body["model"],
                "created_at": dt.datetime.now(dt.UTC).isoformat(),
                **answer,
                "done": True,
                "done_reason": "stop",
                "total_duration": 1_000_000,
                "load_duration": 1000,
                "prompt_eval_count": self.prompt_tokens,
                "prompt_eval_duration": 1000,
                "eval_count": self.completion_tokens,
                "eval_duration": 1000,
            },
        )
