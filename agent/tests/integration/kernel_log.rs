//! The kernel log source end to end: journal files written by systemd's own tools
//! (testbed::devices::journal), the agent with the fake NVML and the readiness controller against the fake
//! API server. An XID logged before the agent started holds the node at start; a GPU that falls
//! off the bus later, in a file journald rotates to, fails it too; another boot's and another
//! transport's lines are not this boot's kernel log; a journal that is not there yet is waited
//! for, said once, and read when it comes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mlnode_testbed as testbed;
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::devices::fake_nvml::{fake_nvml, Scenario};
use testbed::devices::journal::{driver_slot as slot, kernel, Compression, Entry};

const SXID: &str = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)";

/// The host's journal directories under `root`, as the DaemonSet mounts them.
fn journal_dirs(root: &Path) -> [PathBuf; 2] {
    [root.join("var/log/journal"), root.join("run/log/journal")]
}

/// The persistent journal's directory for this machine (`/var/log/journal/<machine-id>`).
fn machine_dir(root: &Path) -> PathBuf {
    journal_dirs(root)[0].join("4f1c2d3e4b5a69788796a5b4c3d2e1f0")
}

fn start(scenario: &Scenario, api: &ApiOnlyNode, root: &Path) -> Agent {
    start_with(scenario, api, root, "")
}

/// [`start`], with more `kernel_log` settings (YAML lines indented by two spaces).
fn start_with(scenario: &Scenario, api: &ApiOnlyNode, root: &Path, kernel_log: &str) -> Agent {
    let [var, run] = journal_dirs(root);
    Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\nkernel_log:\n  enabled: true\n  journal_dirs: [{var:?}, {run:?}]\n  poll_interval: 100ms\n{kernel_log}",
            fake_nvml().display().to_string(),
            scenario.pci_devices().display().to_string(),
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    )
}

fn wait_until(what: &str, check: impl Fn() -> Result<(), String>) {
    testbed::wait_until(what, Duration::from_secs(20), check)
}

