"""The shard cache (workers/jobs/shard_cache.py, EAGLENEST_SHARD_CACHE): the pipeline run in
this process on the tiny target with a local store, capture backend hf, as
tests/workers/jobs/test_capture_stage.py. The first job writes its shards to the cache under
its S3OutputLocation; a second job on the same target and samples trains from them (no
target forward, the same head); another plan misses; a cache whose files are not what its
index lists, or whose index lists anything but capture files, is ignored with a warning and
replaced; with the cache off nothing is read or written; a failed write costs the cache, not
the job."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eaglenest.foundation.store.storage import LocalStore, StorageError
from eaglenest.workers.jobs.shard_cache import (
    FORMAT,
    CacheError,
    ShardCache,
    file_digest,
    parse_index,
)
from tests.workers.jobs.test_capture_stage import Control, _out, _pipeline, store

__all__ = ["store"]  # the module's fixture, shared with test_capture_stage's helpers

HF = {"EAGLENEST_CAPTURE_BACKEND": "hf", "EAGLENEST_SHARD_CACHE": "1"}


def _cache_root(store: LocalStore) -> Path:
    return store.root / "output" / "jobs" / ".eaglenest-cache" / "shards"


def _record(name: str, store: LocalStore) -> dict[str, Any]:
    return json.loads((_out(store, name) / "provenance.json").read_text())["train"]["capture"]


@pytest.fixture(scope="module")
def first(store: LocalStore, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A job that captures and writes the cache: its capture record."""
    _pipeline(store, tmp_path_factory.mktemp("first"), "first", **HF).run()
    return _record("first", store)


