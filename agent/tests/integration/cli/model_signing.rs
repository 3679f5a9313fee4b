//! OpenSSF model_signing bundles made by the real tool (tests/model_signing): every method, curve
//! and hash it signs with verifies; every tampering, wrong key, flawed certificate and decoy is
//! refused, named.

use super::*;

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
    std::fs::write(&file, testbed::models::content(9, 50_000)).unwrap();
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

    let native = serde_json::json!({"files": {"model.safetensors": testbed::models::sha256_hex(&std::fs::read(&file).unwrap())}});
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