/// Waits until the agent's `series{labels}` is `value`.
fn wait_for_sample(agent: &Agent, series: &str, labels: &[(&str, &str)], value: f64) {
    wait_until(&format!("{series}{labels:?} = {value}"), || {
        match sample(&agent.metrics(), series, labels) {
            Some(v) if v == value => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

#[test]
fn an_xid_logged_before_the_agent_started_holds_the_node_at_start() {
    let scenario = Scenario::new(2);
    let gpus = scenario.value["devices"].as_array().unwrap().clone();
    let (gpu0, gpu1) = (
        gpus[0]["pci_bus_id"].as_str().unwrap(),
        gpus[1]["pci_bus_id"].as_str().unwrap(),
    );
    let root = tempfile::tempdir().unwrap();
    let another_boot = Entry {
        boot_id: "0e9e39f249a16976918f6564b8830bc8".into(),
        ..kernel(
            &format!(
                "NVRM: Xid (PCI:{}): 79, GPU has fallen off the bus.",
                slot(gpu0)
            ),
            7200,
        )
    };
    let a_service = Entry {
        transport: "stdout",
        ..kernel(
            &format!("NVRM: Xid (PCI:{}): 79, quoted by a service", slot(gpu0)),
            90,
        )
    };
    let entries = [
        another_boot,
        a_service,
        // XID 119 (GSP_RPC_TIMEOUT, RESET_GPU): the driver links no recovery action to it, so
        // NVML's NONE does not clear it (XID 79 is linked: a NONE read after it would).
        kernel(
            &format!(
                "NVRM: Xid (PCI:{}): 119, pid=1234, name=python3, Timeout after 6s of waiting for RPC response from GPU1 GSP!",
                slot(gpu1)
            ),
            60,
        ),
        kernel(SXID, 50),
        kernel(&"x".repeat(64 * 1024), 40),
        kernel(
            &format!(
                "NVRM: Xid (PCI:{}): 13, Graphics SM Warp Exception",
                slot(gpu0)
            ),
            30,
        ),
    ];
    let file = testbed::needs!(testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &entries
    ));
    // systemd's own reader agrees on what this boot's kernel log is.
    let seen = testbed::devices::journal::kernel_messages(&file);
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen[0].contains("python3") && !seen.iter().any(|l| l.contains("quoted")));

    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start(&scenario, &api, root.path());
    wait_until("AcceleratorHealthy False", || {
        let condition = api.condition("AcceleratorHealthy");
        match condition["status"].as_str() {
            Some("False") => Ok(()),
            _ => Err(condition.to_string()),
        }
    });
    let condition = api.condition("AcceleratorHealthy");
    let message = condition["message"].as_str().unwrap();
    assert_eq!(condition["reason"], "FatalXID", "{message}");
    assert!(
        message.contains(gpus[1]["uuid"].as_str().unwrap())
            && message.contains("the kernel log has XID 119 (RESET_GPU, process python3)"),
        "{message}"
    );
    assert!(
        !message.contains(gpus[0]["uuid"].as_str().unwrap()),
        "XID 13 holds nothing; another boot's 79 is history: {message}"
    );
    // Never a premature True: no write said healthy before the history was read.
    for patch in api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/status"))
    {
        for condition in patch.body["status"]["conditions"].as_array().unwrap() {
            if condition["type"] == "AcceleratorHealthy" {
                assert_eq!(condition["status"], "False", "{condition}");
            }
        }
    }
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_kernel_log_up", &[]), Some(1.0));
    assert_eq!(
        sample(&metrics, "mlnode_kernel_log_entries_read_total", &[]),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_nvswitch_sxid_errors_total",
            &[("sxid", "12028")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "mlnode_kernel_log_bad_entries_total", &[]),
        Some(0.0)
    );
}

#[test]
fn a_journal_that_comes_later_and_a_fall_in_a_rotated_file_are_read() {
    let scenario = Scenario::new(2);
    let gpu0 = scenario.value["devices"][0]["pci_bus_id"]
        .as_str()
        .unwrap()
        .to_string();
    let root = tempfile::tempdir().unwrap();
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let mut agent = start(&scenario, &api, root.path());
    let not_up_saying = |what: &str, said: &str| {
        agent.wait_for_log(what, Duration::from_secs(20), |log| log.contains(said));
        assert_eq!(
            sample(&agent.metrics(), "mlnode_kernel_log_up", &[]),
            Some(0.0)
        );
    };
    not_up_saying(
        "the missing journal said",
        "cannot read the node's kernel log",
    );
    // The directories come, empty (journald not writing yet): still nothing to read, and said.
    std::fs::create_dir_all(machine_dir(root.path())).unwrap();
    not_up_saying("the empty journal said", "hold no journal file");
    wait_until("AcceleratorHealthy True meanwhile", || {
        match api.condition("AcceleratorHealthy")["status"].as_str() {
            Some("True") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // journald starts writing: the reader finds it and reads it.
    testbed::needs!(testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(SXID, 5)]
    ));
    wait_until("the journal read", || {
        match sample(&agent.metrics(), "mlnode_kernel_log_up", &[]) {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // A rotation: journald archives the file and starts another, where the fall is logged.
    std::fs::rename(
        machine_dir(root.path()).join("system.journal"),
        machine_dir(root.path()).join("system@00062a1b2c3d4e5f-0000000000000001.journal"),
    )
    .unwrap();
    let fall = format!(
        "NVRM: GPU {}: GPU has fallen off the bus.",
        slot(&gpu0) + ".0"
    );
    testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(&fall, 0), kernel(SXID, 0)],
    )
    .unwrap();
    wait_until("GPUFallenOffBus", || {
        let condition = api.condition("AcceleratorHealthy");
        match condition["reason"].as_str() {
            Some("GPUFallenOffBus") => Ok(()),
            _ => Err(condition.to_string()),
        }
    });
    let metrics = agent.metrics();
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_fallen_off_bus",
            &[("pci_bus_id", gpu0.as_str())]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_nvswitch_sxid_errors_total",
            &[("sxid", "12028")]
        ),
        Some(2.0),
        "each entry once, across the rotation"
    );
    // Vacuumed: every file deleted under the reader; journald's next file is read from its start.
    for entry in std::fs::read_dir(machine_dir(root.path())).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(SXID, 0)],
    )
    .unwrap();
    wait_until("the entry after the vacuum", || {
        match sample(
            &agent.metrics(),
            "mlnode_nvswitch_sxid_errors_total",
            &[("sxid", "12028")],
        ) {
            Some(3.0) => Ok(()),
            other => Err(format!("{other:?}\n{}", agent.log())),
        }
    });
    let log = agent.log();
    let said = log
        .lines()
        .filter(|l| l.contains("cannot read the node's kernel log") && l.contains("none of"))
        .count();
    assert_eq!(said, 1, "the missing journal said once: {log}");
    // A file journald creates and appends to while the reader follows, one write per line: every
    // line is read, the ones written before the follower saw the new file too.
    let mut writer =
        testbed::devices::journal::Writer::start(&machine_dir(root.path()), "user-1000.journal")
            .unwrap();
    for _ in 0..200 {
        writer.append(&[kernel(SXID, 0)]);
    }
    writer.finish();
    wait_for_sample(
        &agent,
        "mlnode_nvswitch_sxid_errors_total",
        &[("sxid", "12028")],
        203.0,
    );
    // SIGTERM while the reader follows: nothing waits on it.
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(elapsed < testbed::agent::EXIT_BOUND, "{elapsed:?}");
}

