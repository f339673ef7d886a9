"""Every run's provenance names its dataset by path and content hash (trn2 has no fixture fallback to hide behind)."""

from __future__ import annotations

import shutil

from harness.checks.preflight import preflight
from harness.config.build import build_config
from harness.config.provenance import dataset_info, provenance
from harness.options.run_options import RunOptions
from recipes.tiers import FIXTURES

CORPUS = FIXTURES / "corpus"


def copy_corpus(tmp_path, name="data"):
    target = tmp_path / name
    shutil.copytree(CORPUS, target)
    return target


def test_the_hash_is_of_the_data_not_of_where_it_lies(tmp_path):
    here, there = dataset_info(CORPUS), dataset_info(copy_corpus(tmp_path))
    assert here["sha256"] and len(here["sha256"]) == 64
    assert here["sha256"] == there["sha256"] and here["path"] != there["path"]
    assert here["files"] == [
        {"name": "train.jsonl", "bytes": (CORPUS / "train.jsonl").stat().st_size}
    ]


def test_one_changed_byte_renamed_file_or_extra_shard_changes_the_hash(tmp_path):
    base = dataset_info(CORPUS)["sha256"]

    edited = copy_corpus(tmp_path, "edited")
    text = (edited / "train.jsonl").read_bytes()
    (edited / "train.jsonl").write_bytes(text[:-2] + bytes([text[-2] ^ 1]) + text[-1:])
    assert dataset_info(edited)["sha256"] != base

    renamed = copy_corpus(tmp_path, "renamed")
    (renamed / "train.jsonl").rename(renamed / "shard0.jsonl")
    assert dataset_info(renamed)["sha256"] != base

    extra = copy_corpus(tmp_path, "extra")
    (extra / "more.json").write_text(
        '{"text": "one more line"}\n'
    )  # *.json is read as JSON lines too
    assert [f["name"] for f in dataset_info(extra)["files"]] == ["more.json", "train.jsonl"]
    assert dataset_info(extra)["sha256"] != base


def test_files_the_loader_does_not_read_leave_the_hash_alone(tmp_path):
    data = copy_corpus(tmp_path)
    (data / "README.md").write_text("about this corpus\n")
    (data / "LICENSE").write_text("changed\n")
    assert dataset_info(data)["sha256"] == dataset_info(CORPUS)["sha256"]


def test_a_run_records_its_dataset_path_and_hash(tmp_path):
    data = copy_corpus(tmp_path)
    opts = preflight(
        RunOptions(
            recipe="native_qwen3",
            tier="cpu",
            nproc=1,
            steps=1,
            init="random",
            seed=0,
            dataset_dir=data,
        )
    )
    recorded = provenance(opts, build_config(opts))["data"]
    assert recorded["path"] == str(data)
    assert recorded["sha256"] == dataset_info(CORPUS)["sha256"]
    assert recorded["files"] == [
        {"name": "train.jsonl", "bytes": (data / "train.jsonl").stat().st_size}
    ]
    assert {"seq_len", "local_batch_size", "global_batch_size"} <= set(recorded)
