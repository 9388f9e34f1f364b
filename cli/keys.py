"""`eaglenest keys create|list|revoke`: the access keys of an EagleNest and their accounts.

Keys live in the data dir's credentials file (AWS shared-credentials format, 0600; one
profile per key, usable as `AWS_PROFILE=<name>` with the data dir's `config`), each with the
12-digit account it acts for (`eaglenest_account_id`; a profile without one acts for
EAGLENEST_ACCOUNT_ID, as the first start's key does). The API re-reads the file when it
changes: a created key works, a revoked one is refused, without a restart. A secret is shown
once, when its key is created; `list` never shows one. Every write leaves the file 0600
(tightened, with a note, if it was readable by others). A file with one access key id under
two profiles is refused (CredentialsError: `eaglenest: error: ...`, exit 1) by every command
but `revoke`, which may be what fixes it: revoking a key id removes every profile holding it.
"""

from __future__ import annotations

import argparse
import configparser
import re
import secrets
import sys

from eaglenest.cli.datadir import add_data_dir_option, settings_for
from eaglenest.foundation.settings import ACCOUNT_OPTION, CredentialsError, Settings, read_keys
from eaglenest.workers.infra.credentials import new_key_pair, private_data_dir, write_config

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ACCOUNT = re.compile(r"^\d{12}$")


def _settings(args: argparse.Namespace) -> Settings:
    settings = settings_for(args)
    private_data_dir(settings.data_dir)
    return settings


def _read(settings: Settings, *, check_keys: bool = True) -> configparser.ConfigParser:
    """The credentials file as INI. CredentialsError when it is not INI or (`check_keys`)
    when an access key id is under two profiles."""
    if check_keys:
        read_keys(settings.credentials_file, settings.account_id)
    parser = configparser.ConfigParser()
    try:
        parser.read(settings.credentials_file)
    except configparser.Error as exc:
        raise CredentialsError(f"{settings.credentials_file}: {exc}") from None
    return parser


def _write(settings: Settings, parser: configparser.ConfigParser) -> None:
    """Write the credentials file, 0600 whatever it was; a note when that tightened it."""
    path = settings.credentials_file
    before = path.stat().st_mode & 0o777 if path.exists() else 0o600
    write_config(path, parser)
    if before & 0o077:
        print(f"note: {path} was mode {before:o} (readable by other users); it is now 600",
              file=sys.stderr)


def cmd_create(args: argparse.Namespace) -> int:
    settings = _settings(args)
    parser = _read(settings)
    if args.account and not _ACCOUNT.match(args.account):
        print(f"error: --account {args.account!r} is not a 12-digit account id", file=sys.stderr)
        return 2
    account = args.account or ("".join(secrets.choice("0123456789") for _ in range(12))
                               if args.new_account else settings.account_id)
    name = args.name or f"key-{len(parser.sections()) + 1}"
    if not _NAME.match(name) or parser.has_section(name):
        print(f"error: --name {name!r} is taken or not a profile name (letters, digits, "
              "'_', '.', '-')", file=sys.stderr)
        return 2
    key, secret = new_key_pair()
    parser[name] = {"aws_access_key_id": key, "aws_secret_access_key": secret,
                    ACCOUNT_OPTION: account}
    _write(settings, parser)
    config = configparser.ConfigParser()
    config.read(settings.data_dir / "config")
    config[f"profile {name}"] = {"region": settings.region}
    write_config(settings.data_dir / "config", config)
    print(f"name: {name}\naccount: {account}\naccess key id: {key}\n"
          f"secret access key: {secret}\n(shown once; profile {name!r} in "
          f"{settings.credentials_file})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    keys = read_keys(settings.credentials_file, settings.account_id)
    if settings.access_key_id:
        print(f"{'(environment)':<20} {settings.access_key_id:<22} {settings.account_id}")
    for k in keys.values():
        print(f"{k.name:<20} {k.access_key_id:<22} {k.account_id}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    settings = _settings(args)
    parser = _read(settings, check_keys=False)  # revoking may fix a duplicated key id
    found = [s for s in parser.sections()
             if args.key in (s, parser.get(s, "aws_access_key_id", fallback=None))]
    if not found:
        print(f"error: no key {args.key!r} in {settings.credentials_file}", file=sys.stderr)
        return 1
    for section in found:  # a key id under several profiles: it stops working in all
        parser.remove_section(section)
    _write(settings, parser)
    print(f"revoked: {', '.join(found)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser("keys", help="create, list or revoke access keys (one account each)",
                          description=__doc__)
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    c = ksub.add_parser("create", help="a new key pair (prints its secret once)")
    c.add_argument("--name", help="its profile name (default: key-<n>)")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--account", help="the 12-digit account it acts for (default: "
                                         "EAGLENEST_ACCOUNT_ID)")
    which.add_argument("--new-account", action="store_true",
                       help="a new account of its own (a random 12-digit id)")
    c.set_defaults(func=cmd_create)
    ls = ksub.add_parser("list", help="name, access key id and account of each key")
    ls.set_defaults(func=cmd_list)
    r = ksub.add_parser("revoke", help="remove a key (by access key id or profile name)")
    r.add_argument("key", help="the access key id or the profile name of the key")
    r.set_defaults(func=cmd_revoke)
    for p in (c, ls, r):
        add_data_dir_option(p)
