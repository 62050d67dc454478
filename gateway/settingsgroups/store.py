"""The store's settings (gateway.store)."""

from __future__ import annotations

from pathlib import Path

from gateway.settingsfiles import url_with_password
from gateway.settingsgroups.base import SettingsGroup


class StoreSettings(SettingsGroup):
    database_url: str = "sqlite:///.flexgate/gateway.db"
    #: the store's password, read from this file (a mounted secret) into the URL; None: the
    #: URL's own, if any
    database_password_file: Path | None = None

    def _read_password_file(self) -> None:
        """The password file into `database_url`."""
        if self.database_password_file is not None:
            self.database_url = url_with_password(self.database_url, self.database_password_file)
