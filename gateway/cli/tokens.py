"""``neurosandbox tokens``: API bearer tokens (stored hashed)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import console, fail
from gateway.settings import get_settings

tokens_app = typer.Typer(help="API bearer tokens (stored hashed).", no_args_is_help=True)


@tokens_app.command("create")
def tokens_create(
    role: Annotated[
        str,
        typer.Option("--role", help="reviewer, admin, or sender (sends studies by STOW-RS only)"),
    ] = "reviewer",
    name: Annotated[str, typer.Option("--name", help="who or what uses it")] = "",
    person: Annotated[
        str,
        typer.Option(
            "--person",
            help="the clinician's name as Family^Given (the Verifying Observer of what they "
            "sign off); asked for reviewer tokens when not given",
        ),
    ] = "",
    program: Annotated[
        bool,
        typer.Option(
            "--program", help="a token for a program (no person name; it cannot sign off)"
        ),
    ] = False,
) -> None:
    """Create a token; it is printed once (stdout) and stored only as a hash."""
    import sys

    from gateway.auth import Role, TokenError, TokenStore

    try:
        r = Role(role)
    except ValueError:
        raise fail(f"--role must be reviewer, admin or sender, not {role!r}", 2) from None
    if not person and not program and r is Role.REVIEWER:
        if not sys.stdin.isatty():
            raise fail(
                "a reviewer token needs the clinician's name: --person Family^Given "
                "(or --program for a token that can never sign off)",
                2,
            )
        person = typer.prompt("Clinician's name as Family^Given (e.g. Curie^Marie)")
    store = TokenStore(get_settings().data_dir / "secret" / "tokens.json")
    try:
        rec, token = store.create(r, name, person)
    except TokenError as exc:
        raise fail(str(exc), 2) from None
    console.print(f"token {rec.id} ({rec.role.value}) created; it is shown only now:")
    print(token)


@tokens_app.command("list")
def tokens_list() -> None:
    """Token ids, names, roles (never the secrets)."""
    from gateway.auth import TokenStore

    for rec in TokenStore(get_settings().data_dir / "secret" / "tokens.json").list():
        state = "revoked" if rec.revoked else "active"
        print(f"{rec.id}\t{rec.role.value}\t{state}\t{rec.created_at}\t{rec.name}\t{rec.person}")


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(help="token id")]) -> None:
    """Revoke a token (takes effect at once, also in a running server)."""
    from gateway.auth import TokenError, TokenStore

    try:
        TokenStore(get_settings().data_dir / "secret" / "tokens.json").revoke(token_id)
    except TokenError as exc:
        raise fail(str(exc)) from None
    console.print(f"token {escape(token_id)} revoked")
