"""How a run's model passports and their changes print (``runs show``; the canary and compare
may print changes the same way)."""

from __future__ import annotations

from typing import Any

from gateway.cli.console import note, shown


def _observed(values: list[Any]) -> str:
    return "; ".join(f"{shown(o.value, 120)} ({o.calls} calls)" for o in values) or "-"


def passport_lines(passports: dict[str, Any]) -> list[str]:
    """Each model's passport (``evaluation.log.ModelPassport``) as a few lines of text, every
    value from a provider or a file escaped and bounded."""
    lines: list[str] = []
    for name, p in passports.items():
        what = p.litellm_model or p.kind
        where = f" via {shown(p.provider, 40)}" if p.provider else ""
        where += f" at {shown(p.api_host, 80)}" if p.api_host else ""
        role = " (grader)" if p.role == "grader" else ""
        rebuilt = "" if p.recorded_at else " [rebuilt from the run's config: no passport recorded]"
        lines.append(f"passport {shown(name, 80)}{role}: {shown(what, 80)}{where}{rebuilt}")
        lines.append(
            f"  answered by: {_observed(p.served_models)}; fingerprint: "
            f"{_observed(p.system_fingerprints)} ({p.responses} responses)"
        )
        for header, values in p.version_headers.items():
            lines.append(f"  {shown(header, 60)}: {_observed(values)}")
        if p.replay_file:
            lines.append(
                f"  replay file {shown(p.replay_file, 120)} sha256 {shown(p.replay_sha256 or '-', 64)}"
            )
        if p.decoding:
            sent = " ".join(f"{shown(k, 40)}={shown(str(v), 60)}" for k, v in p.decoding.items())
            lines.append(f"  decoding sent: {sent}")
        digest = (p.prompt_digest or "-")[:16]
        lines.append(
            f"  prompts {shown(p.prompt_version or '-', 40)}, digest {digest} of {p.prompts} "
            f"first-turn prompts; renderer {shown(p.renderer_version or '-', 40)}; scoring "
            f"{shown(', '.join(p.scoring_versions) or '-', 40)}; litellm "
            f"{shown(p.litellm_version or '-', 40)}"
        )
    return lines


def change_lines(changes: list[Any]) -> list[str]:
    """Passport changes (``evaluation.log.PassportChange``) as lines: field: before -> after."""
    return [
        f"  {shown(c.field, 80)}: {shown(c.before or '-', 160)} -> {shown(c.after or '-', 160)}"
        for c in changes
    ]


def print_passports(passports: dict[str, Any]) -> None:
    for line in passport_lines(passports):
        note(line)
