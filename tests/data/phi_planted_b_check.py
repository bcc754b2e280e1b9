"""What a PHI gate lets through of the second planted set (``phi_planted_b.json``).

The set was written without reading the gate, and this runner knows nothing of it either: give it
any ``scrub(bundle, note) -> list[str]`` (the texts that would be sent to an untrusted endpoint)
and it says, for each planted item, whether it arrived, and for each clinical string that must
survive, whether it did.

An item has arrived (LEAKED) when its text is in what is sent after both are normalised the same
way: NFKC (full-width digits), format characters dropped (zero-width, soft hyphen, BOM), Cyrillic
and Greek look-alikes read as Latin, accents dropped, case folded, spaces collapsed; for numbers
(phone, fax, identifiers, accounts, devices) and for letter-spaced names, also when
its letters and digits alone appear in that order (a gate that re-formats "0152 04177731" as
"015204177731" still sends it). PARTIAL: the whole text is gone but one of the fragments that
identify on their own (``core``: a surname, a town, a postcode) is in what is sent more often than
the items that arrived whole account for; when several items share the fragment, each is marked,
so read those by hand.

    python tests/data/phi_planted_b_check.py --verify            # the set itself is sound
    python tests/data/phi_planted_b_check.py package.module:fn   # run a scrub function
    python tests/data/phi_planted_b_check.py --sent sent.json    # a JSON list of sent texts
"""

from __future__ import annotations

import argparse
import base64
import copy
import importlib
import json
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("phi_planted_b.json")

Scrub = Callable[[dict[str, Any], str], Iterable[str]]

# Cyrillic and Greek letters drawn like Latin ones (the ones a name can be disguised with)
_LOOKALIKE = str.maketrans(
    "АВЕКМНОРСТХУаеорсухіјѕԁԛԝӏΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοιρτυνκı‘’ʼ´`‐‑‒–—―−",
    "ABEKMHOPCTXYaeopcyxijsdqwlABEZHIKMNOPTYXaoiptuvki'''''-------",
)
_SKELETON_KINDS = frozenset({"phone", "fax", "id", "account", "device", "ip"})
_SKELETON_OBFUSCATIONS = frozenset({"letter-spaced"})
_MIN_SKELETON = 6


def norm(text: str) -> str:
    """``text`` as compared: look-alikes, format characters, accents, case and spacing folded."""
    s = unicodedata.normalize("NFKC", text)
    s = "".join(c for c in s if unicodedata.category(c) != "Cf").translate(_LOOKALIKE)
    s = "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))
    return " ".join(s.casefold().split())


def skeleton(text: str) -> str:
    """Only the letters and digits of ``text`` (normalised), in order."""
    return "".join(c for c in norm(text) if c.isalnum())


def _occurrences(haystack: str, needle: str) -> int:
    """How often ``needle`` is in ``haystack`` not as part of a longer word or number."""
    if not needle:
        return 0
    left = r"(?<![^\W_])" if needle[0].isalnum() else ""
    right = r"(?![^\W_])" if needle[-1].isalnum() else ""
    return len(re.findall(left + re.escape(needle) + right, haystack))


def _contains(haystack: str, needle: str) -> bool:
    return _occurrences(haystack, needle) > 0


def uses_skeleton(item: dict[str, Any]) -> bool:
    """Whether an item also counts as arrived when only its letters and digits are found."""
    return (
        item["kind"] in _SKELETON_KINDS or item.get("obfuscation") in _SKELETON_OBFUSCATIONS
    ) and len(skeleton(item["text"])) >= _MIN_SKELETON


def load(path: Path = DATA) -> dict[str, Any]:
    """The planted set: ``bundle``, ``note``, ``planted``, ``keep`` (and ``doubtful``)."""
    return json.loads(path.read_text(encoding="utf-8"))


_STEP = re.compile(r"^(\w+)(?:\[(\d+)\])?$")


