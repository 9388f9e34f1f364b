from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglenest.models.data import (
    BUILTIN_NAMES,
    Chat,
    Completion,
    DataError,
    load_examples,
    read_jsonl,
)


def write(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_three_formats(tmp_path: Path) -> None:
    f = write(
        tmp_path / "d.jsonl",
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
            ]
        },
        {"prompt": "2+2=", "completion": "4"},
    )
    a, b, c = read_jsonl(f)
    assert isinstance(a, Chat) and a.messages[1] == {"role": "assistant", "content": "yo"}
    assert isinstance(b, Chat) and b.messages[2]["content"] == "a"
    assert isinstance(c, Completion) and c.completion == "4"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"foo": 1}', "unknown format"),
        ('{"conversations": [{"from": "alien", "value": "x"}]}', "unknown speaker"),
        ('{"messages": [{"role": "user", "content": "only a question"}]}', "no assistant turn"),
        ('{"prompt": "p", "completion": 3}', "must be strings"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    ok = {"prompt": "a", "completion": "b"}
    f = write(tmp_path / "bad.jsonl", ok, "", line)
    with pytest.raises(DataError, match=message) as err:
        read_jsonl(f)
    assert str(err.value).startswith(f"{f}:3:")


def test_empty_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no usable sample"):
        read_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no .jsonl"):
        load_examples(tmp_path / "nothing-here" if False else _mkdir(tmp_path / "sub"))
    with pytest.raises(DataError, match="no such data file"):
        load_examples(tmp_path / "missing.jsonl")


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def test_directory_reads_all_files(tmp_path: Path) -> None:
    write(tmp_path / "b.jsonl", {"prompt": "x", "completion": "y"})
    write(tmp_path / "a.jsonl", {"prompt": "p", "completion": "q"})
    assert [e.prompt for e in load_examples(tmp_path)] == ["p", "x"]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_datasets(name: str) -> None:
    examples = load_examples(name)
    assert len(examples) >= 24
    assert load_examples("builtin:" + name) == examples
