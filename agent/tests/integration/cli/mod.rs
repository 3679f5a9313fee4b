//! The `mlnode-agent` binary: exit codes, error messages, `--json`, `manifest`, and bundles made by
//! the real OpenSSF model_signing tool.

mod exits;
mod manifests;
mod model_signing;
mod model_transparency;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use mlnode_testbed as testbed;
use testbed::models::PlainModel;
use testbed::write_temp;

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

fn verify_without_manifest(root: &Path, extra: &[&str]) -> Outcome {
    let args: Vec<&std::ffi::OsStr> = extra.iter().map(std::ffi::OsStr::new).collect();
    run_verify(root, &args)
}

/// sigstore/model-transparency's signed test material (tests/fixtures/model-transparency, see
/// SOURCES), verified the way its own scripts/tests/test-verify-*.sh verify it.
fn peer_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model-transparency")
}
