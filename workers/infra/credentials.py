"""First-start credentials (an access key pair in AWS shared-credentials format) and the
data directory's permissions.

Contract: the data dir is 0700 and what EagleNest writes in it is 0600 (`private_data_dir`
sets a 077 umask for the process and tightens the files an older version left readable);
the credentials file is the operator's to place, so a copy readable by others is reported
(`loose_credentials`), not changed, until EagleNest writes it (first start, `keys create`,
`keys revoke`): every write leaves it 0600, tightened before the first byte."""

from __future__ import annotations

import configparser
import os
import secrets
import string
from pathlib import Path

from eaglenest.foundation.settings import CREDENTIALS_PROFILE, Settings


def _random(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def ensure_credentials(settings: Settings) -> tuple[str, bool]:
    """Make sure a key pair exists. Returns (access key id, created_now)."""
    existing = settings.credentials()
    if existing:
        return next(iter(existing)), False
    key, secret = new_key_pair()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    creds = configparser.ConfigParser()
    creds[CREDENTIALS_PROFILE] = {"aws_access_key_id": key, "aws_secret_access_key": secret}
    _write_private(settings.credentials_file, creds)
    config = configparser.ConfigParser()
    config[f"profile {CREDENTIALS_PROFILE}"] = {"region": settings.region}
    _write_private(settings.data_dir / "config", config)
    return key, True


def new_key_pair() -> tuple[str, str]:
    """A new access key id and secret, shaped as AWS's."""
    return ("AKIA" + _random(string.ascii_uppercase + string.digits, 16),
            _random(string.ascii_letters + string.digits + "+/", 40))


def write_config(path: Path, parser: configparser.ConfigParser) -> None:
    """Write an INI file readable by its owner alone (0600, even if it was looser)."""
    _write_private(path, parser)


def _write_private(path: Path, parser: configparser.ConfigParser) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only
        parser.write(fh)


#: files of the data dir that hold secrets or everything (tightened to 0600 at start)
PRIVATE_FILES = ("eaglenest.db", "eaglenest.db-wal", "eaglenest.db-shm", "eaglenest.db-journal",
                 "eaglenest.log", "broker.aof", "broker.json", "broker.conf", "broker.password",
                 "broker.log", "config")


def private_data_dir(data_dir: Path) -> None:
    """Make `data_dir` (0700) and everything this process creates from now on private."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    for name in PRIVATE_FILES:
        path = data_dir / name
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)
    aof_dir = data_dir / "appendonlydir"
    if aof_dir.is_dir():
        os.chmod(aof_dir, 0o700)


def loose_credentials(settings: Settings) -> str | None:
    """A warning when the credentials file can be read by others than its owner."""
    path = settings.credentials_file
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return None
    if mode & 0o077:
        return (f"warning: {path} (mode {mode:o}) can be read by other users; its keys give "
                f"full access to EagleNest. Run: chmod 600 {path}")
    return None


def usage(settings: Settings, host: str, port: int) -> str:
    d = settings.data_dir.resolve()
    url = f"http://{host}:{port}"
    if settings.access_key_id:
        creds = "credentials: the EAGLENEST_ACCESS_KEY_ID / EAGLENEST_SECRET_ACCESS_KEY you set"
    else:
        creds = (
            f"export AWS_SHARED_CREDENTIALS_FILE={d}/credentials AWS_CONFIG_FILE={d}/config "
            f"AWS_PROFILE={CREDENTIALS_PROFILE}"
        )
    return (
        f"EagleNest is listening on {url}\n  {creds}\n"
        f"  aws sagemaker list-models --endpoint-url {url}\n"
        f"  boto3.client('sagemaker', endpoint_url='{url}')"
    )
