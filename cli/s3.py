"""`eaglenest s3 cp SRC DST` and `eaglenest s3 ls URI`: move model folders and datasets into
(or out of) the artifact store the workers read: the local store by default, real S3 when
EAGLENEST_S3_ENDPOINT_URL is set. `eaglenest s3 cp s3://bucket/key -` writes one object to
stdout as it is read, `eaglenest s3 cp - s3://bucket/key` uploads stdin (as `aws s3 cp`).

Each command acts for one account, through its view of the store (foundation/store/buckets.py):
by default the account of the credentials file's first-start profile (`eaglenest`), else
EAGLENEST_ACCOUNT_ID; `--profile NAME` or `--access-key ID` picks another key of the data
dir (`eaglenest keys`). An upload claims a bucket no account owns; another account's bucket
is refused (exit 1, the error naming the URI and the account acted for), and so is a read of
a bucket no account owns by an account other than the default one.

`eaglenest s3 owner s3://bucket [--account ID | --release]` is the operator's: it prints a
bucket's owner, assigns one (replacing any) or releases it (no owner: readable only by the
default account, EAGLENEST_ACCOUNT_ID, until an account writes into it or is assigned it)."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from eaglenest.cli.datadir import add_data_dir_option, require_eaglenest, settings_for
from eaglenest.foundation.settings import CREDENTIALS_PROFILE, Settings
from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
from eaglenest.foundation.store.storage import (
    ArtifactStore,
    BucketStore,
    StorageError,
    download_prefix,
    make_store,
    parse_uri,
    regular_files,
)


def _settings(args: argparse.Namespace) -> Settings:
    """The local store must belong to an initialised EagleNest (else files would land where
    no server reads them); an S3 store (EAGLENEST_S3_ENDPOINT_URL) needs nothing here."""
    settings = settings_for(args)
    if not settings.s3_endpoint_url:
        require_eaglenest(settings, f"s3 {args.s3_command}")
    return settings


def _store(args: argparse.Namespace) -> tuple[AccountStore, str]:
    """The store as the chosen key's account sees it, and who that is (for messages)."""
    settings = _settings(args)
    keys = settings.keys()
    if args.access_key or args.profile:
        found = [k for k in keys.values()
                 if args.access_key in (None, k.access_key_id) and args.profile in (None, k.name)]
        if not found:
            which = f"--access-key {args.access_key}" if args.access_key else \
                f"--profile {args.profile}"
            raise SystemExit(f"eaglenest s3 {args.s3_command}: {which}: no such key in "
                             f"{settings.credentials_file} (see `eaglenest keys list`)")
        key = found[0]
        return AccountStore(make_store(settings), key.account_id), \
            f"account {key.account_id} (key {key.name})"
    default = next((k for k in keys.values() if k.name == CREDENTIALS_PROFILE), None)
    account = default.account_id if default else settings.account_id
    return AccountStore(make_store(settings), account), \
        f"account {account} (the default; pick another with --profile or --access-key)"


def _failed(exc: StorageError, who: str) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if isinstance(exc, AccessDenied):
        print(f"(acting for {who})", file=sys.stderr)
    return 1


def cmd_cp(args: argparse.Namespace) -> int:
    store, who = _store(args)
    src, dst = args.src, args.dst
    try:
        if src.startswith("s3://") and dst == "-":
            return _to_stdout(store, src)
        if src == "-" and dst.startswith("s3://"):
            return _from_stdin(store, dst)
        if src.startswith("s3://") and not dst.startswith("s3://"):
            for path in download_prefix(store, src, Path(dst)):
                print(f"download: -> {path}")
            return 0
        if dst.startswith("s3://") and not src.startswith("s3://"):
            return _upload(store, Path(src), dst)
    except StorageError as exc:
        return _failed(exc, who)
    print("error: exactly one of SRC and DST must be an s3:// URI", file=sys.stderr)
    return 2


