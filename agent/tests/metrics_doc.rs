//! docs/metrics.md and the exposition must list the same series with the same types.

use std::collections::BTreeMap;
use std::path::Path;

/// `name -> type` from the table rows of docs/metrics.md.
fn documented() -> BTreeMap<String, String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .unwrap();
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .collect()
}

/// `name -> type` from the `# TYPE` lines of a registry with every collector registered.
fn exposed() -> BTreeMap<String, String> {
    let registry = mlnode_agent::metrics::registry("doc-test");
    mlnode_agent::metrics::AgentMetrics::register(&registry)
        .unwrap()
        .set_up("model_cache", true);
    let cache = mlnode_agent::cache::metrics::CacheMetrics::register(&registry).unwrap();
    // Give every labelled family one child, or the encoder leaves it out.
    let report = mlnode_agent::cache::Report {
        status: mlnode_agent::cache::report::Verdict::Verified,
        revision: Some("r".into()),
        error: None,
        files: Vec::new(),
        bytes_hashed: 0,
        seconds: 0.0,
    };
    cache.starting("m", Some("r"), 1);
    cache.observe(
        "m",
        &report,
        mlnode_agent::cache::metrics::VerifyKind::Full,
        0,
        0.1,
        0,
    );
    mlnode_agent::metrics::encode(&registry)
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

#[test]
fn docs_and_exposition_list_the_same_series() {
    let documented = documented();
    assert!(
        documented.len() >= 9,
        "the table was not parsed: {documented:?}"
    );
    assert_eq!(documented, exposed());
}
