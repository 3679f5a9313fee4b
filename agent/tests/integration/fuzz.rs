//! Fuzzing as a habit, on the stable toolchain (proptest): every parser of untrusted input gets
//! generated and mutated input and must answer with a value or an error, never a panic, a hang or
//! an impossible value. The suite runs a bounded number of cases (`PROPTEST_CASES`, 256 by
//! default); `scripts/fuzz.sh` runs the same targets for longer. A failure proptest finds is saved
//! under `agent/tests/integration/fuzz.proptest-regressions` and replayed first on every later run: commit it,
//! and it is a regression test.

use std::path::Path;

use mlnode_agent::cache::manifest::{self, TrustPolicy};
use mlnode_agent::config::{self, Override};
use proptest::prelude::*;

/// Bytes near the shapes the parsers expect: JSON punctuation, digits, hex, quotes, escapes.
fn jsonish() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r#"[\{\}\[\]":,0-9a-f\\ .eE+\-ntrufalsizh_/]{0,200}"#).unwrap()
}

/// One native manifest entry, valid or slightly wrong.
fn entry() -> impl Strategy<Value = String> {
    (
        "[a-z0-9._/-]{0,40}",
        "[0-9a-fA-F]{0,70}",
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(path, digest, size)| match size {
            Some(size) => format!("{path:?}: {{\"sha256\": {digest:?}, \"size\": {size}}}"),
            None => format!("{path:?}: {digest:?}"),
        })
}

/// A model_signing bundle with every layer generated: JSON envelope, DSSE fields, base64 payload,
/// in-toto statement, and resources.
fn bundle() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec(("[a-z0-9._/]{0,20}", "[0-9a-f]{0,64}", "[a-z0-9]{0,10}"), 0..5),
        "[a-zA-Z0-9+/=]{0,40}",
        prop_oneof![Just("https://model_signing/signature/v1.0".to_string()), "[a-z:/._0-9]{0,30}"],
        prop_oneof![Just("https://in-toto.io/Statement/v1".to_string()), "[a-z:/._0-9]{0,30}"],
        any::<bool>(),
    )
        .prop_map(|(resources, sig, predicate, statement, valid_base64)| {
            let resources: Vec<serde_json::Value> = resources
                .into_iter()
                .map(|(name, digest, algorithm)| {
                    serde_json::json!({"name": name, "digest": digest, "algorithm": algorithm})
                })
                .collect();
            let payload = serde_json::json!({
                "_type": statement,
                "subject": [{"name": "model", "digest": {"sha256": "00"}}],
                "predicateType": predicate,
                "predicate": {"resources": resources, "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": false, "ignore_paths": []}},
            })
            .to_string();
            let encoded = if valid_base64 {
                base64_encode(payload.as_bytes())
            } else {
                payload
            };
            serde_json::json!({
                "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "verificationMaterial": {"publicKey": {"hint": "abc"}},
                "dsseEnvelope": {"payload": encoded, "payloadType": "application/vnd.in-toto+json",
                    "signatures": [{"sig": sig, "keyid": ""}]},
            })
            .to_string()
        })
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn parse(text: &str, trust: &TrustPolicy) {
    let _ = manifest::parse(Path::new("fuzz.json"), text.as_bytes(), trust);
}

proptest! {
    #[test]
    fn native_manifests_never_panic(entries in proptest::collection::vec(entry(), 0..20), revision in jsonish()) {
        parse(&format!("{{\"revision\": {revision:?}, \"files\": {{{}}}}}", entries.join(", ")), &TrustPolicy::RequireKey);
    }

    #[test]
    fn arbitrary_json_like_bytes_never_panic(text in jsonish()) {
        parse(&text, &TrustPolicy::RequireKey);
        parse(&format!("{{{text}"), &TrustPolicy::AllowUnsigned);
    }

    #[test]
    fn model_signing_bundles_never_panic(text in bundle(), cut in 0usize..2000) {
        parse(&text, &TrustPolicy::AllowUnsigned);
        parse(&text, &TrustPolicy::RequireKey);
        // Truncated anywhere, including inside a UTF-8 sequence of the payload.
        let cut = text.len().min(cut);
        parse(&text[..text.floor_char_boundary(cut)], &TrustPolicy::AllowUnsigned);
    }

    #[test]
    fn config_from_yaml_variables_and_flags_never_panics(
        yaml in "[a-z_:\\- \\n\\[\\]{}0-9.\"]{0,120}",
        key in "[a-z_.]{0,30}",
        value in "[a-zA-Z0-9_:/\\-\\[\\]{}., ]{0,40}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, &yaml).unwrap();
        let variable = format!("MLNODE_{}", key.to_ascii_uppercase().replace('.', "__"));
        if let Ok(mut overrides) = Override::from_vars([(variable.into(), value.clone().into())]) {
            if let Ok(flag) = Override::from_flag(&format!("{key}={value}")) {
                overrides.push(flag);
            }
            let _ = config::load(Some(&path), &overrides);
        }
    }

    #[test]
    fn neuron_power_lines_are_percentages_or_nothing(text in "[A-Z_,0-9.eE+\\-naif ]{0,60}") {
        if let Some(power) = mlnode_agent::neuron::sysfs::parse_power(&text) {
            for v in [power.min_percent, power.max_percent, power.avg_percent] {
                prop_assert!(v.is_finite() && (0.0..=100.0).contains(&v), "{text:?} gave {v}");
            }
        }
    }

    #[test]
    fn kubelet_event_messages_give_sane_durations(
        duration in "[0-9]{0,400}(\\.[0-9]{0,5})?(ns|us|µs|ms|s|m|h)?([0-9]{0,5}(ms|s|m|h))?",
        image in "[a-z0-9./:@-]{0,30}",
        tail in "[ a-zA-Z0-9().:]{0,40}",
    ) {
        if let Some(seconds) = mlnode_agent::startup::phases::parse_go_duration(&duration) {
            prop_assert!(seconds.is_finite() && seconds >= 0.0, "{duration:?} gave {seconds}");
        }
        let message = format!("Successfully pulled image \"{image}\" in {duration} {tail}");
        if let Some(pull) = mlnode_agent::startup::phases::parse_pulled(&message) {
            prop_assert!(pull.seconds.is_finite() && pull.seconds >= 0.0, "{message:?}");
        }
    }
}

/// Sysfs values come from files: arbitrary bytes in the counters, power and info nodes of a
/// driver-shaped device must give a snapshot (with read errors counted), never a panic.
#[test]
fn neuron_sysfs_files_with_arbitrary_bytes_never_panic() {
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 64,
        ..Default::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..64), |bytes| {
            let dir = tempfile::tempdir().unwrap();
            let device = dir.path().join("neuron0");
            for node in [
                "stats/hardware/mem_ecc_uncorrected",
                "stats/power/utilization",
                "info/architecture/instance_type",
                "neuron_core0/stats/status/success/total",
                "neuron_core0/stats/other_info/inference_count",
                "neuron_core0/stats/memory_usage/device_mem/tensors/total",
            ] {
                let path = device.join(node);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, &bytes).unwrap();
            }
            let snapshot = mlnode_agent::neuron::sysfs::read(dir.path());
            prop_assert_eq!(snapshot.devices.len(), 1);
            Ok(())
        })
        .unwrap();
}
