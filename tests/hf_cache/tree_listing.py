#!/usr/bin/env python3
"""Writes a repo's tree listing with huggingface_hub's own code, as `snapshot_download` leaves it.

usage: tree_listing.py REPO_FOLDER COMMIT FILES_JSON

FILES_JSON maps each path of the repo at COMMIT to `{"size", "blob_id"[, "lfs_sha256", "lfs_size",
"xet_hash"]}`, the fields of the Hub's /tree endpoint. huggingface_hub 2.x (`_tree_cache.py`,
`write_tree_cache`) stores it as `REPO_FOLDER/trees/<COMMIT>.json`: the repo's whole file list,
including files a download skipped with allow_patterns.
"""
import json
import pathlib
import sys

from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache


def main() -> None:
    repo, commit, files = sys.argv[1:4]
    entries = {path: TreeCacheEntry.from_json(info) for path, info in json.loads(pathlib.Path(files).read_text()).items()}
    write_tree_cache(repo, commit, entries)
    if not (pathlib.Path(repo) / "trees" / f"{commit}.json").is_file():
        sys.exit("huggingface_hub wrote no tree listing where the verifier looks")


if __name__ == "__main__":
    main()