/// `mlnode-agent kernel-log` on `dir`, as JSON.
fn scan(dir: &Path) -> serde_json::Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mlnode-agent"))
        .args(["kernel-log", "--json", "-D"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The journal file header (systemd docs/JOURNAL_FILE_FORMAT.md): `incompatible_flags` at byte 12,
/// `state` at 16, `tail_object_offset` at 136.
fn header_u32(file: &Path, at: usize) -> u32 {
    let bytes = std::fs::read(file).unwrap();
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// An XID line with a detail long enough for journald's compression (payloads over 512 bytes,
/// systemd `journal-file.h` `DEFAULT_COMPRESS_THRESHOLD`).
fn long_xid() -> String {
    format!(
        "NVRM: Xid (PCI:0000:5a:00): 13, pid=9, name=vllm, Graphics Exception: {}",
        (0..300)
            .map(|i| format!("ESR 0x{i:06x}=0x{:08x}", i * 7))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[test]
fn each_compression_systemd_writes_is_read() {
    // The header's incompatible flags (systemd docs/JOURNAL_FILE_FORMAT.md).
    for (algorithm, flag) in [("XZ", 1), ("LZ4", 2), ("ZSTD", 8)] {
        let dir = tempfile::tempdir().unwrap();
        let long = long_xid();
        let file = testbed::needs!(testbed::devices::journal::write_compressed(
            dir.path(),
            "system.journal",
            &[kernel(&long, 60), kernel(SXID, 30)],
            Compression::Chosen(algorithm),
        ));
        assert_ne!(
            header_u32(&file, 12) & flag,
            0,
            "{algorithm}: the file's flags"
        );
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes
                .windows(64)
                .any(|w| w == &long.as_bytes()[long.len() - 64..]),
            "{algorithm}: the long payload is stored compressed"
        );
        assert_eq!(
            testbed::devices::journal::kernel_messages(&file),
            [long.as_str(), SXID],
            "{algorithm}: journalctl reads it back"
        );
        let found = scan(dir.path());
        assert_eq!(found["entries"], 2, "{algorithm}: {found:#}");
        assert_eq!(found["bad_entries"], 0, "{algorithm}: {found:#}");
        assert_eq!(found["xids"][0]["xid"], 13, "{algorithm}: {found:#}");
        assert_eq!(
            found["xids"][0]["process"], "vllm",
            "{algorithm}: {found:#}"
        );
        assert_eq!(found["sxids"]["12028"], 1, "{algorithm}: {found:#}");
    }
}

#[test]
fn compressed_dirty_and_truncated_files_are_read_and_what_cannot_be_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    // Debian's systemd 252 compresses with zstd.
    let long = long_xid();
    let entries: Vec<Entry> = (0..200)
        .map(|i| {
            kernel(
                &if i == 0 {
                    long.clone()
                } else {
                    format!("{SXID} #{i}")
                },
                300 - i,
            )
        })
        .collect();
    let file = testbed::needs!(testbed::devices::journal::write(
        dir.path(),
        "system.journal",
        &entries
    ));
    const ZSTD: u32 = 8;
    assert_ne!(
        header_u32(&file, 12) & ZSTD,
        0,
        "the file is zstd-compressed"
    );
    let clean = scan(dir.path());
    assert_eq!(clean["entries"], 200);
    assert_eq!(
        clean["xids"][0]["xid"], 13,
        "the compressed payload read: {clean:#}"
    );
    assert_eq!(clean["sxids"]["12028"], 199);

    // Left online, as journald leaves a file it did not close (a crash): still read.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[16] = 1;
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(scan(dir.path())["entries"], 200);

    // Its last object overwritten with zeros, as a write cut short leaves it: what is intact is
    // read, nothing hangs or panics.
    let tail = u64::from_le_bytes(bytes[136..144].try_into().unwrap()) as usize;
    bytes[tail + 8..tail + 64].fill(0);
    std::fs::write(&file, &bytes).unwrap();
    let cut = scan(dir.path());
    let read = cut["entries"].as_u64().unwrap();
    assert!((150..=200).contains(&read), "{cut:#}");
    assert_eq!(cut["xids"][0]["xid"], 13, "{cut:#}");

    // A copy cut short beside it (shorter than its header says): left out and named, the other
    // one read.
    let short = dir.path().join("system@0001.journal");
    std::fs::write(&short, &bytes[..bytes.len() / 2]).unwrap();
    let both = scan(dir.path());
    assert_eq!(both["entries"], cut["entries"]);
    assert_eq!(
        both["unreadable_files"],
        serde_json::json!([{"file": short, "reason": "unreadable", "error": "ENODATA: No data available", "incompatible_flags": header_u32(&file, 12)}]),
        "{both:#}"
    );
}

fn healthy(api: &ApiOnlyNode) -> Result<(), String> {
    let condition = api.condition("AcceleratorHealthy");
    match condition["status"].as_str() {
        Some("True") => Ok(()),
        _ => Err(condition.to_string()),
    }
}

/// Without libsystemd the agent serves and holds nothing on the kernel log: the source says why,
/// once, and `mlnode_kernel_log_up` is 0.
#[test]
fn without_libsystemd_the_agent_serves_and_says_why_once() {
    let scenario = Scenario::new(1);
    let root = tempfile::tempdir().unwrap();
    testbed::needs!(testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(SXID, 5)]
    ));
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let missing = root.path().join("lib/libsystemd.so.0");
    let agent = start_with(
        &scenario,
        &api,
        root.path(),
        &format!("  library: {:?}\n", missing.display().to_string()),
    );
    wait_until("AcceleratorHealthy True", || healthy(&api));
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_kernel_log_up", &[]), Some(0.0));
    assert_eq!(
        sample(&metrics, "mlnode_gpu_count", &[]),
        Some(1.0),
        "the GPU collector serves"
    );
    let log = agent.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot load") && l.contains("libsystemd.so.0"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {log}");
    assert!(
        said[0].contains("kernel_log.library") && said[0].contains("libsystemd0"),
        "says what to do: {}",
        said[0]
    );
}

