//! The `mlnode-agent` binary: exit codes, error messages, `--json`, `manifest`, and bundles made by
//! the real OpenSSF model_signing tool.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use common::{write_temp, PlainModel};

fn agent() -> Command {
    Command::cargo_bin("mlnode-agent").unwrap()
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn verify(root: &Path, manifest: &Path, extra: &[&str]) -> Outcome {
    let mut args = vec![std::ffi::OsStr::new("--manifest"), manifest.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    run_verify(root, &args)
}

/// `mlnode-agent verify ARGS ROOT`.
fn run_verify(root: &Path, args: &[&std::ffi::OsStr]) -> Outcome {
    let output = agent().arg("verify").args(args).arg(root).output().unwrap();
    Outcome {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn json_report_has_the_documented_shape() {
    let model = PlainModel::new();
    let (_guard, manifest) = write_temp(&model.manifest_json("v1", true));
    let out = verify(model.root(), &manifest, &["--json", "--threads", "2"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["status"], "verified");
    assert_eq!(report["revision"], "v1");
    assert_eq!(report["files"].as_array().unwrap().len(), model.files.len());
    for file in report["files"].as_array().unwrap() {
        assert_eq!(file["status"], "ok");
        assert_eq!(file["sha256"].as_str().unwrap().len(), 64);
        assert!(file["size"].is_u64());
    }
    let total: u64 = model.files.values().map(|b| b.len() as u64).sum();
    assert_eq!(report["bytes_hashed"], total);
    assert!(report["seconds"].is_f64());
}

#[test]
fn failed_verification_exits_1_and_names_the_file() {
    let model = PlainModel::new();
    let (_guard, manifest) = write_temp(&model.manifest_json("v1", true));
    std::fs::write(model.path("config.json"), b"{}").unwrap();
    let out = verify(model.root(), &manifest, &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout.contains("size_mismatch") && out.stdout.contains("config.json"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("FAILED"));
}

#[test]
fn bad_manifests_exit_2_with_the_file_the_place_and_the_reason() {
    let model = PlainModel::new();
    let digest = "a".repeat(64);
    let cases: Vec<(String, &str, &str)> = vec![
        (String::new(), "", "is empty"),
        (
            "{\"revision\": \"v1\", \"files\": {\"a\": \"".to_string() + &digest,
            "$",
            "ends too early",
        ),
        ("[1, 2, 3]".to_string(), "$", "JSON object"),
        ("\"just a string\"".to_string(), "$", "JSON object"),
        (
            format!(r#"{{"files": {{"a": "{digest}", "a": "{digest}"}}}}"#),
            "files",
            "duplicate key \"a\"",
        ),
        (
            format!(r#"{{"files": {{"a": "{}"}}}}"#, "a".repeat(63)),
            "$[\"files\"][\"a\"]",
            "63 characters",
        ),
        (
            format!(r#"{{"files": {{"a": "{}"}}}}"#, "A".repeat(64)),
            "$[\"files\"][\"a\"]",
            "lower-case",
        ),
        (
            format!(r#"{{"files": {{"a": {{"sha256": "{digest}", "size": -1}}}}}}"#),
            "$[\"files\"][\"a\"]",
            "size",
        ),
        (
            r#"{"files": {}}"#.to_string(),
            "$[\"files\"]",
            "lists no files",
        ),
        (
            r#"{"revision": "v1"}"#.to_string(),
            "",
            "not a native manifest",
        ),
    ];
    for (text, place, reason) in cases {
        let (_guard, manifest) = write_temp(&text);
        let out = verify(model.root(), &manifest, &[]);
        assert_eq!(out.code, 2, "{text:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&manifest.display().to_string()),
            "{text:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(place),
            "{text:?} should name {place}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(reason),
            "{text:?} should say {reason}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"));
    }
}

#[test]
fn unreadable_manifest_and_missing_root_exit_2() {
    let model = PlainModel::new();
    let out = verify(model.root(), Path::new("/nonexistent/manifest.json"), &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("/nonexistent/manifest.json"));
    let (_guard, manifest) = write_temp(&model.manifest_json("v1", true));
    let out = verify(Path::new("/nonexistent/model"), &manifest, &[]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("/nonexistent/model"), "{}", out.stderr);
}

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

/// model_signing 1.1 signs with BLAKE3 and BLAKE2b too (its API's `hashing_algorithm`): bundles it
/// made, files and shards, verify with the signer's key, and a changed byte fails them. Asked for
/// BLAKE3 shards, model_signing hashes whole files (its `use_shard_serialization` says BLAKE3 is
/// parallel already), so that bundle names plain `blake3`.
#[test]
fn blake3_and_blake2b_bundles_from_model_signing_verify() {
    for (method, shard_size, algorithm, named) in [
        ("files", 0, "blake3", "blake3"),
        ("files", 0, "blake2", "blake2b"),
        ("shards", 1000, "blake3", "blake3"),
        ("shards", 1000, "blake2", "blake2b-sharded-1000"),
    ] {
        use base64::Engine;
        let signed = sign_hashed(method, shard_size, algorithm);
        let bundle: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&signed.bundle).unwrap()).unwrap();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
            .unwrap();
        let statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(
            statement["predicate"]["resources"][0]["algorithm"], named,
            "{method} {algorithm}"
        );
        let out = signed.verify(&["--json"]);
        assert_eq!(
            out.code, 0,
            "{method} {algorithm}: {}{}",
            out.stdout, out.stderr
        );
        assert_eq!(
            json(&out)["root_digest"],
            statement["subject"][0]["digest"]["sha256"],
            "{method} {algorithm}: the root digest is the attestation subject model_signing signed"
        );
        let weights = signed.model.path("model-00001-of-00002.safetensors");
        let mut bytes = std::fs::read(&weights).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&weights, bytes).unwrap();
        let out = signed.verify(&["--json"]);
        assert_eq!(out.code, 1, "{method} {algorithm}: {}", out.stdout);
        assert!(
            out.stdout.contains("digest_mismatch"),
            "{method} {algorithm}: {}",
            out.stdout
        );
    }
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

/// A model signed by the real model_signing tool (installed by the test command).
struct Signed {
    model: PlainModel,
    keys: tempfile::TempDir,
    bundle: PathBuf,
}

fn sign(method: &str, shard_size: usize) -> Signed {
    sign_on(method, shard_size, "secp256r1")
}

/// Signs a fresh model with the real model_signing, with a key on `curve`.
fn sign_on(method: &str, shard_size: usize, curve: &str) -> Signed {
    sign_ignoring(method, shard_size, curve, &[])
}

/// [`sign_on`], with model_signing told to leave `ignored` (paths in the model) out.
fn sign_ignoring(method: &str, shard_size: usize, curve: &str, ignored: &[&str]) -> Signed {
    sign_with(method, shard_size, curve, ignored, None)
}

/// A `certificate` bundle whose chain has `flaw` (tests/model_signing/sign.py's CERT_FLAW).
fn sign_flawed_certificate(flaw: &str) -> Signed {
    sign_with(
        "certificate",
        0,
        "secp256r1",
        &[],
        Some(("CERT_FLAW", flaw)),
    )
}

/// A `files` or `shards` bundle whose files model_signing's API hashed with `algorithm` (its
/// `hashing_algorithm`: blake3, blake2).
fn sign_hashed(method: &str, shard_size: usize, algorithm: &str) -> Signed {
    sign_with(
        method,
        shard_size,
        "secp256r1",
        &[],
        Some(("HASH", algorithm)),
    )
}

fn sign_with(
    method: &str,
    shard_size: usize,
    curve: &str,
    ignored: &[&str],
    env: Option<(&str, &str)>,
) -> Signed {
    let model = PlainModel::new();
    for path in ignored {
        std::fs::write(model.path(path), b"left out on purpose").unwrap();
    }
    let keys = tempfile::tempdir().unwrap();
    let bundle = keys.path().join(format!("{method}.sig"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/model_signing/sign.py");
    let status = Command::new("python3")
        .arg(script)
        .arg(model.root())
        .arg(&bundle)
        .arg(keys.path())
        .arg(method)
        .arg(shard_size.to_string())
        .arg(curve)
        .args(ignored)
        .envs(env)
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "signing with model_signing failed; the test command installs it (`pip install model-signing pyopenssl`)"
    );
    Signed {
        model,
        keys,
        bundle,
    }
}

impl Signed {
    fn public_key(&self) -> PathBuf {
        self.keys.path().join("public.pem")
    }

    fn verify(&self, extra: &[&str]) -> Outcome {
        let key = self.public_key();
        let mut args = vec!["--public-key", key.to_str().unwrap()];
        args.extend_from_slice(extra);
        verify(self.model.root(), &self.bundle, &args)
    }
}

fn json(out: &Outcome) -> serde_json::Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", out.stdout, out.stderr))
}

fn file_status(report: &serde_json::Value, path: &str) -> String {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .map(|f| f["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn model_signing_files_bundle_verifies_and_catches_a_changed_byte() {
    let signed = sign("files", 0);
    let out = signed.verify(&["--json"]);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(json(&out)["status"], "verified");

    let shard = "model-00001-of-00002.safetensors";
    let mut bytes = signed.model.files[shard].clone();
    bytes[100] ^= 0x80;
    std::fs::write(signed.model.path(shard), &bytes).unwrap();
    let out = signed.verify(&["--json"]);
    assert_eq!(out.code, 1);
    assert_eq!(file_status(&json(&out), shard), "digest_mismatch");
}

#[test]
fn model_signing_shards_bundle_verifies_each_shard() {
    // 64 KiB shards: the 300 000-byte file has five, hashed in parallel.
    let signed = sign("shards", 65536);
    let out = signed.verify(&["--json"]);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);

    let shard = "model-00001-of-00002.safetensors";
    let mut bytes = signed.model.files[shard].clone();
    bytes[3 * 65536 + 7] ^= 1; // one byte of the fourth shard
    std::fs::write(signed.model.path(shard), &bytes).unwrap();
    let out = signed.verify(&["--json"]);
    assert_eq!(out.code, 1);
    let report = json(&out);
    assert_eq!(file_status(&report, shard), "digest_mismatch");
    let error = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == shard)
        .unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        error.contains("1 of 5 shards") && error.contains("196608..262144"),
        "{error}"
    );
}

#[test]
fn model_signing_bundle_with_altered_signature_is_refused() {
    let signed = sign("files", 0);
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&signed.bundle).unwrap()).unwrap();
    let sig = bundle["dsseEnvelope"]["signatures"][0]["sig"]
        .as_str()
        .unwrap()
        .to_string();
    // Flip one bit of the DER signature's last byte (inside s).
    use base64::Engine;
    let mut der = base64::engine::general_purpose::STANDARD
        .decode(sig)
        .unwrap();
    *der.last_mut().unwrap() ^= 1;
    bundle["dsseEnvelope"]["signatures"][0]["sig"] =
        base64::engine::general_purpose::STANDARD.encode(der).into();
    std::fs::write(&signed.bundle, bundle.to_string()).unwrap();
    let out = signed.verify(&["--json"]);
    assert_eq!(
        out.code, 1,
        "a signature that does not verify is a failed verification"
    );
    assert_eq!(json(&out)["stage"], "signature");
    assert!(
        out.stderr.contains("signature does not verify"),
        "{}",
        out.stderr
    );
}

/// Rewrites the in-toto statement inside a bundle's DSSE envelope, leaving the signature as it was.
fn rewrite_statement(bundle_path: &Path, change: impl FnOnce(&mut serde_json::Value)) {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle_path).unwrap()).unwrap();
    let payload = engine
        .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let mut statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    change(&mut statement);
    bundle["dsseEnvelope"]["payload"] = engine.encode(statement.to_string()).into();
    std::fs::write(bundle_path, bundle.to_string()).unwrap();
}

#[test]
fn model_signing_bundle_with_altered_payload_is_refused() {
    let signed = sign("files", 0);
    // Point a digest at other content: exactly what an attacker who cannot sign would try.
    rewrite_statement(&signed.bundle, |statement| {
        statement["predicate"]["resources"][0]["digest"] = "0".repeat(64).into();
    });
    let out = signed.verify(&[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("signature does not verify"),
        "{}",
        out.stderr
    );
    // Without the signature check, the statement's own subject digest still gives it away.
    let out = verify(
        signed.model.root(),
        &signed.bundle,
        &["--allow-unsigned", "--json"],
    );
    assert_eq!(out.code, 1);
    assert_eq!(json(&out)["stage"], "digest");
    assert!(out.stderr.contains("inconsistent"), "{}", out.stderr);
}

#[test]
fn model_signing_bundle_needs_a_key_or_explicit_permission() {
    let signed = sign("files", 0);
    let out = verify(signed.model.root(), &signed.bundle, &[]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("--public-key") && out.stderr.contains("--allow-unsigned"),
        "{}",
        out.stderr
    );
    assert_eq!(
        verify(signed.model.root(), &signed.bundle, &["--allow-unsigned"]).code,
        0
    );
}

#[test]
fn model_signing_bundle_checked_with_another_key_is_refused() {
    let signed = sign("files", 0);
    let other = sign("files", 0);
    let key = other.public_key();
    let out = verify(
        signed.model.root(),
        &signed.bundle,
        &["--public-key", key.to_str().unwrap()],
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("another key"), "{}", out.stderr);
}

fn verify_without_manifest(root: &Path, extra: &[&str]) -> Outcome {
    let args: Vec<&std::ffi::OsStr> = extra.iter().map(std::ffi::OsStr::new).collect();
    run_verify(root, &args)
}

#[test]
fn a_hub_cache_without_a_manifest_is_checked_against_its_blob_names() {
    let cache = common::HfCache::new();
    // git blob ids (SHA-1) name the small files the hub keeps in git; git hashes "hello\n" this way too.
    cache.add_git_entry(common::COMMIT, "README.md", b"hello\n");
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
    assert_eq!(report["revision"], common::COMMIT);
    assert_eq!(report["files"].as_array().unwrap().len(), 4);

    std::fs::write(
        cache
            .root()
            .join("blobs/ce013625030ba8dba906f756967f9e9ca394464a"),
        b"hellO\n",
    )
    .unwrap();
    let blob = common::sha256_hex(&cache.files["model.safetensors"]);
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

#[test]
fn a_plain_directory_needs_a_manifest() {
    let model = PlainModel::new();
    let out = verify_without_manifest(model.root(), &[]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("cannot be verified without a manifest")
            && out.stderr.contains("(give one with --manifest)")
            && out.stderr.contains("not a Hugging Face cache"),
        "{}",
        out.stderr
    );
}

/// `mlnode-agent config` through the process environment, as a pod's container gets it: one
/// variable for every section of the configuration, each named as the origin of its value.
#[test]
fn config_shows_every_section_set_by_a_variable_with_its_origin() {
    let vars = [
        ("MLNODE_LISTEN", "127.0.0.1:19400", "listen"),
        ("MLNODE_NODE_NAME", "gpu-7", "node_name"),
        ("MLNODE_LOG_FORMAT", "json", "log_format"),
        (
            "MLNODE_MODELS",
            "[{name: a, root: /m/a, manifest: /c/a.json}]",
            "models",
        ),
        ("MLNODE_VERIFY__THREADS", "3", "verify.threads"),
        ("MLNODE_NVML__ENABLED", "false", "nvml.enabled"),
        ("MLNODE_NEURON__ENABLED", "true", "neuron.enabled"),
        (
            "MLNODE_KUBELET__POD_RESOURCES_INTERVAL",
            "30s",
            "kubelet.pod_resources_interval",
        ),
        (
            "MLNODE_READINESS__STARTUP_TAINT",
            "mlnode.dev/not-ready:NoSchedule",
            "readiness.startup_taint",
        ),
        ("MLNODE_STARTUP__RECENT_PODS", "10", "startup.recent_pods"),
    ];
    let output = agent()
        .arg("config")
        .envs(vars.iter().map(|(k, v, _)| (*k, *v)))
        .env("MLNODE_AGENT_SERVICE_HOST", "10.0.0.1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (name, _, key) in vars {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("#   {key} "))
                && l.ends_with(&format!("variable {name}"))),
            "{key} from {name}:\n{text}"
        );
    }
    // A wrong key in a real section, and a bad value, stop `serve` naming the variable.
    for (name, value) in [
        ("MLNODE_READINESS__ENABLE", "true"),
        ("MLNODE_READINESS__ENABLED", "garbage"),
    ] {
        let output = agent().args(["serve"]).env(name, value).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(&format!("variable {name}")), "{stderr}");
    }
}

/// Contradicting signer flags are refused before any file is read, by the same check a model's
/// config goes through, in the flags' own names.
#[test]
fn contradicting_signer_flags_exit_2_naming_the_flags() {
    for (args, says) in [
        (
            &["--public-key", "/k.pem", "--allow-unsigned"][..],
            "--allow-unsigned: contradicts --public-key",
        ),
        (&["--identity", "ci@example.com"], "--identity-provider: keyless verification needs both --identity and --identity-provider"),
        (&["--use-staging"], "--use-staging: is for keyless verification"),
    ] {
        let output = agent()
            .args(["verify", "/nonexistent-root"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Untrusted or absurd input is refused at once with the reason: a thread count that would take
/// minutes to spawn, a FIFO named as the manifest (which would block an open), a bundle whose
/// envelope carries a flood of signatures (each an ECDSA verification).
#[test]
fn absurd_threads_a_fifo_manifest_and_a_signature_flood_are_refused_at_once() {
    let model = PlainModel::new();
    let (_dir, manifest) = write_temp(&model.manifest_json("v1", true));
    let started = std::time::Instant::now();
    let out = verify(model.root(), &manifest, &["--threads", "100000"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("100000 is out of bounds: must be between 0 and 256"),
        "{}",
        out.stderr
    );

    let fifo_dir = tempfile::tempdir().unwrap();
    let fifo = fifo_dir.path().join("manifest.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let out = verify(model.root(), &fifo, &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("a FIFO"), "{}", out.stderr);

    let signed = sign("files", 0);
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&signed.bundle).unwrap()).unwrap();
    let one = bundle["dsseEnvelope"]["signatures"][0].clone();
    bundle["dsseEnvelope"]["signatures"] = serde_json::Value::Array(vec![one; 100_000]);
    let (_flood_dir, flood) = write_temp(&bundle.to_string());
    let key = signed.public_key();
    let out = verify(
        signed.model.root(),
        &flood,
        &["--public-key", key.to_str().unwrap()],
    );
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("more than 16 signatures") && out.stderr.contains("[\"signatures\"]"),
        "{}",
        out.stderr
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// A certificate bundle whose chain is padded with decoys (each a real certificate, each a DER
/// decode and a signature check per issuer candidate): refused at the bound while parsing, before
/// any is decoded, naming the bound; the real chain at the front still verifies when unpadded.
#[test]
fn a_bundle_padded_with_decoy_certificates_is_refused_at_the_bound() {
    let signed = sign("certificate", 0);
    let anchor = signed.keys.path().join("ca.pem");
    let anchor = anchor.to_str().unwrap();
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&signed.bundle).unwrap()).unwrap();
    let chain = &mut bundle["verificationMaterial"]["x509CertificateChain"]["certificates"];
    let real = chain.as_array().unwrap().clone();
    let decoy = real.last().unwrap().clone();
    let mut padded = real.clone();
    padded.extend(std::iter::repeat_n(decoy, 50_000));
    *chain = serde_json::Value::Array(padded);
    let (_dir, decoys) = write_temp(&bundle.to_string());
    let started = std::time::Instant::now();
    let out = verify(
        signed.model.root(),
        &decoys,
        &["--certificate-chain", anchor],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("more than 16 certificates")
            && out.stderr.contains("[\"certificates\"]"),
        "{}",
        out.stderr
    );
    // Generous for a loaded 2-core machine: the refusal itself takes milliseconds (it took 8 to
    // 11 s of CPU before the bound).
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(
        verify(
            signed.model.root(),
            &signed.bundle,
            &["--certificate-chain", anchor]
        )
        .code,
        0
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

    let hub = common::HfCache::new();
    let snapshot = hub.snapshot(common::COMMIT);
    std::fs::remove_dir_all(&snapshot).unwrap();
    std::os::unix::fs::symlink("/etc", &snapshot).unwrap();
    let (_dir3, manifest3) = write_temp(&hub.manifest_json(common::COMMIT));
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

/// model_signing signs with P-256, P-384 and P-521 keys (the peer's own fixtures are P-384):
/// each verifies with its public key, and a changed byte fails on each.
#[test]
fn bundles_signed_on_every_model_signing_curve_verify() {
    for curve in ["secp384r1", "secp521r1"] {
        let signed = sign_on("files", 0, curve);
        let out = signed.verify(&["--json"]);
        assert_eq!(out.code, 0, "{curve}: {} {}", out.stdout, out.stderr);
        let shard = "model-00001-of-00002.safetensors";
        let mut bytes = signed.model.files[shard].clone();
        bytes[7] ^= 1;
        std::fs::write(signed.model.path(shard), &bytes).unwrap();
        let out = signed.verify(&["--json"]);
        assert_eq!(out.code, 1, "{curve}");
        assert_eq!(json(&out)["stage"], "digest");
    }
}

/// With a key configured, an unsigned native manifest put in the bundle's place (listing the
/// attacker's digests) is refused: the key forces a signature.
#[test]
fn a_key_cannot_be_downgraded_to_an_unsigned_manifest() {
    let signed = sign("files", 0);
    let (_dir, native) = write_temp(&signed.model.manifest_json("v1", true));
    let key = signed.public_key();
    let out = verify(
        signed.model.root(),
        &native,
        &["--public-key", key.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(json(&out)["stage"], "policy");
    assert!(out.stderr.contains("not a signed bundle"), "{}", out.stderr);
    assert_eq!(
        verify(signed.model.root(), &native, &[]).code,
        0,
        "without a key it is trusted as kept"
    );
}

/// A signed bundle describes the whole model, as model_signing treats it: an added file fails the
/// verification (unless --ignore-unsigned-files), except the paths the signer itself left out
/// (the bundle's ignore list), which are not extras at all.
#[test]
fn a_signed_bundle_fails_on_added_files_but_not_on_those_it_says_to_ignore() {
    let signed = sign_ignoring("files", 0, "secp256r1", &["notes.txt"]);
    let out = signed.verify(&["--json"]);
    assert_eq!(
        out.code, 0,
        "the ignored file is not an extra: {}",
        out.stdout
    );
    assert!(
        !json(&out)["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "notes.txt"),
        "{}",
        out.stdout
    );
    std::fs::write(signed.model.path("evil.py"), b"import os").unwrap();
    let out = signed.verify(&["--json"]);
    assert_eq!(
        out.code, 1,
        "model_signing rejects an added file: {}",
        out.stdout
    );
    assert_eq!(json(&out)["stage"], "extra");
    assert_eq!(file_status(&json(&out), "evil.py"), "extra");
    assert_eq!(signed.verify(&["--ignore-unsigned-files"]).code, 0);
}

/// A bundle hashed with an algorithm the verifier has not got (model_signing knows sha256, blake2
/// and blake3) is named as such, not mistaken for a malformed digest.
#[test]
fn a_bundle_of_an_unknown_hash_is_refused_as_an_unsupported_algorithm() {
    let signed = sign("files", 0);
    rewrite_statement(&signed.bundle, |statement| {
        for resource in statement["predicate"]["resources"].as_array_mut().unwrap() {
            resource["algorithm"] = "sha3-512".into();
            resource["digest"] = "ab".repeat(64).into();
        }
    });
    let out = verify(signed.model.root(), &signed.bundle, &["--allow-unsigned"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("unsupported hash algorithm \"sha3-512\""),
        "{}",
        out.stderr
    );
}

/// A single-file model, as model_signing signs one (its one resource is named "."), and as a
/// native manifest names it: verified alone, its siblings not extras; a changed byte fails it.
#[test]
fn a_single_file_model_verifies_with_a_bundle_or_a_native_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    std::fs::write(&file, common::content(9, 50_000)).unwrap();
    std::fs::write(dir.path().join("sibling.txt"), b"not part of the model").unwrap();
    let keys = tempfile::tempdir().unwrap();
    let bundle = keys.path().join("model.sig");
    let status = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/model_signing/sign.py"))
        .arg(&file)
        .arg(&bundle)
        .arg(keys.path())
        .arg("files")
        .status()
        .unwrap();
    assert!(status.success());
    let key = keys.path().join("public.pem");
    let out = verify(
        &file,
        &bundle,
        &["--public-key", key.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(
        json(&out)["files"].as_array().unwrap().len(),
        1,
        "{}",
        out.stdout
    );

    let native = serde_json::json!({"files": {"model.safetensors": common::sha256_hex(&std::fs::read(&file).unwrap())}});
    let (_m, manifest) = write_temp(&native.to_string());
    assert_eq!(verify(&file, &manifest, &[]).code, 0);

    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let out = verify(
        &file,
        &bundle,
        &["--public-key", key.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.code, 1);
    assert_eq!(
        file_status(&json(&out), "model.safetensors"),
        "digest_mismatch"
    );
}

/// model_signing's `sign certificate` (real CLI; a signing certificate for a key on each curve,
/// an intermediate and an RSA root, made by tests/model_signing/sign.py): verified against the
/// root, or against the intermediate pinned as a trust anchor; an unrelated CA, another key and a
/// changed byte all fail, each at its stage.
#[test]
fn certificate_bundles_made_by_model_signing_verify_on_every_curve() {
    for curve in ["secp256r1", "secp384r1", "secp521r1"] {
        let signed = sign_on("certificate", 0, curve);
        let chain = |name: &str| signed.keys.path().join(name);
        let with_chain = |file: &Path| {
            verify(
                signed.model.root(),
                &signed.bundle,
                &["--certificate-chain", file.to_str().unwrap(), "--json"],
            )
        };
        for anchor in ["ca.pem", "intermediate.pem"] {
            let out = with_chain(&chain(anchor));
            assert_eq!(
                out.code, 0,
                "{curve} {anchor}: {} {}",
                out.stdout, out.stderr
            );
        }
        let other = sign_on("certificate", 0, "secp256r1");
        let out = with_chain(&other.keys.path().join("ca.pem"));
        assert_eq!(out.code, 1, "{curve}: {}", out.stderr);
        assert_eq!(json(&out)["stage"], "policy");
        assert!(
            out.stderr
                .contains("no certificate given or in the bundle issued"),
            "{}",
            out.stderr
        );

        let out = verify(
            signed.model.root(),
            &signed.bundle,
            &[
                "--identity",
                "signer@example.com",
                "--identity-provider",
                "https://accounts.google.com",
                "--json",
            ],
        );
        assert_eq!(out.code, 1, "{curve}: {}", out.stderr);
        assert_eq!(json(&out)["stage"], "policy");
        assert!(out.stderr.contains("not keyless"), "{}", out.stderr);

        // The signing key pinned as a plain key verifies what it signed, as model_signing's key
        // verifier does; another key does not.
        assert_eq!(signed.verify(&[]).code, 0, "{curve}");
        let other_key = other.public_key();
        let out = verify(
            signed.model.root(),
            &signed.bundle,
            &["--public-key", other_key.to_str().unwrap(), "--json"],
        );
        assert_eq!(out.code, 1, "{curve}");
        assert_eq!(json(&out)["stage"], "signature");

        let shard = "model-00001-of-00002.safetensors";
        let mut bytes = signed.model.files[shard].clone();
        bytes[3] ^= 1;
        std::fs::write(signed.model.path(shard), &bytes).unwrap();
        let out = with_chain(&chain("ca.pem"));
        assert_eq!(out.code, 1, "{curve}");
        assert_eq!(json(&out)["stage"], "digest");
    }
}

/// sigstore/model-transparency's signed test material (tests/fixtures/model-transparency, see
/// SOURCES), verified the way its own scripts/tests/test-verify-*.sh verify it.
fn peer_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model-transparency")
}

const PEER_IDENTITY: [&str; 4] = [
    "--identity",
    "stefanb@us.ibm.com",
    "--identity-provider",
    "https://sigstore.verify.ibm.com/oauth2",
];

/// `model_signing verify <method>` as the fixture's script runs it: the script's signer flags,
/// model path (the folder, or the one file an elliptic-key fixture of 0.3.1 and 1.0.0 signs) and
/// `--ignore-paths` (1.0.1 and 1.1.0 add an unsigned `ignore-me`).
fn verify_peer_fixture(version: &str, method: &str, extra: &[&str]) -> Outcome {
    let dir = peer_fixtures().join(format!("{version}-{method}"));
    let keys = peer_fixtures().join("keys/certificate");
    let mut args: Vec<String> = match method {
        "certificate" => vec![
            "--certificate-chain".into(),
            keys.join("ca-cert.pem").display().to_string(),
        ],
        "elliptic-key" => vec![
            "--public-key".into(),
            keys.join("signing-key-pub.pem").display().to_string(),
        ],
        _ => PEER_IDENTITY.iter().map(|s| s.to_string()).collect(),
    };
    if dir.join("ignore-me").exists() {
        args.extend(["--ignore-paths".into(), "ignore-me".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let root = match (version, method) {
        ("v0.3.1" | "v1.0.0", "elliptic-key") => dir.join("signme-1"),
        _ => dir.clone(),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    verify(&root, &dir.join("model.sig"), &args)
}

#[test]
fn every_signed_fixture_of_model_transparency_verifies_as_its_own_scripts_do() {
    for version in ["v0.3.1", "v1.0.0", "v1.0.1", "v1.1.0"] {
        for method in ["certificate", "elliptic-key", "sigstore"] {
            if version == "v0.3.1" || version == "v1.0.0" || method != "elliptic-key" {
                let out = verify_peer_fixture(version, method, &["--json"]);
                assert_eq!(
                    out.code, 0,
                    "{version}-{method}: {} {}",
                    out.stdout, out.stderr
                );
                assert_eq!(json(&out)["status"], "verified");
            }
        }
    }
    for version in ["v1.0.1", "v1.1.0"] {
        let out = verify_peer_fixture(version, "elliptic-key", &[]);
        assert_eq!(out.code, 0, "{version}-elliptic-key: {}", out.stderr);
        // Without the script's --ignore-paths, 1.0.1's unsigned ignore-me is an extra; 1.1.0's
        // bundle names it in its own ignore list.
        let dir = peer_fixtures().join(format!("{version}-elliptic-key"));
        let key = peer_fixtures().join("keys/certificate/signing-key-pub.pem");
        let out = verify(
            &dir,
            &dir.join("model.sig"),
            &["--public-key", key.to_str().unwrap()],
        );
        assert_eq!(
            out.code,
            i32::from(version == "v1.0.1"),
            "{version}: {}",
            out.stdout
        );
    }
    // model_signing 0.2's format: refused by name, as input we cannot use.
    let out = verify_peer_fixture("v0.2.0", "certificate", &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("unsupported format version"),
        "{}",
        out.stderr
    );
}

/// The keyless fixture, altered or checked against the wrong signer: each fails with exit 1 and
/// the stage that caught it.
#[test]
fn keyless_bundles_fail_on_every_tampering_and_every_wrong_signer() {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let source = peer_fixtures().join("v1.1.0-sigstore");
    let work = tempfile::tempdir().unwrap();
    for file in ["signme-1", "signme-2", "ignore-me"] {
        std::fs::copy(source.join(file), work.path().join(file)).unwrap();
    }
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("model.sig")).unwrap()).unwrap();
    let bundle = work.path().join("bundle.json");
    let check = |what: &str, bundle_json: &serde_json::Value, flags: &[&str], stage: &str| {
        std::fs::write(&bundle, bundle_json.to_string()).unwrap();
        let mut args = flags.to_vec();
        args.extend(["--ignore-paths", "ignore-me", "--json"]);
        let out = verify(work.path(), &bundle, &args);
        assert_eq!(out.code, 1, "{what}: {} {}", out.stdout, out.stderr);
        assert_eq!(json(&out)["stage"], stage, "{what}: {}", out.stderr);
    };
    check(
        "another identity",
        &original,
        &[
            "--identity",
            "someone@example.com",
            "--identity-provider",
            PEER_IDENTITY[3],
        ],
        "policy",
    );
    check(
        "another issuer",
        &original,
        &[
            "--identity",
            PEER_IDENTITY[1],
            "--identity-provider",
            "https://accounts.google.com",
        ],
        "policy",
    );
    let mut changed = original.clone();
    let sig = changed["dsseEnvelope"]["signatures"][0]["sig"]
        .as_str()
        .unwrap()
        .to_string();
    let mut raw = engine.decode(&sig).unwrap();
    let last = raw.len() - 3;
    raw[last] ^= 1;
    changed["dsseEnvelope"]["signatures"][0]["sig"] = engine.encode(&raw).into();
    check("a changed signature", &changed, &PEER_IDENTITY, "signature");

    let mut changed = original.clone();
    let hash =
        &mut changed["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["hashes"][0];
    let mut raw = engine.decode(hash.as_str().unwrap()).unwrap();
    raw[0] ^= 1;
    *hash = engine.encode(&raw).into();
    check(
        "a tampered inclusion proof",
        &changed,
        &PEER_IDENTITY,
        "signature",
    );

    // The attacker's digest for signme-1, with the subject recomputed so the statement is
    // consistent: only the signature (over the old payload) can tell.
    std::fs::write(&bundle, original.to_string()).unwrap();
    rewrite_statement(&bundle, |statement| {
        statement["predicate"]["resources"][0]["digest"] = "00".repeat(32).into();
    });
    let forged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    check("a forged payload", &forged, &PEER_IDENTITY, "signature");

    let key = peer_fixtures().join("keys/certificate/signing-key-pub.pem");
    check(
        "a key for a keyless bundle",
        &original,
        &["--public-key", key.to_str().unwrap()],
        "signature",
    );
    let ca = peer_fixtures().join("keys/certificate/ca-cert.pem");
    check(
        "a certificate chain for a keyless bundle",
        &original,
        &["--certificate-chain", ca.to_str().unwrap()],
        "policy",
    );
}

/// `--trust-root`: the public-good root given as a file verifies as the built-in one does; a root
/// without its certificate authorities (a private deployment's, say) vouches for nothing; a file
/// that is not a trusted root is bad input, named.
#[test]
fn a_configured_trusted_root_replaces_the_built_in_one() {
    let dir = peer_fixtures().join("v1.1.0-sigstore");
    let roots = tempfile::tempdir().unwrap();
    let public_good = roots.path().join("trusted_root.json");
    std::fs::write(
        &public_good,
        sigstore_verify::trust_root::SIGSTORE_PRODUCTION_TRUSTED_ROOT,
    )
    .unwrap();
    let mut without_ca: serde_json::Value =
        serde_json::from_str(sigstore_verify::trust_root::SIGSTORE_PRODUCTION_TRUSTED_ROOT)
            .unwrap();
    without_ca["certificateAuthorities"] = serde_json::json!([]);
    let private = roots.path().join("private_root.json");
    std::fs::write(&private, without_ca.to_string()).unwrap();
    let with_root = |root: &Path| {
        let mut args = PEER_IDENTITY.to_vec();
        args.extend([
            "--trust-root",
            root.to_str().unwrap(),
            "--ignore-paths",
            "ignore-me",
            "--json",
        ]);
        verify(&dir, &dir.join("model.sig"), &args)
    };
    assert_eq!(with_root(&public_good).code, 0);
    let client_config = roots.path().join("client_trust_config.json");
    let root_json: serde_json::Value =
        serde_json::from_str(sigstore_verify::trust_root::SIGSTORE_PRODUCTION_TRUSTED_ROOT)
            .unwrap();
    std::fs::write(
        &client_config,
        serde_json::json!({"mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
            "trustedRoot": root_json, "signingConfig": {}})
        .to_string(),
    )
    .unwrap();
    assert_eq!(
        with_root(&client_config).code,
        0,
        "model_signing's --trust-config form"
    );
    let out = with_root(&private);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(json(&out)["stage"], "signature");
    // Sigstore's staging instance (--use-staging, built in) did not issue this certificate.
    let mut staging = PEER_IDENTITY.to_vec();
    staging.extend(["--use-staging", "--ignore-paths", "ignore-me", "--json"]);
    let out = verify(&dir, &dir.join("model.sig"), &staging);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(json(&out)["stage"], "signature");
    staging.extend(["--trust-root", public_good.to_str().unwrap()]);
    assert_eq!(
        verify(&dir, &dir.join("model.sig"), &staging).code,
        2,
        "one root or the other"
    );
    let out = with_root(&dir.join("signme-1"));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("trusted root") && out.stderr.contains("signme-1"),
        "{}",
        out.stderr
    );
}

/// model_signing signs with `allow_symlinks: false` unless told otherwise, and its verifier then
/// refuses a file reached through a symlink, even one inside the model: so do we, and both agree
/// on the same tree (the real `model_signing verify key` runs beside ours).
#[test]
fn a_file_turned_into_a_symlink_fails_as_model_signing_fails_it() {
    let signed = sign("files", 0);
    let shard = "model-00002-of-00002.safetensors";
    std::fs::create_dir_all(signed.model.path("store")).unwrap();
    std::fs::rename(
        signed.model.path(shard),
        signed.model.path("store/real.bin"),
    )
    .unwrap();
    std::os::unix::fs::symlink("store/real.bin", signed.model.path(shard)).unwrap();
    let out = signed.verify(&["--ignore-paths", "store", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(file_status(&json(&out), shard), "unsafe_path");
    let peer = || {
        Command::new("model_signing")
            .args(["verify", "key", "--signature"])
            .arg(&signed.bundle)
            .arg("--public_key")
            .arg(signed.public_key())
            .arg("--ignore-paths")
            .arg(signed.model.path("store"))
            .arg(signed.model.root())
            .output()
            .expect("model_signing runs")
    };
    let refused = peer();
    assert!(!refused.status.success(), "model_signing refuses it too");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("symlink"),
        "for the symlink: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    std::fs::remove_file(signed.model.path(shard)).unwrap();
    std::fs::rename(
        signed.model.path("store/real.bin"),
        signed.model.path(shard),
    )
    .unwrap();
    assert!(peer().status.success());
    assert_eq!(signed.verify(&["--ignore-paths", "store"]).code, 0);
}

/// The certificate checks model_signing's verifier makes through OpenSSL, each tripped by a chain
/// with one flaw: an intermediate expired before the signing certificate was issued, an
/// intermediate that is not a CA, a signing certificate not meant for signing, a root whose path
/// length constraint allows no intermediate.
#[test]
fn a_certificate_chain_with_one_flaw_is_refused_naming_it() {
    for (flaw, says) in [
        (
            "expired",
            "was not valid when the signing certificate was issued",
        ),
        ("intermediate-not-ca", "is not a CA"),
        ("not-for-signing", "is not meant for signing"),
        ("path-length", "path length constraint"),
    ] {
        let signed = sign_flawed_certificate(flaw);
        let root = signed.keys.path().join("ca.pem");
        let out = verify(
            signed.model.root(),
            &signed.bundle,
            &["--certificate-chain", root.to_str().unwrap(), "--json"],
        );
        assert_eq!(out.code, 1, "{flaw}: {}", out.stderr);
        assert_eq!(json(&out)["stage"], "policy", "{flaw}");
        assert!(out.stderr.contains(says), "{flaw}: {}", out.stderr);
        let peer = Command::new("model_signing")
            .args(["verify", "certificate", "--signature"])
            .arg(&signed.bundle)
            .arg("--certificate_chain")
            .arg(&root)
            .arg(signed.model.root())
            .output()
            .expect("model_signing runs");
        assert!(
            !peer.status.success(),
            "{flaw}: model_signing refuses it too"
        );
    }
}

/// A key file that is not an ECDSA public key on model_signing's curves is bad input (exit 2),
/// named, with what it is instead.
#[test]
fn a_public_key_that_is_not_one_is_named_with_what_it_is() {
    let dir = peer_fixtures().join("v1.1.0-elliptic-key");
    let certificate = peer_fixtures().join("keys/certificate/ca-cert.pem");
    let out = verify(
        &dir,
        &dir.join("model.sig"),
        &["--public-key", certificate.to_str().unwrap()],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("ca-cert.pem") && out.stderr.contains("its label is \"CERTIFICATE\""),
        "{}",
        out.stderr
    );
    let (_keep, garbage) = write_temp("not a key at all");
    let out = verify(
        &dir,
        &dir.join("model.sig"),
        &["--public-key", garbage.to_str().unwrap()],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("not a PEM ECDSA public key"),
        "{}",
        out.stderr
    );
}
