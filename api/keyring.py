"""The access keys requests may be signed with, and the account each acts for.

Read from the settings (`Settings.keys()`: the data dir's credentials file, one profile per
key with its `eaglenest_account_id`, and EAGLENEST_ACCESS_KEY_ID) and read again when the
credentials file changes, so a key `eaglenest keys create` adds works and one `eaglenest
keys revoke` removes is refused without a restart (one stat per request).
"""

from __future__ import annotations

import threading

from eaglenest.foundation.settings import AccessKey, Settings


class KeyRing:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, AccessKey] = settings.keys()
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.settings.credentials_file.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def current(self) -> dict[str, AccessKey]:
        """Access key id -> key, as the credentials file is now (a snapshot: use the same
        one for the signature and the account)."""
        stamp = self._file_stamp()
        if stamp != self._stamp:
            with self._lock:
                self._keys, self._stamp = self.settings.keys(), stamp
        return self._keys
