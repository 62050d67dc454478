"""Settings a real site keeps in files: the agents' list and PostgreSQL's password.

`FLEXGATE_AGENTS_FILE` lists the agents one a line (a URL, or a node id over NATS; `#` starts a
comment), where a site of a hundred nodes would otherwise put a hundred URLs in one variable.
`FLEXGATE_DATABASE_PASSWORD_FILE` holds the store's password (a Kubernetes Secret mounted as a
file, systemd's credentials), which then never appears in `FLEXGATE_DATABASE_URL`, the
environment or a process listing.

Each function raises `ValueError` with a message naming the setting; the settings class turns
it into its one validation error.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit


def read_text_setting(name: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{name} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name} {path}: cannot be read ({exc})") from None


def read_agents_file(path: Path) -> list[str]:
    """The agents the file lists, in order: one a line, blank lines and `#` comments skipped."""
    text = read_text_setting("FLEXGATE_AGENTS_FILE", path)
    agents = [line.partition("#")[0].strip() for line in text.splitlines()]
    agents = [agent for agent in agents if agent]
    if not agents:
        raise ValueError(f"FLEXGATE_AGENTS_FILE {path}: lists no agent (one URL a line)")
    spaced = [agent for agent in agents if " " in agent or "," in agent]
    if spaced:
        raise ValueError(
            f"FLEXGATE_AGENTS_FILE {path}: one agent a line, got {spaced[0]!r} "
            "(no spaces or commas in a line)"
        )
    return agents


def url_with_password(database_url: str, password_file: Path) -> str:
    """`FLEXGATE_DATABASE_URL` with the file's password put in (URL-quoted), for the store.

    Refused: a SQLite URL (no password to give), a URL without a role (the password would
    belong to no one), a URL that already carries a password (which one counts?), an empty file.
    """
    name = "FLEXGATE_DATABASE_PASSWORD_FILE"
    parts = urlsplit(database_url)
    if parts.scheme.partition("+")[0] == "sqlite":
        raise ValueError(f"{name} is for PostgreSQL: FLEXGATE_DATABASE_URL is SQLite")
    if parts.password is not None:
        raise ValueError(
            f"{name} is set and FLEXGATE_DATABASE_URL already has a password: keep it in the "
            "file only (postgresql+psycopg://ROLE@HOST/DATABASE)"
        )
    if not parts.username:
        raise ValueError(
            f"{name} needs the role in FLEXGATE_DATABASE_URL "
            "(postgresql+psycopg://ROLE@HOST/DATABASE)"
        )
    password = read_text_setting(name, password_file).rstrip("\r\n")
    if not password:
        raise ValueError(f"{name} {password_file}: the file is empty")
    user = parts.netloc.rpartition("@")[0]
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))
