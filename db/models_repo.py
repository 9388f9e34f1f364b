"""Models: create, get, list, delete. Models have no lifecycle of their own."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api.errors import ValidationException
from db import tags_repo
from db.common import Account, find, insert_unique, now
from db.tables import ModelRow


def not_found(account: Account, name: str) -> ValidationException:
    return ValidationException(f'Could not find model "{account.arn("model", name)}".')


def create(session: Session, account: Account, spec: dict[str, Any]) -> ModelRow:
    name = spec["ModelName"]
    tags = tags_repo.check_new_tags(spec.pop("Tags", None) or [])
    row = ModelRow(
        name=name, name_key=name.lower(), arn=account.arn("model", name),
        creation_time=now(), spec=spec, tags=tags,
    )
    duplicate = ValidationException(f'Cannot create already existing model "{row.arn}".')
    insert_unique(session, row, duplicate)
    return row


def get(session: Session, account: Account, name: str) -> ModelRow:
    row = find(session, ModelRow, name)
    if row is None:
        raise not_found(account, name)
    return row


def delete(session: Session, account: Account, name: str) -> None:
    session.delete(get(session, account, name))
