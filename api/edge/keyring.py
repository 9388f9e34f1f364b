"""The access keys requests may be signed with, and the account each acts for.

Read from the settings (`Settings.keys()`: the data dir's credentials file, one profile per
key with its `eaglenest_account_id`, and EAGLENEST_ACCESS_KEY_ID) and read again when the
credentials file changes, so a key `eaglenest keys create` adds works and one `eaglenest
keys revoke` removes is refused without a restart (one stat per request).

A file the settings refuse (CredentialsError: one access key id under two profiles, or not
INI) is logged as an error naming the profiles; its other keys keep working, a duplicated
key id is unknown (a request signed with it gets UnrecognizedClientException, 403), never
taken for one of its accounts.
"""

from __future__ import annotations

import logging
import threading

from eaglenest.foundation.settings import AccessKey, CredentialsError, Settings

log = logging.getLogger("eaglenest.api")


class KeyRing:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, AccessKey] = self._load()
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
                self._keys, self._stamp = self._load(), stamp
        return self._keys

    def _load(self) -> dict[str, AccessKey]:
        try:
            return self.settings.keys()
        except CredentialsError as exc:
            log.error("credentials: %s (until the file is fixed, requests signed with a key "
                      "it names twice, or with any of its keys if it is not INI, are refused)",
                      exc)
            keys = dict(exc.usable)
            s = self.settings  # EAGLENEST_ACCESS_KEY_ID, as Settings.keys() adds it
            if s.access_key_id and s.secret_access_key:
                keys[s.access_key_id] = AccessKey(s.access_key_id, s.secret_access_key,
                                                  s.account_id, "environment")
            return keys
