//! model-transparency's own signed fixtures, keyless (sigstore) included, verified as its own
//! scripts verify them; every tampering and wrong signer fails; a configured trusted root.

use super::*;

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
