//! What `mlnode-agent verify` says and exits with: the `--json` report's shape, 1 for a failed
//! verification, 2 for bad input (a manifest, a root, contradicting flags, absurd settings), and
//! `mlnode-agent config`'s effective settings with their origins.

use super::*;

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
