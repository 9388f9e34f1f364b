"""`eaglenest s3 cp SRC DST` and `eaglenest s3 ls URI`: move model folders and datasets into
(or out of) the artifact store the workers read: the local store by default, real S3 when
EAGLENEST_S3_ENDPOINT_URL is set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eaglenest.foundation.settings import Settings
from eaglenest.foundation.storage import (
    StorageError,
    download_prefix,
    make_store,
    parse_uri,
    regular_files,
)
from eaglenest.workers.cli.datadir import add_data_dir_option, require_eaglenest, settings_for


def _settings(args: argparse.Namespace) -> Settings:
    """The local store must belong to an initialised EagleNest (else files would land where
    no server reads them); an S3 store (EAGLENEST_S3_ENDPOINT_URL) needs nothing here."""
    settings = settings_for(args)
    if not settings.s3_endpoint_url:
        require_eaglenest(settings, f"s3 {args.s3_command}")
    return settings


def cmd_cp(args: argparse.Namespace) -> int:
    store = make_store(_settings(args))
    src, dst = args.src, args.dst
    try:
        if src.startswith("s3://") and not dst.startswith("s3://"):
            for path in download_prefix(store, src, Path(dst)):
                print(f"download: -> {path}")
            return 0
        if dst.startswith("s3://") and not src.startswith("s3://"):
            return _upload(store, Path(src), dst)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("error: exactly one of SRC and DST must be an s3:// URI", file=sys.stderr)
    return 2


def _upload(store: object, src: Path, dst: str) -> int:
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
        store.put_file(uri, path)  # type: ignore[attr-defined]
        print(f"upload: {path} -> {uri}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    store = make_store(_settings(args))
    try:
        for key in store.list_keys(parse_uri(args.uri)):
            print(f"s3://{parse_uri(args.uri).bucket}/{key}")
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s3 = sub.add_parser("s3", help="copy files into or out of the artifact store",
                        description="the artifact store the workers read: the data dir's "
                                    "s3/ folder, or EAGLENEST_S3_ENDPOINT_URL when set")
    s3sub = s3.add_subparsers(dest="s3_command", required=True)
    cp = s3sub.add_parser("cp", help="cp SRC DST (a file or a folder, recursively)",
                          description="copy a file or a folder (recursively) into the store "
                                      "or out of it")
    cp.add_argument("src", help="a local path, or an s3:// URI to download")
    cp.add_argument("dst", help="an s3:// URI to upload to (ending in /: a prefix), or a "
                                "local folder")
    add_data_dir_option(cp)
    cp.set_defaults(func=cmd_cp)
    ls = s3sub.add_parser("ls", help="list the keys under an s3:// prefix",
                          description="list the keys under an s3:// prefix")
    ls.add_argument("uri", help="s3://bucket/prefix")
    add_data_dir_option(ls)
    ls.set_defaults(func=cmd_ls)
