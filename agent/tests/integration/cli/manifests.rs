//! Native manifests: `mlnode-agent manifest` writes what `verify` accepts (SHA-256 or BLAKE3),
//! refuses an escaping symlink, and a hub cache is checked against its blob names without one.

use super::*;

/// What `mlnode-agent manifest <args> ROOT` writes for `model`, parsed, and the file it is in.
fn write_manifest(
    model: &PlainModel,
    args: &[&str],
) -> (serde_json::Value, tempfile::TempDir, PathBuf) {
    let output = agent()
        .arg("manifest")
        .args(args)
        .arg(model.root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let written = serde_json::from_slice(&output.stdout).unwrap();
    let (guard, manifest) = write_temp(&String::from_utf8(output.stdout).unwrap());
    (written, guard, manifest)
}

#[test]
fn manifest_command_output_verifies_the_same_tree() {
    let model = PlainModel::new();
    let (written, _guard, manifest) = write_manifest(&model, &["--revision", "r7"]);
    let expected: serde_json::Value =
        serde_json::from_str(&model.manifest_json("r7", true)).unwrap();
    assert_eq!(written, expected);
    assert_eq!(verify(model.root(), &manifest, &[]).code, 0);
}

/// `manifest --hash blake3` writes a native manifest of BLAKE3 digests (several times faster to
/// verify on the same cores) that verifies, and catches a changed byte.
#[test]
fn a_blake3_manifest_verifies_and_catches_a_change() {
    let model = PlainModel::new();
    let (written, _guard, manifest) = write_manifest(&model, &["--hash", "blake3"]);
    let (name, entry) = written["files"].as_object().unwrap().iter().next().unwrap();
    let content = std::fs::read(model.path(name)).unwrap();
    assert_eq!(
        entry["blake3"],
        blake3::hash(&content).to_hex().as_str(),
        "the BLAKE3 of {name}, as the blake3 crate's reference computes it"
    );
    assert!(entry.get("sha256").is_none());
    assert_eq!(verify(model.root(), &manifest, &[]).code, 0);
    let mut changed = content.clone();
    changed[0] ^= 1;
    std::fs::write(model.path(name), changed).unwrap();
    let out = verify(model.root(), &manifest, &["--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stdout.contains("digest_mismatch") && out.stdout.contains("expected blake3"),
        "{}",
        out.stdout
    );
}

#[test]
fn manifest_command_refuses_an_escaping_symlink() {
    let model = PlainModel::new();
    std::os::unix::fs::symlink("/etc/passwd", model.path("passwd")).unwrap();
    let output = agent().arg("manifest").arg(model.root()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("passwd"));
    assert!(output.stdout.is_empty(), "no partial manifest is written");
}

#[test]
fn a_hub_cache_without_a_manifest_is_checked_against_its_blob_names() {
    let cache = testbed::models::HfCache::new();
    // git blob ids (SHA-1) name the small files the hub keeps in git; git hashes "hello\n" this way too.
    cache.add_git_entry(testbed::models::COMMIT, "README.md", b"hello\n");
    assert!(
        cache
            .root()
            .join("blobs/ce013625030ba8dba906f756967f9e9ca394464a")
            .exists(),
        "git's own id of \"hello\\n\""
    );
    let out = verify_without_manifest(&cache.root(), &["--json"]);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    let report = json(&out);
    assert_eq!(report["revision"], testbed::models::COMMIT);
    assert_eq!(report["files"].as_array().unwrap().len(), 4);

    std::fs::write(
        cache
            .root()
            .join("blobs/ce013625030ba8dba906f756967f9e9ca394464a"),
        b"hellO\n",
    )
    .unwrap();
    let blob = testbed::models::sha256_hex(&cache.files["model.safetensors"]);
    std::fs::write(cache.root().join("blobs").join(&blob), b"truncated").unwrap();
    let out = verify_without_manifest(&cache.root(), &["--json"]);
    assert_eq!(out.code, 1);
    let report = json(&out);
    assert_eq!(file_status(&report, "README.md"), "digest_mismatch");
    assert_eq!(file_status(&report, "model.safetensors"), "digest_mismatch");
    let error = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "README.md")
        .unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        error.contains("git blob id ce013625030ba8dba906f756967f9e9ca394464a"),
        "{error}"
    );
}

/// Creates `depth` nested directories named `name` below `dir` without ever naming the whole path
/// (it is longer than PATH_MAX), through directory descriptors.
fn deep_chain(dir: &Path, name: &str, depth: usize) {
    use nix::fcntl::{open, openat, OFlag};
    use nix::sys::stat::{mkdirat, Mode};
    let mut fd = open(dir, OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..depth {
        mkdirat(&fd, name, Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(&fd, name, OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    }
}

/// The extras listing stays in scope: a stray chain of empty directories deeper than PATH_MAX is
/// noted, not fatal (every manifest file is ok); two different non-UTF-8 names are two extras,
/// each named unambiguously; a hub snapshot that is a symlink to /etc lists nothing from /etc.
#[test]
fn the_extras_listing_stays_in_scope_and_never_decides_the_verdict() {
    use std::os::unix::ffi::OsStrExt;
    let model = PlainModel::new();
    let (_dir, manifest) = write_temp(&model.manifest_json("v1", true));
    deep_chain(model.root(), &"d".repeat(200), 30);
    let out = verify(model.root(), &manifest, &["--json"]);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    let report = json(&out);
    let note = report["listing_error"].as_str().unwrap();
    assert!(
        note.len() < 1000 && note.contains("could not be listed"),
        "{note}"
    );
    let out = verify(model.root(), &manifest, &["--json", "--fail-on-extra"]);
    assert_eq!(out.code, 1, "fail_on_extra cannot prove there are none");
    std::fs::remove_dir_all(model.root().join("d".repeat(200))).ok();

    let other = PlainModel::new();
    for name in [&b"weights\xff.bin"[..], b"weights\xfe.bin"] {
        std::fs::write(other.root().join(std::ffi::OsStr::from_bytes(name)), b"x").unwrap();
    }
    let (_dir2, manifest2) = write_temp(&other.manifest_json("v1", true));
    let report = json(&verify(other.root(), &manifest2, &["--json"]));
    let extras: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["status"] == "extra")
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(extras, ["weights\\xfe.bin", "weights\\xff.bin"]);

    let hub = testbed::models::HfCache::new();
    let snapshot = hub.snapshot(testbed::models::COMMIT);
    std::fs::remove_dir_all(&snapshot).unwrap();
    std::os::unix::fs::symlink("/etc", &snapshot).unwrap();
    let (_dir3, manifest3) = write_temp(&hub.manifest_json(testbed::models::COMMIT));
    let out = verify(&hub.root(), &manifest3, &["--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let report = json(&out);
    assert!(
        !report["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["status"] == "extra"),
        "nothing under /etc is an extra of the model: {report}"
    );
}