/// Sets `bit` in a journal file's `incompatible_flags` (systemd docs/JOURNAL_FILE_FORMAT.md: the
/// 32 bits at byte 12 of the header): a flag a newer systemd would define, which this libsystemd
/// refuses with EPROTONOSUPPORT (journal-file.c `warn_wrong_flags`).
fn set_incompatible_flag(file: &Path, bit: u32) {
    let mut bytes = std::fs::read(file).unwrap();
    let flags = header_u32(file, 12) | bit;
    bytes[12..16].copy_from_slice(&flags.to_le_bytes());
    std::fs::write(file, bytes).unwrap();
}

/// A file a newer systemd wrote, with an incompatible flag this libsystemd does not know, is left
/// out, counted and named with its flag, once; the other files are read, and followed.
#[test]
fn a_file_with_an_unknown_incompatible_flag_is_counted_and_named_and_the_rest_read() {
    let scenario = Scenario::new(1);
    let root = tempfile::tempdir().unwrap();
    let newer = testbed::needs!(testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system@00062a1b2c3d4e5f-0000000000000001.journal",
        &[kernel(SXID, 60)]
    ));
    set_incompatible_flag(&newer, 1 << 6);
    testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(SXID, 5)],
    )
    .unwrap();
    let found = scan(&journal_dirs(root.path())[0]);
    assert_eq!(found["sxids"]["12028"], 1, "{found:#}");
    assert_eq!(found["unreadable_files"][0]["reason"], "unsupported_format");
    assert_eq!(
        found["unreadable_files"][0]["file"],
        newer.display().to_string()
    );

    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start(&scenario, &api, root.path());
    let sxids = ("mlnode_nvswitch_sxid_errors_total", [("sxid", "12028")]);
    wait_for_sample(&agent, sxids.0, &sxids.1, 1.0);
    wait_for_sample(
        &agent,
        "mlnode_kernel_log_unreadable_files",
        &[("reason", "unsupported_format")],
        1.0,
    );
    let mut writer =
        testbed::devices::journal::Writer::start(&machine_dir(root.path()), "system.journal")
            .unwrap();
    writer.append(&[kernel(SXID, 0)]);
    writer.finish();
    wait_for_sample(&agent, sxids.0, &sxids.1, 2.0);
    let log = agent.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("incompatible header flags"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains(&newer.display().to_string()) && said[0].contains("unknown 0x40"),
        "names the file and the flag: {}",
        said[0]
    );
    assert_eq!(
        sample(&agent.metrics(), "mlnode_kernel_log_up", &[]),
        Some(1.0)
    );
}