def test_the_first_job_writes_its_shards_and_an_index(store, first):
    key = first["cache"]["key"]
    assert first["cache"] == {"from_cache": False, "key": key,
                              "uri": f"s3://output/jobs/.eaglenest-cache/shards/{key}/"}
    folder = _cache_root(store) / key
    index = json.loads((folder / "index.json").read_text())
    assert (index["format"], index["key"], index["job"]) == (FORMAT, key, "first")
    # 40 training samples in shards of 16, 2 held-out ones in one; no target/ folder
    assert sorted(index["files"]) == [
        "heldout-manifest.json", "heldout-samples.safetensors", "heldout-shard-00000.safetensors",
        "manifest.json", "samples.safetensors", "shard-00000.safetensors",
        "shard-00001.safetensors", "shard-00002.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*index["files"], "index.json"])
    for name, info in index["files"].items():
        assert (folder / name).stat().st_size == info["bytes"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert all(s["complete"] for s in manifest["shards"])


def test_a_second_job_trains_from_the_cache(store, first, tmp_path, caplog):
    control = Control()
    with caplog.at_level(logging.INFO, logger="eaglenest.optimize"):
        _pipeline(store, tmp_path, "second", control, **HF).run()
    record = _record("second", store)
    assert record["cache"] == {**first["cache"], "from_cache": True}
    assert record["reused_shards"] == record["shards"] == 3
    assert [r for r in control.records if "shard" in r] == []  # no shard captured here
    assert f"shards from the cache {first['cache']['uri']} (8 files" in caplog.text
    assert "capture: reusing 3 finished shard(s) of 3" in caplog.text
    a = load_file(_out(store, "first") / "eagle_model" / "model.safetensors")
    b = load_file(_out(store, "second") / "eagle_model" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:  # the same hidden states, the same seed: the same head
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert not (tmp_path / "capture").exists()  # the work dir's copy went at the end


def test_another_plan_misses(store, first, tmp_path):
    _pipeline(store, tmp_path, "other-plan", EAGLENEST_CAPTURE_SHARD_SAMPLES="8", **HF).run()
    record = _record("other-plan", store)
    assert record["cache"]["from_cache"] is False and record["shards"] == 5
    assert record["cache"]["key"] != first["cache"]["key"]
    assert (_cache_root(store) / record["cache"]["key"] / "index.json").is_file()


def test_a_changed_file_is_ignored_with_a_warning_and_replaced(store, first, tmp_path,
                                                              caplog):
    folder = _cache_root(store) / first["cache"]["key"]
    shard = folder / "shard-00001.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(good[:-4] + b"\0\0\0\0")  # same size, other bytes
    control = Control()
    with caplog.at_level(logging.INFO, logger="eaglenest.optimize"):
        _pipeline(store, tmp_path, "changed", control, **HF).run()
    assert (f"ignoring the shard cache {first['cache']['uri']}: shard-00001.safetensors is not "
            f"the file its index lists ({len(good)} bytes, listed {len(good)}); capturing "
            "(the cache will be replaced)") in caplog.text
    assert [r["shard"] for r in control.records if "shard" in r] == [1, 2, 3]
    assert _record("changed", store)["cache"]["from_cache"] is False
    # written again by this job (safetensors' header order varies: not byte for byte)
    index = json.loads((folder / "index.json").read_text())
    assert index["job"] == "changed"
    assert file_digest(shard) == index["files"][shard.name]["sha256"]
    assert shard.stat().st_size == index["files"][shard.name]["bytes"]
    assert not list(tmp_path.rglob("*.cached"))  # what was fetched went


@pytest.mark.parametrize(("index", "message"), [
    (b"{", "its index is not JSON"),
    ({"format": 0}, "its index is not of format 1"),
    ({"key": "other"}, "its index names another key (other...)"),
    ({"files": {"samples.safetensors": {"bytes": 1, "sha256": "x"}}},
     "its index lists no training manifest"),
    ({"files": {"manifest.json": {"bytes": 1, "sha256": "x"},
                "../../../etc/cron.d/x": {"bytes": 1, "sha256": "x"}}},
     "its index lists '../../../etc/cron.d/x', not a capture file name"),
    ({"files": {"manifest.json": {"bytes": 1, "sha256": "x"},
                "target/config.json": {"bytes": 1, "sha256": "x"}}},
     "its index lists 'target/config.json', not a capture file name"),
    ({"files": {"manifest.json": {"bytes": -1, "sha256": "x"}}},
     "its index gives manifest.json no byte count and sha256"),
    ({"files": {"manifest.json": {"bytes": 600, "sha256": "x"},
                "shard-00000.safetensors": {"bytes": 500, "sha256": "x"}}},
     "its index lists 1100 bytes, more than this capture's plan can take (1000)"),
])
def test_an_index_is_used_only_as_written(index, message):
    doc = {"format": FORMAT, "key": "k", "files": {"manifest.json": {"bytes": 1,
                                                                     "sha256": "x"}}}
    data = index if isinstance(index, bytes) else json.dumps({**doc, **index}).encode()
    with pytest.raises(CacheError) as exc:
        parse_index(data, "k", 1000)
    assert str(exc.value).startswith(message), str(exc.value)


def test_a_planted_index_costs_the_cache_not_the_job(store, first, tmp_path, caplog):
    """An index listing a file outside the capture folder's names: nothing is fetched,
    the job captures and replaces the index."""
    index_path = _cache_root(store) / first["cache"]["key"] / "index.json"
    good = index_path.read_text()
    doc = json.loads(good)
    doc["files"]["../../escape.txt"] = {"bytes": 1, "sha256": "x"}
    index_path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="eaglenest.optimize"):
        _pipeline(store, tmp_path, "planted", **HF).run()
    assert "its index lists '../../escape.txt', not a capture file name" in caplog.text
    assert not (tmp_path.parent / "escape.txt").exists()
    assert json.loads(index_path.read_text())["job"] == "planted"


def test_cache_off_neither_reads_nor_writes(store, first, tmp_path):
    before = sorted(p.name for p in _cache_root(store).iterdir())
    control = Control()
    _pipeline(store, tmp_path, "off", control, EAGLENEST_CAPTURE_BACKEND="hf").run()
    assert _record("off", store)["cache"] is None
    assert len([r for r in control.records if "shard" in r]) == 3  # captured here
    assert sorted(p.name for p in _cache_root(store).iterdir()) == before


class FailingPuts(LocalStore):
    """A store whose writes under the cache prefix fail."""

    def put_file(self, uri, path):  # noqa: ANN001
        if ".eaglenest-cache/" in uri.key:
            raise StorageError(f"disk full writing {uri}")
        super().put_file(uri, path)


def test_a_failed_write_costs_the_cache_not_the_job(store, tmp_path, caplog):
    failing = FailingPuts(store.root)
    with caplog.at_level(logging.WARNING, logger="eaglenest.optimize"):
        _pipeline(failing, tmp_path, "unwritten", EAGLENEST_CAPTURE_SHARD_SAMPLES="4",
                  **HF).run()
    record = _record("unwritten", store)
    assert record["cache"]["from_cache"] is False and record["cache"]["uri"] is None
    assert "could not write the shard cache" in caplog.text and "disk full" in caplog.text
    assert not (_cache_root(store) / record["cache"]["key"] / "index.json").exists()


def test_no_key_no_cache(tmp_path, caplog):
    """A target without a folder: a warning, no key; the job goes on without the cache."""
    cache = ShardCache(LocalStore(tmp_path), "s3://output/jobs/", "j")
    with caplog.at_level(logging.WARNING, logger="eaglenest.optimize"):
        assert cache.key(None, [{"shards": []}]) is None
    assert ("job j: no shard cache key (ValueError: the target has no folder to hash); "
            "capturing without the cache") in caplog.text
    assert ShardCache(LocalStore(tmp_path), "s3://output/jobs/", "j", enabled=False).key(
        tmp_path, []) is None
