"""Carrying files to a machine without network (the GPU kit's first step): pack files into parts of at
most ``part_mib`` MiB with a manifest of SHA-256 checksums (each part's and each file's), and on the
other side verify every part, name any corrupted or missing one, and reassemble the files byte for
byte.

``lpes carry pack OUT FILE_OR_DIR ...`` and ``lpes carry unpack OUT DEST``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
PART_MIB = 60  # the GPU machine takes at most 64 MiB of working tree per call


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(sources: list[Path], root: Path) -> list[Path]:
    out = []
    for source in sources:
        if not source.exists():
            raise FileNotFoundError(f"nothing to pack at {source}")
        out += sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    for p in out:
        if not p.resolve().is_relative_to(root.resolve()):
            raise ValueError(f"{p} is outside the packing root {root}; pack files under it")
    return out


def pack(sources: list[Path | str], out: Path | str, root: Path | str = ".", part_mib: float = PART_MIB) -> dict:
    """Concatenate the files under ``sources`` (paths relative to ``root`` are kept) into
    ``out/part-00000`` ... of at most ``part_mib`` MiB, and write ``out/manifest.json``."""
    if not 0 < part_mib <= 64:
        raise ValueError(f"part_mib must be in (0, 64] (the GPU machine's per-call limit), got {part_mib!r}")
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    limit = int(part_mib * 2**20)
    files = _files([Path(s) for s in sources], root)
    manifest: dict = {"part_bytes": limit, "files": [], "parts": []}
    part, written = None, limit

    def next_part():
        nonlocal part, written
        if part is not None:
            part.close()
        name = f"part-{len(manifest['parts']):05d}"
        manifest["parts"].append({"name": name})
        part, written = open(out / name, "wb"), 0

    for path in files:
        manifest["files"].append({"path": path.resolve().relative_to(root.resolve()).as_posix(), "bytes": path.stat().st_size,
                                  "sha256": _sha256(path)})
        with open(path, "rb") as f:
            while block := f.read(min(1 << 20, limit)):
                while block:
                    if written == limit:
                        next_part()
                    take = block[: limit - written]
                    part.write(take)
                    written += len(take)
                    block = block[len(take):]
    if part is None:
        next_part()
    part.close()
    for entry in manifest["parts"]:
        entry.update(bytes=(out / entry["name"]).stat().st_size, sha256=_sha256(out / entry["name"]))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify(packed: Path | str) -> dict:
    """The manifest, after checking every part's size and checksum; a clear error naming each part
    that is missing or corrupted."""
    packed = Path(packed)
    manifest = json.loads((packed / MANIFEST).read_text())
    bad = []
    for entry in manifest["parts"]:
        path = packed / entry["name"]
        if not path.exists():
            bad.append(f"{entry['name']} is missing")
        elif path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
            bad.append(f"{entry['name']} is corrupted (sha256 or size differs from the manifest)")
    if bad:
        raise ValueError(f"{len(bad)} of {len(manifest['parts'])} parts in {packed} fail their checksum: " + "; ".join(bad))
    return manifest


def unpack(packed: Path | str, dest: Path | str) -> list[Path]:
    """Verify the parts, reassemble every file under ``dest`` and check each file's checksum."""
    packed, dest = Path(packed), Path(dest)
    manifest = verify(packed)
    parts = iter(manifest["parts"])
    current, left = None, 0

    def read(n: int) -> bytes:
        nonlocal current, left
        chunks = []
        while n:
            if left == 0:
                entry = next(parts)
                if current is not None:
                    current.close()
                current, left = open(packed / entry["name"], "rb"), entry["bytes"]
            chunk = current.read(min(n, left, 1 << 20))
            chunks.append(chunk)
            n -= len(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    written = []
    for entry in manifest["files"]:
        target = dest / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            remaining = entry["bytes"]
            while remaining:
                chunk = read(min(remaining, 1 << 20))
                f.write(chunk)
                remaining -= len(chunk)
        if _sha256(target) != entry["sha256"]:
            raise ValueError(f"{entry['path']} reassembled with a different sha256 than it was packed with")
        written.append(target)
    if current is not None:
        current.close()
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="lpes carry", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("out")
    p.add_argument("sources", nargs="+")
    p.add_argument("--root", default=".")
    p.add_argument("--part-mib", type=float, default=PART_MIB)
    u = sub.add_parser("unpack")
    u.add_argument("packed")
    u.add_argument("dest")
    args = parser.parse_args(argv)
    if args.command == "pack":
        m = pack(args.sources, args.out, args.root, args.part_mib)
        print(f"[carry] {len(m['files'])} files in {len(m['parts'])} parts under {args.out}")
    else:
        print(f"[carry] {len(unpack(args.packed, args.dest))} files verified and reassembled under {args.dest}")