/// `mlnode_gpu_xid_errors_total` is the boot's count: an XID logged before the agent started is
/// counted (and XID 13, RESTART_APP, holds nothing); one NVML delivers and the log then has too is
/// one; one only the log has is counted; a restarted agent starts at the boot's count.
#[test]
fn every_xid_of_the_boot_is_counted_once_whichever_source_saw_it() {
    let mut scenario = Scenario::new(2);
    let gpu0 = scenario.value["devices"][0]["pci_bus_id"]
        .as_str()
        .unwrap()
        .to_string();
    let xid13 = format!(
        "NVRM: Xid (PCI:{}): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
        slot(&gpu0)
    );
    let counted = [
        ("gpu", "0"),
        ("xid", "13"),
        ("immediate_action", "RESTART_APP"),
    ];
    let xids = "mlnode_gpu_xid_errors_total";
    let root = tempfile::tempdir().unwrap();
    testbed::needs!(testbed::devices::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &[kernel(&xid13, 600)]
    ));
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let mut agent = start(&scenario, &api, root.path());
    wait_for_sample(&agent, xids, &counted, 1.0);
    wait_until("AcceleratorHealthy True", || healthy(&api));

    // NVML delivers the next one at once; the driver's line reaches the journal after.
    scenario.set(0, "xid_events", serde_json::json!([13]));
    wait_for_sample(&agent, "mlnode_gpu_last_xid", &[("gpu", "0")], 13.0);
    assert_eq!(sample(&agent.metrics(), xids, &counted), Some(2.0));
    let mut writer =
        testbed::devices::journal::Writer::start(&machine_dir(root.path()), "system.journal")
            .unwrap();
    writer.append(&[kernel(&xid13, 0)]);
    wait_for_sample(&agent, "mlnode_kernel_log_entries_read_total", &[], 2.0);
    assert_eq!(
        sample(&agent.metrics(), xids, &counted),
        Some(2.0),
        "one XID, seen by both"
    );
    // One only the log has (NVML missed it): counted.
    writer.append(&[kernel(&xid13, 0)]);
    writer.finish();
    wait_for_sample(&agent, xids, &counted, 3.0);
    assert_eq!(
        sample(&agent.metrics(), xids, &[("gpu", "1")]),
        None,
        "the other GPU has none"
    );
    healthy(&api).unwrap();

    // Restarted: the boot's count from its first sample, never a lower one.
    scenario.set(0, "xid_events", serde_json::json!([]));
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    let agent = start(&scenario, &api, root.path());
    wait_until("the boot's count after the restart", || {
        match sample(&agent.metrics(), xids, &counted) {
            Some(3.0) => Ok(()),
            None => Err("the history is still being read".into()),
            Some(early) => panic!("a count other than the boot's: {early}"),
        }
    });
}
