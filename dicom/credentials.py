"""The one place library code reads an environment variable: a secret the user named.

Configuration is never read here: it comes from the settings object (``gateway.settings``,
``NEUROSANDBOX_*``) and is passed down, or set once at start through a module's ``configure_*``
function. A secret is different: the user names the variable that holds it (a model's
``api_key_env``, a manifest's Orthanc ``username_env``/``password_env``, ``export-case
--salt-env``) so that the value is never written into a file or a command line. Those names
are read here and nowhere else (``tests/test_no_env_reads.py`` keeps it so). It lives in the
bottom layer so that every layer reads secrets the same way.
"""

from __future__ import annotations

import os
import re

# The name of an environment variable a manifest or a PACS file may read a PACS credential
# from: it contains PACS or ORTHANC, so a file that came from elsewhere cannot make the sandbox
# send another secret of this machine (a model's API key) to the server it names.
PACS_CREDENTIAL_ENV = r"^[A-Z0-9_]{0,60}(PACS|ORTHANC)[A-Z0-9_]{0,60}$"


class CredentialNameError(ValueError):
    """A PACS credential named by a variable that is not meant for a PACS."""


def pacs_credential(env_name: str | None) -> str | None:
    """``credential(env_name)`` for a PACS: the name must match ``PACS_CREDENTIAL_ENV``."""
    if env_name and not re.fullmatch(PACS_CREDENTIAL_ENV, env_name):
        raise CredentialNameError(
            f"{env_name[:80]!r} is not a PACS credential's variable: its name must be upper-case "
            "letters, digits and _ and contain PACS or ORTHANC (e.g. HOSPITAL_PACS_PASSWORD)"
        )
    return credential(env_name)


def credential(env_name: str | None) -> str | None:
    """The value of the environment variable ``env_name`` names (a secret: never log it);
    None when no name is given or the variable is not set (an empty value is returned as is)."""
    if not env_name:
        return None
    return os.environ.get(env_name)
