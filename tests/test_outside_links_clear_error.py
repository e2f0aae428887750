"""A folder of links that lead outside it reads nothing (links are not followed there, see
store.ingest); split and simulate say so in one line instead of a misleading 'empty split'."""
from __future__ import annotations

from pathlib import Path

import pytest

from simulator.sources import load_logs
from store.split import split_logs


ROOT = Path(__file__).resolve().parents[1]


def _folder_of_outside_links(tmp_path: Path) -> Path:
    real = tmp_path / "elsewhere" / "calls.jsonl"
    real.parent.mkdir()
    real.write_bytes((ROOT / "datasets" / "real" / "agentless_pr28.jsonl").read_bytes())
    folder = tmp_path / "mix"
    folder.mkdir()
    (folder / "calls.jsonl").symlink_to(real)
    return folder


def test_split_names_the_links_it_did_not_follow(tmp_path: Path) -> None:
    folder = _folder_of_outside_links(tmp_path)
    with pytest.raises(ValueError, match=r"1 symbolic link\(s\) lead outside the folder.*calls\.jsonl"):
        split_logs([folder], tmp_path / "out")


def test_simulator_source_names_the_links_it_did_not_follow(tmp_path: Path) -> None:
    folder = _folder_of_outside_links(tmp_path)
    with pytest.raises(ValueError, match=r"no call of mix could be read: 1 symbolic link"):
        load_logs([folder])
    # the file itself, named directly, is read
    src = load_logs([folder / "calls.jsonl"], train=0.5)
    assert src.test and src.train