def field_text(data: dict[str, Any], where: str) -> str:
    """The text at ``where``: ``note``, or ``bundle:Type[i].key[j].key`` (the i-th resource of
    that type; an ``attachment.data`` is decoded from base64)."""
    if where == "note":
        return str(data["note"])
    kind, _, path = where.removeprefix("bundle:").partition(".")
    m = _STEP.match(kind)
    if not m or not where.startswith("bundle:"):
        raise ValueError(f"unreadable where: {where!r}")
    of_kind = [
        e["resource"]
        for e in data["bundle"]["entry"]
        if e.get("resource", {}).get("resourceType") == m[1]
    ]
    node: Any = of_kind[int(m[2] or 0)]
    for step in path.split("."):
        s = _STEP.match(step)
        if not s:
            raise ValueError(f"unreadable step {step!r} in {where!r}")
        node = node[s[1]]
        if s[2] is not None:
            node = node[int(s[2])]
    if where.endswith("attachment.data"):
        return base64.b64decode(node).decode("utf-8")
    return str(node)


def verify(data: dict[str, Any] | None = None) -> list[str]:
    """Problems with the set itself (empty when sound): an item not at its place, an item whose
    text (or letters and digits) occurs elsewhere in the free text so that its verdict would not
    be its own, a keep string absent or overlapping a planted one."""
    data = data or load()
    problems: list[str] = []
    wheres = dict.fromkeys(["note", *(p["where"] for p in data["planted"])])
    corpus = "\n".join(field_text(data, w) for w in wheres)
    n_corpus, s_corpus = norm(corpus), skeleton(corpus)
    ids = Counter(p["id"] for p in data["planted"])
    problems += [f"{i}: id used {n} times" for i, n in ids.items() if n > 1]
    for p in data["planted"]:
        label = f"{p['id']} {p['text']!r}"
        try:
            here = field_text(data, p["where"])
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"{label}: where {p['where']!r} unreadable ({exc})")
            continue
        if p["text"] not in here:
            problems.append(f"{label}: not verbatim at {p['where']}")
        n = norm(p["text"])
        hits = _occurrences(n_corpus, n)
        if hits != 1:
            problems.append(f"{label}: normalised text occurs {hits} times in the free text")
        if uses_skeleton(p) and s_corpus.count(skeleton(p["text"])) != 1:
            problems.append(f"{label}: its letters and digits occur more than once")
    for k in data["keep"]:
        if norm(k) not in n_corpus:
            problems.append(f"keep {k!r}: not in the free text")
        for p in data["planted"]:
            if norm(p["text"]) in norm(k) or norm(k) in norm(p["text"]):
                problems.append(f"keep {k!r} overlaps planted {p['id']} {p['text']!r}")
    for d in data.get("doubtful", []):
        if norm(d["text"]) not in n_corpus:
            problems.append(f"doubtful {d['text']!r}: not in the free text")
    return problems


@dataclass
class ItemResult:
    id: str
    kind: str
    text: str
    status: str  # "scrubbed", "LEAKED", "PARTIAL"
    matched: list[str] = field(default_factory=list)  # what of it was found in what is sent
    obfuscation: str = ""


@dataclass
class Report:
    items: list[ItemResult]
    kept: list[str]
    lost: list[str]

    @property
    def leaked(self) -> list[ItemResult]:
        return [r for r in self.items if r.status == "LEAKED"]

    @property
    def partial(self) -> list[ItemResult]:
        return [r for r in self.items if r.status == "PARTIAL"]

    def recall(self, strict: bool = False) -> float:
        """Share of planted items that did not arrive (``strict``: a PARTIAL counts as arrived)."""
        bad = len(self.leaked) + (len(self.partial) if strict else 0)
        return 1 - bad / len(self.items)

    def to_text(self, all_items: bool = False) -> str:
        n = len(self.items)
        lines = [
            f"planted {n}: scrubbed {n - len(self.leaked) - len(self.partial)}, "
            f"LEAKED {len(self.leaked)}, PARTIAL {len(self.partial)}; "
            f"recall {self.recall():.3f} (strict {self.recall(strict=True):.3f})",
            f"keep {len(self.kept) + len(self.lost)}: kept {len(self.kept)}, LOST {len(self.lost)}",
            "by kind (scrubbed/total): "
            + ", ".join(
                f"{k} {sum(r.status == 'scrubbed' for r in self.items if r.kind == k)}/{c}"
                for k, c in Counter(r.kind for r in self.items).most_common()
            ),
        ]
        for r in self.items:
            if all_items or r.status != "scrubbed":
                how = f" [{r.obfuscation}]" if r.obfuscation else ""
                seen = f"  found: {', '.join(map(repr, r.matched))}" if r.matched else ""
                lines.append(f"{r.status:8} {r.id:5} {r.kind:8} {r.text!r}{how}{seen}")
        lines += [f"LOST     keep {k!r}" for k in self.lost]
        return "\n".join(lines)