def _to_stdout(store: AccountStore, src: str) -> int:
    """`cp s3://b/k -`: the object's bytes to stdout as they are read (as `aws s3 cp`)."""
    uri = parse_uri(src)
    if not uri.key or uri.key.endswith("/"):
        print(f"error: {src}: streaming to stdout takes one object, not a prefix",
              file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    with store.open_object(uri) as reader:
        while block := reader.read(1024 * 1024):
            out.write(block)
    out.flush()
    return 0


def _from_stdin(store: AccountStore, dst: str) -> int:
    """`cp - s3://b/k`: stdin, spooled to a temporary file, becomes the object."""
    uri = parse_uri(dst)
    if not uri.key or uri.key.endswith("/"):
        print(f"error: {dst}: uploading stdin needs an object key", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stdin"
        with path.open("wb") as fh:
            shutil.copyfileobj(sys.stdin.buffer, fh, 1024 * 1024)
        store.put_file(uri, path)
    print(f"upload: - -> {uri}", file=sys.stderr)
    return 0


def _upload(store: ArtifactStore, src: Path, dst: str) -> int:
    if not src.exists():
        print(f"error: {src} does not exist", file=sys.stderr)
        return 1
    if src.is_file() and src.is_symlink():
        raise StorageError(f"{src} is a symbolic link; uploads copy regular files only")
    files = [src] if src.is_file() else regular_files(src)
    base = parse_uri(dst)
    for path in files:
        if src.is_file():
            uri = base if not dst.endswith("/") else base.child(path.name)
        else:
            uri = base.child(path.relative_to(src).as_posix())
        store.put_file(uri, path)
        print(f"upload: {path} -> {uri}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    store, who = _store(args)
    try:
        for key in store.list_keys(parse_uri(args.uri)):
            print(f"s3://{parse_uri(args.uri).bucket}/{key}")
    except StorageError as exc:
        return _failed(exc, who)
    return 0


def _describe(store: BucketStore, bucket: str) -> str:
    owner = store.owner(bucket)
    if owner is not None:
        return f"account {owner}"
    return (f"none (readable only by the default account {store.default_account}; the first "
            "account to write into it owns it)")


def cmd_owner(args: argparse.Namespace) -> int:
    """Print the bucket's owner, or assign/release it and print the change."""
    if args.account is not None and not re.fullmatch(r"\d{12}", args.account):
        print(f"error: --account {args.account}: an account id is 12 digits", file=sys.stderr)
        return 1
    store = make_store(_settings(args))
    try:
        bucket = parse_uri(args.uri).bucket
        before = _describe(store, bucket)
        if args.release:
            store.release(bucket)
        elif args.account is not None:
            store.assign(bucket, args.account)
        else:
            print(f"s3://{bucket}: owner {before}")
            return 0
        was = before.split(" (")[0]
        print(f"s3://{bucket}: owner {_describe(store, bucket)} (was {was})")
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_key_options(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--profile", metavar="NAME",
                       help="act for the account of this profile of the data dir's "
                            "credentials file (default: profile eaglenest's, else "
                            "EAGLENEST_ACCOUNT_ID)")
    which.add_argument("--access-key", metavar="ID",
                       help="act for the account of this access key (`eaglenest keys list`; "
                            "default: as --profile's)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s3 = sub.add_parser("s3", help="copy files into or out of the artifact store",
                        description="the artifact store the workers read: the data dir's "
                                    "s3/ folder, or EAGLENEST_S3_ENDPOINT_URL when set; "
                                    "buckets belong to the account that first wrote them")
    s3sub = s3.add_subparsers(dest="s3_command", required=True)
    cp = s3sub.add_parser("cp", help="cp SRC DST (a file or a folder, recursively)",
                          description="copy a file or a folder (recursively) into the store "
                                      "or out of it")
    cp.add_argument("src", help="a local path, or an s3:// URI to download ('-': "
                                "stdin, uploaded to one object)")
    cp.add_argument("dst", help="an s3:// URI to upload to (ending in /: a prefix), or a "
                                "local folder ('-': the object to stdout)")
    add_data_dir_option(cp)
    _add_key_options(cp)
    cp.set_defaults(func=cmd_cp)
    ls = s3sub.add_parser("ls", help="list the keys under an s3:// prefix",
                          description="list the keys under an s3:// prefix")
    ls.add_argument("uri", help="s3://bucket/prefix")
    add_data_dir_option(ls)
    _add_key_options(ls)
    ls.set_defaults(func=cmd_ls)
    own = s3sub.add_parser("owner", help="print, assign or release a bucket's owner",
                           description="print the account that owns a bucket, or (the "
                                       "operator's) assign it to an account or release it")
    own.add_argument("uri", help="s3://bucket (a key after it is ignored)")
    change = own.add_mutually_exclusive_group()
    change.add_argument("--account", metavar="ID",
                        help="make this 12-digit account the owner, replacing any "
                             "(default: none, print the owner)")
    change.add_argument("--release", action="store_true",
                        help="leave the bucket with no owner: readable only by the default "
                             "account until an account writes into it; an account whose "
                             "resources read it is refused until it is assigned again")
    add_data_dir_option(own)
    own.set_defaults(func=cmd_owner)
