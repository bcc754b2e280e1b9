"""Make a request's images fit what a provider accepts, never dropping one silently.

In this order, each change recorded as an adjustment (a dict stored with the model output):

1. more images than a request takes: consecutive images of a message are tiled into montages
   (numbered tiles, and a legend naming each tile's image where the images were), as few as
   needed; when even one image per message is too many (multi-turn), images of the earliest
   messages, which the model saw in its earlier turns, are not sent again, and the text says so;
2. an image larger than the provider takes (bytes of base64, or pixels a side): re-encoded, then
   downscaled until it fits; then, if all images of the request together are still too large,
   the largest are downscaled;
3. more images than a message takes: the message is split into consecutive messages.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
from collections import OrderedDict
from typing import Any

from PIL import Image, ImageDraw

from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.models.providers import ProviderProfile
from evaluation.prompts import inert

log = logging.getLogger(__name__)
Adjustment = dict[str, Any]
_CACHE: OrderedDict[tuple[Any, ...], tuple[ImagePart, dict[str, Any]]] = OrderedDict()
_CACHE_SIZE = 64
_SIZES: dict[str, tuple[int, int]] = {}
_warned: set[tuple[str, str, str]] = set()
GAP = 4  # px between tiles
HEADER = 14  # px band above each tile holding its number


def b64_size(n: int) -> int:
    return 4 * math.ceil(n / 3)


def fit_images(
    messages: list[Message], profile: ProviderProfile
) -> tuple[list[Message], list[Adjustment]]:
    """Messages whose images fit the profile, and what was changed to get there."""
    adjustments: list[Adjustment] = []
    out = _fit_count(messages, profile, adjustments)
    out = _fit_sizes(out, profile, adjustments)
    out = _split(out, profile, adjustments)
    for a in adjustments:
        # Once per model and kind of change (not per call: a run makes thousands).
        key = (f"{profile.provider}/{profile.model}", a["kind"], re.sub(r"\d+", "#", a["reason"]))
        if key not in _warned:
            _warned.add(key)
            log.warning("%s (%s): %s", profile.model, a["kind"], a["reason"])
    return out, adjustments


def _images(m: Message) -> list[ImagePart]:
    return [p for p in m.content if isinstance(p, ImagePart)]


# --------------------------------------------------------------------------- count


def _fit_count(
    messages: list[Message], profile: ProviderProfile, adjustments: list[Adjustment]
) -> list[Message]:
    limit = profile.max_images_per_request
    counts = [len(_images(m)) for m in messages]
    total = sum(counts)
    if not limit or total <= limit:
        return messages
    reason = f"{profile.model} takes at most {limit} image(s) per request; this one had {total}"
    bearing = [i for i, k in enumerate(counts) if k]
    keep = bearing[-limit:]  # the latest messages keep their images (the model saw the others)
    slots = {i: 1 for i in keep}
    for _ in range(limit - len(keep)):
        i = max((j for j in keep if slots[j] < counts[j]), key=lambda j: counts[j] / slots[j])
        slots[i] += 1
    out = []
    for i, m in enumerate(messages):
        if counts[i] and i not in keep:
            out.append(_not_resent(m, reason, adjustments))
        elif counts[i] and slots[i] < counts[i]:
            out.append(_montage_message(m, slots[i], reason, adjustments))
        else:
            out.append(m)
    return out


def _not_resent(m: Message, reason: str, adjustments: list[Adjustment]) -> Message:
    images = _images(m)
    note = TextPart(
        text=f"[The {len(images)} image(s) of this earlier message are not sent again: {reason}.]"
    )
    content = [p for p in m.content if isinstance(p, TextPart)] + [note]
    adjustments.append(
        {"kind": "not_resent", "images": [p.sha256 for p in images], "reason": reason}
    )
    return Message(role=m.role, content=content)


def _montage_message(m: Message, slots: int, reason: str, adjustments: list[Adjustment]) -> Message:
    images = _images(m)
    k = len(images)
    sizes = [k // slots + (1 if j < k % slots else 0) for j in range(slots)]
    groups = [images[sum(sizes[:j]) : sum(sizes[: j + 1])] for j in range(slots)]
    first = {id(g[0]): g for g in groups}
    member = {id(p) for g in groups for p in g[1:]}
    content: list[TextPart | ImagePart] = []
    for p in m.content:
        if isinstance(p, ImagePart) and id(p) in first and len(first[id(p)]) > 1:
            group = first[id(p)]
            tile, info = _cached(("montage", *(q.sha256 for q in group)), _montage, group)
            # labels come from DICOM headers: each one JSON string, made inert, never pasted
            legend = "; ".join(
                f"{n} = {json.dumps(inert(q.label or 'image'), ensure_ascii=False)}"
                for n, q in enumerate(group, 1)
            )
            content.append(
                TextPart(
                    text=f"[The next image is a montage of {len(group)} images, tiles numbered "
                    f"left to right, top to bottom: {legend}.]"
                )
            )
            content.append(tile)
            adjustments.append(
                {
                    "kind": "montage",
                    "images": [q.sha256 for q in group],
                    "into": tile.sha256,
                    "grid": info["grid"],
                    "reason": reason,
                }
            )
        elif not (isinstance(p, ImagePart) and id(p) in member):
            content.append(p)
    return Message(role=m.role, content=content)


def _montage(group: list[ImagePart]) -> tuple[ImagePart, dict[str, Any]]:
    imgs: list[Image.Image] = [Image.open(io.BytesIO(p.png)) for p in group]
    mode = "L" if all(i.mode in ("L", "1", "P", "I;16", "I") for i in imgs) else "RGB"
    imgs = [_as_8bit(i, mode) for i in imgs]
    cols = math.ceil(math.sqrt(len(imgs)))
    rows = math.ceil(len(imgs) / cols)
    tw, th = max(i.width for i in imgs), max(i.height for i in imgs)
    sheet = Image.new(mode, (cols * tw + (cols - 1) * GAP, rows * (th + HEADER) + (rows - 1) * GAP))
    draw = ImageDraw.Draw(sheet)
    white = 255 if mode == "L" else (255, 255, 255)
    for n, img in enumerate(imgs):
        r, c = divmod(n, cols)
        x, y = c * (tw + GAP), r * (th + HEADER + GAP)
        draw.text((x + 3, y + 1), str(n + 1), fill=white)
        # Unscaled, centred in its tile: the pixels the model sees are the rendered ones.
        sheet.paste(img, (x + (tw - img.width) // 2, y + HEADER + (th - img.height) // 2))
    part = _part(_png(sheet, level=1), "montage: " + " | ".join(p.label for p in group))
    return part, {"grid": [rows, cols]}


def _as_8bit(img: Image.Image, mode: str) -> Image.Image:
    if img.mode in ("I;16", "I"):
        img = img.point(lambda v: v / 256).convert("L")
    return img.convert(mode)


# --------------------------------------------------------------------------- size


def _fit_sizes(
    messages: list[Message], profile: ProviderProfile, adjustments: list[Adjustment]
) -> list[Message]:
    n = sum(len(_images(m)) for m in messages)
    side = profile.max_image_side
    if profile.many_images and n > profile.many_images[0]:
        side = min(side or profile.many_images[1], profile.many_images[1])
    limit = profile.max_image_bytes
    out = []
    for m in messages:
        content = [
            _fit_one(p, limit, side, profile, adjustments, n) if isinstance(p, ImagePart) else p
            for p in m.content
        ]
        same = all(a is b for a, b in zip(content, m.content, strict=True))
        out.append(m if same else Message(role=m.role, content=content))
    total_limit = profile.max_request_image_bytes
    if total_limit:
        out = _fit_total(out, total_limit, profile, adjustments)
    return out


def _fit_one(
    p: ImagePart,
    limit: int | None,
    side: int | None,
    profile: ProviderProfile,
    adjustments: list[Adjustment],
    n: int,
) -> ImagePart:
    too_big = limit is not None and b64_size(len(p.png)) > limit
    if not too_big and side is None:
        return p
    too_wide = side is not None and max(_pixels(p)) > side
    if not (too_big or too_wide):
        return p
    new, info = _cached(("shrink", p.sha256, limit, side), _shrink, p, limit, side)
    why = []
    if too_big:
        why.append(f"{profile.model} takes at most {limit} bytes of base64 per image")
    if too_wide:
        why.append(f"{profile.model} takes at most {side} px a side with {n} image(s)")
    adjustments.append(
        {
            "kind": info["kind"],
            "image": p.sha256,
            "into": new.sha256,
            **{k: v for k, v in info.items() if k != "kind"},
            "reason": "; ".join(why),
        }
    )
    return new


def _fit_total(
    messages: list[Message], limit: int, profile: ProviderProfile, adjustments: list[Adjustment]
) -> list[Message]:
    parts = {id(p): p for m in messages for p in _images(m)}
    total = sum(b64_size(len(p.png)) for p in parts.values())
    if total <= limit:
        return messages
    reason = f"{profile.model} takes at most {limit} bytes of images per request; this had {total}"
    replaced: dict[int, ImagePart] = {}
    for _ in range(64):
        if total <= limit:
            break
        key, big = max(
            ((k, replaced.get(k, p)) for k, p in parts.items()), key=lambda kp: len(kp[1].png)
        )
        target = int(b64_size(len(big.png)) * 0.6)
        new, info = _cached(("shrink", big.sha256, target, None), _shrink, big, target, None)
        total += b64_size(len(new.png)) - b64_size(len(big.png))
        replaced[key] = new
        adjustments.append(
            {
                "kind": info["kind"],
                "image": big.sha256,
                "into": new.sha256,
                **{k: v for k, v in info.items() if k != "kind"},
                "reason": reason,
            }
        )
    return [
        Message(role=m.role, content=[replaced.get(id(p), p) for p in m.content]) for m in messages
    ]


def _shrink(p: ImagePart, limit: int | None, side: int | None) -> tuple[ImagePart, dict[str, Any]]:
    img: Image.Image = Image.open(io.BytesIO(p.png))
    img.load()
    w0, h0 = img.size
    kind = "reencoded"
    if side is not None and max(img.size) > side:
        f = side / max(img.size)
        img = img.resize(
            (max(1, int(img.width * f)), max(1, int(img.height * f))), Image.Resampling.LANCZOS
        )
        kind = "downscaled"
    data = _png(img)
    for _ in range(16):
        if limit is None or b64_size(len(data)) <= limit or max(img.size) <= 16:
            break
        f = min(0.95, max(0.25, math.sqrt(limit / b64_size(len(data))) * 0.95))
        img = img.resize(
            (max(1, int(img.width * f)), max(1, int(img.height * f))), Image.Resampling.LANCZOS
        )
        data = _png(img)
        kind = "downscaled"
    info = {
        "kind": kind,
        "from_px": [w0, h0],
        "to_px": list(img.size),
        "from_bytes": b64_size(len(p.png)),
        "to_bytes": b64_size(len(data)),
    }
    return _part(data, p.label), info


# --------------------------------------------------------------------------- split


def _split(
    messages: list[Message], profile: ProviderProfile, adjustments: list[Adjustment]
) -> list[Message]:
    limit = profile.max_images_per_message
    if not limit:
        return messages
    out: list[Message] = []
    for m in messages:
        n = len(_images(m))
        if n <= limit:
            out.append(m)
            continue
        chunks: list[list[TextPart | ImagePart]] = [[]]
        seen = 0
        for p in m.content:
            if isinstance(p, ImagePart):
                if seen and seen % limit == 0:
                    # The text just before this image names it: it moves with the image.
                    tail: list[TextPart | ImagePart] = []
                    while chunks[-1] and isinstance(chunks[-1][-1], TextPart):
                        tail.insert(0, chunks[-1].pop())
                    chunks.append(tail)
                seen += 1
            chunks[-1].append(p)
        out += [Message(role=m.role, content=c) for c in chunks if c]
        adjustments.append(
            {
                "kind": "split",
                "images": [p.sha256 for p in _images(m)],
                "messages": len(chunks),
                "reason": f"{profile.model} takes at most {limit} image(s) per message",
            }
        )
    return out


# --------------------------------------------------------------------------- helpers


def _pixels(p: ImagePart) -> tuple[int, int]:
    """Width and height of an image (memoised: every call of a run asks again)."""
    hit = _SIZES.get(p.sha256)
    if hit is None:
        with Image.open(io.BytesIO(p.png)) as img:  # reads the header only
            hit = _SIZES[p.sha256] = img.size
        if len(_SIZES) > 4096:
            _SIZES.pop(next(iter(_SIZES)))
    return hit


def _png(img: Image.Image, level: int = 6) -> bytes:
    # zlib level 6: "optimize" or 9 take three times as long for a few per cent (measured on
    # a 3080x2450 montage: 9.2 s vs 3.2 s vs 0.8 s at level 1, 3.0 / 3.2 / 3.2 MB).
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=level)
    return buf.getvalue()


def _part(data: bytes, label: str) -> ImagePart:
    return ImagePart(png=data, sha256=hashlib.sha256(data).hexdigest(), label=label)


def _cached(key: tuple[Any, ...], make: Any, *args: Any) -> tuple[ImagePart, dict[str, Any]]:
    """``make(*args)``, memoised by key (every sample of a call asks for the same images)."""
    hit = _CACHE.get(key)
    if hit is None:
        hit = make(*args)
        _CACHE[key] = hit
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return hit
