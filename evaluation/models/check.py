"""``models check``: one tiny request to a model before a long run spends money on it.

It sends a 64-pixel red square and a JSON-mode question ("what colour is the square?") through
the same adapter a run uses, and reports what works: the endpoint answers, the image is
accepted (when the image request fails and a text-only one succeeds, images are what the model
rejects), JSON mode, whether cost is known from litellm's price map, the latency, and what the
adapter had to change for this provider. Each item has a level: ``ok``, ``info``, ``warn`` (JSON
mode, an unknown price: a run works, with less) or ``fail`` (the model cannot answer an image
request); ``strict`` makes warnings failures. The check fails (``ok`` is False) exactly when an
item is at level ``fail``.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from typing import TYPE_CHECKING, Literal

from PIL import Image
from pydantic import BaseModel, computed_field

from dicom import credential
from evaluation.errors import ModelConfigError
from evaluation.modelio import GenerateConfig, ImagePart, Message, ModelOutput, TextPart
from evaluation.models.spec import ModelSpec

if TYPE_CHECKING:
    from evaluation.models.litellm_adapter import LiteLLMAdapter
    from evaluation.models.providers import ProviderProfile

QUESTION = (
    "What colour is the square in this image? "
    'Answer with JSON only, exactly of the form {"colour": "<one lowercase word>"}.'
)
# litellm reports a refused connection as APIConnectionError or InternalServerError, by route.
UNREACHABLE = re.compile(
    r"^(APIConnectionError|Timeout)|Cannot connect to host|Connection error|Connect call failed|"
    r"Connection refused|Name or service not known|nodename nor servname|timed out",
    re.I,
)
IMAGE_WORDS = re.compile(r"image|vision|multimodal|mm_|media|inline_data|base64", re.I)
# Where a provider lists the models it serves: OpenAI-compatible ``GET {base}/models`` (the
# provider's default base when the spec names none), Ollama's ``GET {root}/api/tags``.
LISTED_BASES = {
    "openai": "https://api.openai.com/v1",
    "xai": "https://api.x.ai/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "vllm": None,
    "openai-compatible": None,
    "ollama": "http://localhost:11434",
}
MAX_LIST_BYTES = 8 << 20
MAX_SHOWN_MODELS = 8


class CheckItem(BaseModel):
    name: str  # reachable, images, json_mode, cost, image_seen, ...
    ok: bool | None  # whether this works; None: informational
    detail: str
    warning: bool = False  # when it does not work, a run still does (with less): WARN, not FAIL

    @computed_field  # type: ignore[prop-decorator]
    @property
    def level(self) -> Literal["ok", "info", "warn", "fail"]:
        if self.ok is None:
            return "info"
        if self.ok:
            return "ok"
        return "warn" if self.warning else "fail"


class CheckReport(BaseModel):
    name: str
    model: str
    family: str
    api_base: str | None
    ok: bool
    latency_s: float | None = None
    items: list[CheckItem]

    def item(self, name: str) -> CheckItem | None:
        return next((i for i in self.items if i.name == name), None)


def tiny_png(colour: tuple[int, int, int] = (220, 30, 30)) -> bytes:
    """A 64x64 square of one colour on white, as PNG."""
    img = Image.new("RGB", (64, 64), (255, 255, 255))
    img.paste(colour, (12, 12, 52, 52))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _messages(with_image: bool) -> list[Message]:
    png = tiny_png()
    content: list[TextPart | ImagePart] = [TextPart(text=QUESTION)]
    if with_image:
        content.append(ImagePart(png=png, sha256=hashlib.sha256(png).hexdigest(), label="square"))
    else:
        content = [TextPart(text='Reply with JSON only: {"colour": "red"}')]
    return [Message(role="user", content=content)]


def _json(text: str) -> dict[str, object] | None:
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def check_model(
    spec: ModelSpec, *, timeout_s: float = 60.0, strict: bool = False
) -> CheckReport:
    """Send the check request to one litellm model and report what works."""
    from evaluation.models.litellm_adapter import LiteLLMAdapter
    from evaluation.models.providers import price_known, profile_for

    items: list[CheckItem] = []
    base = {"name": spec.name, "model": spec.litellm_model, "api_base": spec.api_base}
    if spec.kind != "litellm":
        items.append(CheckItem(name="kind", ok=True, detail=f"built in ({spec.kind}): no endpoint"))
        return CheckReport(**base, family="builtin", ok=True, items=items)
    profile = profile_for(spec)
    base["family"] = profile.family
    # One retry, soon: a check should say quickly that something is wrong.
    quick = spec.model_copy(
        update={
            "max_retries": min(spec.max_retries, 1),
            "backoff_base_s": min(spec.backoff_base_s, 0.5),
            "backoff_max_s": min(spec.backoff_max_s, 2.0),
            "concurrency": 1,
        }
    )
    try:
        adapter = LiteLLMAdapter(quick)
    except ModelConfigError as exc:
        items.append(CheckItem(name="key", ok=False, detail=str(exc)))
        return CheckReport(**base, ok=False, items=items)
    if profile.provider == "ollama":
        items.append(
            CheckItem(
                name="route",
                ok=None,
                detail=(
                    "ollama/ uses /api/generate, which flattens the conversation into one prompt; "
                    "ollama_chat/ (the chat API) keeps messages and image places"
                ),
            )
        )
    served = await served_item(spec, profile, min(timeout_s, 15.0))
    items.append(served)
    cfg = GenerateConfig(temperature=0.0, max_tokens=1000, json_mode=True, timeout_s=timeout_s)
    t0 = time.perf_counter()
    out = await adapter.generate(_messages(True), cfg)
    latency = out.latency_s if out.latency_s is not None else time.perf_counter() - t0
    if out.error:
        items += await _diagnose(adapter, out, cfg)
        return CheckReport(**base, ok=False, latency_s=latency, items=items)
    items.append(CheckItem(name="reachable", ok=True, detail=f"answered in {latency:.2f} s"))
    if out.refusal:
        items.append(
            CheckItem(
                name="images",
                ok=False,
                detail=f"the model refused the check request ({out.finish_reason})",
            )
        )
        return CheckReport(**base, ok=False, latency_s=latency, items=items)
    items.append(CheckItem(name="images", ok=True, detail="an image request was answered"))
    answer = _json(out.text)
    items.append(
        CheckItem(
            name="json_mode",
            ok=answer is not None,
            warning=True,
            detail="the answer is a JSON object"
            if answer is not None
            else f"the answer is not a JSON object: {out.text[:120]!r} (answers are "
            "parsed leniently; format failures are counted, never scored)",
        )
    )
    colour = str((answer or {}).get("colour", out.text))[:40]
    items.append(CheckItem(name="image_seen", ok=None, detail=f"said {colour!r} for a red square"))
    known = price_known(spec.litellm_model)
    if out.cost_usd is not None:
        detail = f"${out.cost_usd:.6f} for this check"
        detail += " (litellm's price map)" if known else " (charged by the provider)"
        items.append(CheckItem(name="cost", ok=True, detail=detail))
    elif profile.local:
        items.append(
            CheckItem(name="cost", ok=None, detail="local server: no price; tokens recorded")
        )
    else:
        items.append(
            CheckItem(
                name="cost",
                ok=False,
                warning=True,
                detail=(
                    f"{spec.litellm_model} is not in litellm's price map: runs record tokens, not cost"
                ),
            )
        )
    items.append(
        CheckItem(
            name="tokens",
            ok=None,
            detail=f"prompt {out.prompt_tokens}, completion {out.completion_tokens}",
        )
    )
    for a in out.adjustments:
        items.append(
            CheckItem(
                name="adjusted",
                ok=None,
                detail=f"{a['kind']} {a.get('param', '')}: {a['reason']}".replace("  ", " "),
            )
        )
    if strict:  # every warning is a failure
        items = [i.model_copy(update={"warning": False}) for i in items]
    ok = all(i.level != "fail" for i in items)
    return CheckReport(**base, ok=ok, latency_s=latency, items=items)


async def served_models(
    spec: ModelSpec, profile: ProviderProfile, timeout_s: float
) -> tuple[list[str] | None, str]:
    """The model ids the endpoint lists (None when it was not asked or did not answer), and
    where it was asked or why not."""
    import httpx

    if profile.family not in LISTED_BASES:
        return None, f"{profile.provider} has no model list this check asks"
    base = spec.api_base or LISTED_BASES[profile.family]
    if not base:
        return None, "no api_base to ask for the model list"
    base = base.rstrip("/")
    if profile.family == "ollama":
        url = re.sub(r"/(v1|api)$", "", base) + "/api/tags"
    else:
        url = base + "/models"
    headers = {}
    key = credential(spec.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with (
            httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client,
            client.stream("GET", url, headers=headers) as r,
        ):
            if r.status_code != 200:
                return None, f"GET {url} answered HTTP {r.status_code}"
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_LIST_BYTES:
                    return None, f"GET {url}: the list is over {MAX_LIST_BYTES >> 20} MiB"
        data = json.loads(body)
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"GET {url} failed: {str(exc)[:160] or type(exc).__name__}"
    rows = (
        data.get("models" if profile.family == "ollama" else "data")
        if isinstance(data, dict)
        else None
    )
    if not isinstance(rows, list):
        return None, f"GET {url}: not a model list"
    key = "name" if profile.family == "ollama" else "id"
    ids = [str(r.get(key))[:200] for r in rows if isinstance(r, dict) and r.get(key)]
    return ids, url


async def served_item(spec: ModelSpec, profile: ProviderProfile, timeout_s: float) -> CheckItem:
    """``served``: ok when the endpoint lists the model, FAIL when its list leaves it out,
    info (unchecked) when there is no list to ask or it lists nothing."""
    from evaluation.models.spec import did_you_mean

    ids, where = await served_models(spec, profile, timeout_s)
    if ids is None:
        return CheckItem(name="served", ok=None, detail=f"unchecked: {where}")
    if not ids:
        return CheckItem(name="served", ok=None, detail=f"unchecked: {where} lists no model")
    wanted = profile.model
    names = {wanted, f"{wanted}:latest"} if profile.family == "ollama" else {wanted}
    if names & set(ids):
        return CheckItem(name="served", ok=True, detail=f"{wanted} is listed by {where}")
    shown = ", ".join(ids[:MAX_SHOWN_MODELS]) + (
        f" and {len(ids) - MAX_SHOWN_MODELS} more" if len(ids) > MAX_SHOWN_MODELS else ""
    )
    return CheckItem(
        name="served",
        ok=False,
        detail=f"{wanted} is not served by the endpoint{did_you_mean(wanted, ids)}; "
        f"{where} lists {shown}",
    )


async def _diagnose(
    adapter: LiteLLMAdapter, out: ModelOutput, cfg: GenerateConfig
) -> list[CheckItem]:
    """Why the image request failed: unreachable, images rejected, or anything else."""
    error = out.error or ""
    if UNREACHABLE.search(error):
        return [
            CheckItem(name="reachable", ok=False, detail=f"no answer from the endpoint: {error}")
        ]
    text_only = await adapter.generate(_messages(False), cfg)
    if text_only.error is None:
        hint = " (the message mentions images)" if IMAGE_WORDS.search(error) else ""
        return [
            CheckItem(name="reachable", ok=True, detail="a text-only request was answered"),
            CheckItem(
                name="images", ok=False, detail=f"the image request was rejected{hint}: {error}"
            ),
        ]
    return [
        CheckItem(name="reachable", ok=True, detail="the endpoint answers, with an error"),
        CheckItem(name="request", ok=False, detail=f"requests fail: {error}"),
    ]