def check(scrub: Scrub, data: dict[str, Any] | None = None) -> Report:
    """Run ``scrub`` on the set (on copies: it may not change the set) and judge what it sends."""
    data = data or load()
    sent = scrub(copy.deepcopy(data["bundle"]), str(data["note"]))
    if isinstance(sent, str):
        sent = [sent]
    return judge(list(sent), data)


def judge(sent: list[str], data: dict[str, Any] | None = None) -> Report:
    """The report for the texts ``sent`` (every string that would leave)."""
    data = data or load()
    joined = "\n".join(str(s) for s in sent)
    n_out, s_out = norm(joined), skeleton(joined)
    items = []
    for p in data["planted"]:
        matched = []
        if _contains(n_out, norm(p["text"])):
            matched.append(p["text"])
        elif uses_skeleton(p) and skeleton(p["text"]) in s_out:
            matched.append(skeleton(p["text"]))
        items.append(
            ItemResult(
                p["id"], p["kind"], p["text"], "LEAKED" if matched else "scrubbed", matched,
                p.get("obfuscation", ""),
            )
        )  # fmt: skip
    # A fragment (a surname, a town) of an item that did not arrive whole is a partial leak when
    # it is in what is sent more often than the items that arrived whole account for.
    whole = [norm(r.text) for r in items if r.status == "LEAKED"]
    for r, p in zip(items, data["planted"], strict=True):
        if r.status == "LEAKED":
            continue
        for core in map(norm, p.get("core", [])):
            explained = sum(_occurrences(n_out, w) * _occurrences(w, core) for w in whole)
            if _occurrences(n_out, core) > explained:
                r.status = "PARTIAL"
                r.matched.append(core)
    kept = [k for k in data["keep"] if _contains(n_out, norm(k))]
    lost = [k for k in data["keep"] if not _contains(n_out, norm(k))]
    return Report(items, kept, lost)


def _function(spec: str) -> Scrub:
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"give the scrub function as package.module:function, not {spec!r}")
    sys.path.insert(0, str(Path.cwd()))  # the project's packages, run from its root
    fn = getattr(importlib.import_module(module), name)
    return fn  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scrub", nargs="?", help="package.module:function(bundle, note) -> list[str]")
    ap.add_argument("--sent", type=Path, help="a JSON list of the texts that were sent")
    ap.add_argument("--verify", action="store_true", help="check the set itself and stop")
    ap.add_argument("--all", action="store_true", help="list every item, not only the misses")
    ap.add_argument("--json", action="store_true", help="the report as JSON")
    args = ap.parse_args(argv)
    data = load()
    problems = verify(data)
    if problems or args.verify:
        print("\n".join(problems) or f"set sound: {len(data['planted'])} planted, "
              f"{len(data['keep'])} keep")  # fmt: skip
        return 1 if problems else 0
    if args.sent:
        sent = json.loads(args.sent.read_text(encoding="utf-8"))
        if not isinstance(sent, list) or not all(isinstance(s, str) for s in sent):
            raise SystemExit(f"{args.sent}: expected a JSON list of strings (the texts sent)")
        report = judge(sent, data)
    elif args.scrub:
        report = check(_function(args.scrub), data)
    else:
        ap.error("give a scrub function, --sent or --verify")
    if args.json:
        print(json.dumps({"items": [r.__dict__ for r in report.items], "lost": report.lost},
                         ensure_ascii=False, indent=1))  # fmt: skip
    else:
        print(report.to_text(all_items=args.all))
    return 0 if not report.leaked and not report.partial and not report.lost else 2


if __name__ == "__main__":
    sys.exit(main())
