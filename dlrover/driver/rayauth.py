"""Ray token authentication for this process's clients.

Ray 2.60 clusters use token auth when a token exists (``ray start --head`` turns it on by
itself when ``~/.ray/auth_token`` is there; ``ray.init()`` creates one). Ray's own clients
send the token only in token mode, which ``ray.init`` turns on by itself only for a cluster
it finds without an address: ``--address`` needs it turned on here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def auth_token() -> str | None:
    """The token Ray would send, found where Ray looks: ``RAY_AUTH_TOKEN``, the file at
    ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not token and path.is_file():
        try:
            token = path.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
    return token or None


def use_token_auth() -> None:
    """Token mode for Ray's clients in this process when a token exists and
    ``RAY_AUTH_MODE`` is unset (a user's explicit choice stands). A cluster without auth
    ignores the token, so this never stops a connection that would work without it."""
    if "RAY_AUTH_MODE" in os.environ or auth_token() is None:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if "ray._raylet" in sys.modules:
        # Ray read RAY_AUTH_MODE into its config when it was imported: re-read it, as
        # Ray's own ``authentication_token_setup._enable_token_auth`` does.
        from ray._raylet import Config

        Config.initialize("")


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer <token>`` for Ray's HTTP APIs (Ray Jobs, state API), the
    way the ``ray job`` CLI authenticates; empty without a token."""
    token = auth_token()
    return {"Authorization": f"Bearer {token}"} if token else {}
