"""Carrying files to the GPU machine: pack into checksummed parts, reassemble byte for byte, name a
corrupted or missing part."""

import os

import pytest

from lpes_nb.operations import carry


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "src"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "model.safetensors").write_bytes(os.urandom(300_000))
    (root / "weights" / "config.json").write_text('{"layers": 2}')
    (root / "empty.txt").write_bytes(b"")
    (root / "data.bin").write_bytes(os.urandom(123_457))
    return root


def test_pack_and_unpack_round_trip_byte_identically(tree, tmp_path):
    packed = tmp_path / "packed"
    manifest = carry.pack([tree], packed, root=tree, part_mib=0.1)  # parts of 104,857 bytes
    assert len(manifest["parts"]) == 5 and all(p["bytes"] <= 0.1 * 2**20 for p in manifest["parts"])
    out = carry.unpack(packed, tmp_path / "dest")
    assert len(out) == 4
    for p in tree.rglob("*"):
        if p.is_file():
            assert (tmp_path / "dest" / p.relative_to(tree)).read_bytes() == p.read_bytes()


def test_a_corrupted_or_missing_part_is_named(tree, tmp_path):
    packed = tmp_path / "packed"
    carry.pack([tree], packed, root=tree, part_mib=0.1)
    with open(packed / "part-00002", "r+b") as f:
        f.seek(10)
        f.write(b"\x00\xff")
    (packed / "part-00004").unlink()
    with pytest.raises(ValueError, match=r"2 of 5 parts.*part-00002 is corrupted.*part-00004 is missing"):
        carry.unpack(packed, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()  # nothing half-written


def test_bad_requests_are_refused(tree, tmp_path):
    with pytest.raises(ValueError, match=r"part_mib must be in \(0, 64\]"):
        carry.pack([tree], tmp_path / "p", root=tree, part_mib=100)
    with pytest.raises(FileNotFoundError, match="nothing to pack"):
        carry.pack([tree / "nope"], tmp_path / "p", root=tree)
    with pytest.raises(ValueError, match="outside the packing root"):
        carry.pack([tree], tmp_path / "p", root=tree / "weights")
