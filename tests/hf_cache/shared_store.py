#!/usr/bin/env python3
"""Lays out a Hugging Face cache whose files live in huggingface_hub 2.x's cache-wide Xet store,
with huggingface_hub's own code, offline, for the verifier's tests.

usage: shared_store.py CACHE_DIR COMMIT FILE_LIST REPO_ID...

FILE_LIST holds one `<path in repo> <file with its content>` per line. For each repo, each file goes
where `hf_hub_download` puts a Xet-backed file (`file_download.py`, `_hf_hub_download_to_cache_dir`):
the first repo's blob `blobs/<sha256>` is published to the shared store with
`publish_blob_to_shared_store` (the blob becomes a link to `<cache>/blobs/<2 hex>/<xet hash>`), the
other repos link the same store entry with `try_link_from_shared_store`, the snapshot entry is made
with `_create_symlink`, and `refs/main` names COMMIT. The Xet hash is hf_xet's own `hash_files`.
Private functions of huggingface_hub 2.4: the test pins the layout they write. Finally
`scan_cache_dir` (what `hf cache scan` runs) must accept the cache; the script prints its view.
"""
import hashlib
import json
import pathlib
import sys

import hf_xet
from huggingface_hub import scan_cache_dir
from huggingface_hub.file_download import _create_symlink, repo_folder_name
from huggingface_hub.utils._shared_blobs import publish_blob_to_shared_store, try_link_from_shared_store


def main() -> None:
    cache, commit, file_list, *repos = sys.argv[1:]
    cache = pathlib.Path(cache)
    files = [line.split(" ", 1) for line in pathlib.Path(file_list).read_text().splitlines() if line]
    for index, repo_id in enumerate(repos):
        storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / "main").write_text(commit)
        for rel, source in files:
            content = pathlib.Path(source).read_bytes()
            etag = hashlib.sha256(content).hexdigest()
            xet_hash = hf_xet.hash_files([source])[0].hash
            blob = storage / "blobs" / etag
            blob.parent.mkdir(parents=True, exist_ok=True)
            if index == 0:
                blob.write_bytes(content)
                shared = publish_blob_to_shared_store(
                    blob_path=str(blob), xet_hash=xet_hash, cache_dir=cache, expected_size=len(content)
                )
            else:
                shared = try_link_from_shared_store(
                    blob_path=str(blob), xet_hash=xet_hash, cache_dir=cache, expected_size=len(content)
                )
            if not shared:
                sys.exit(f"huggingface_hub did not share {rel} of {repo_id}")
            pointer = storage / "snapshots" / commit / rel
            pointer.parent.mkdir(parents=True, exist_ok=True)
            _create_symlink(str(blob), str(pointer), new_blob=False)
    info = scan_cache_dir(cache)
    if info.warnings:
        sys.exit(f"scan_cache_dir refused the cache: {info.warnings}")
    view = {
        repo.repo_id: sorted((f.file_name, f.size_on_disk) for r in repo.revisions for f in r.files)
        for repo in info.repos
    }
    print(json.dumps(view))


if __name__ == "__main__":
    main()
