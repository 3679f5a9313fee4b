//! The kernel log source end to end: journal files written by systemd's own tools
//! (common::journal), the agent with the fake NVML and the readiness controller against the fake
//! API server. An XID logged before the agent started holds the node at start; a GPU that falls
//! off the bus later, in a file journald rotates to, fails it too; another boot's and another
//! transport's lines are not this boot's kernel log; a journal that is not there yet is waited
//! for, said once, and read when it comes.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent::{sample, Agent};
use common::journal::{driver_slot as slot, kernel, Compression, Entry};
use common::kube::FakeApiServer;
use common::nvml::{fake_nvml, Scenario};

const SXID: &str = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)";

/// The host's journal directories under `root`, as the DaemonSet mounts them.
fn journal_dirs(root: &Path) -> [PathBuf; 2] {
    [root.join("var/log/journal"), root.join("run/log/journal")]
}

/// The persistent journal's directory for this machine (`/var/log/journal/<machine-id>`).
fn machine_dir(root: &Path) -> PathBuf {
    journal_dirs(root)[0].join("4f1c2d3e4b5a69788796a5b4c3d2e1f0")
}

fn start(scenario: &Scenario, api: &FakeApiServer, root: &Path) -> Agent {
    let [var, run] = journal_dirs(root);
    Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\nkernel_log:\n  enabled: true\n  journal_dirs: [{var:?}, {run:?}]\n  poll_interval: 100ms\n",
            fake_nvml().display().to_string(),
            scenario.pci_devices().display().to_string(),
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
        ],
    )
}

fn wait_until(what: &str, check: impl Fn() -> Result<(), String>) {
    common::wait_until(what, Duration::from_secs(20), check)
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
    let file = common::needs!(common::journal::write(
        &machine_dir(root.path()),
        "system.journal",
        &entries
    ));
    // systemd's own reader agrees on what this boot's kernel log is.
    let seen = common::journal::kernel_messages(&file);
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen[0].contains("python3") && !seen.iter().any(|l| l.contains("quoted")));

    let api = FakeApiServer::start(common::kube::gpu_node("test-node"));
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
    let api = FakeApiServer::start(common::kube::gpu_node("test-node"));
    let mut agent = start(&scenario, &api, root.path());
    wait_until("the missing journal said", || {
        match agent.log().contains("cannot read the node's kernel log") {
            true => Ok(()),
            false => Err(agent.log()),
        }
    });
    assert_eq!(
        sample(&agent.metrics(), "mlnode_kernel_log_up", &[]),
        Some(0.0)
    );
    wait_until("AcceleratorHealthy True meanwhile", || {
        match api.condition("AcceleratorHealthy")["status"].as_str() {
            Some("True") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // journald starts writing: the reader finds it and reads it.
    common::needs!(common::journal::write(
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
    common::journal::write(
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
    common::journal::write(
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
        common::journal::Writer::start(&machine_dir(root.path()), "user-1000.journal").unwrap();
    for _ in 0..200 {
        writer.append(&[kernel(SXID, 0)]);
    }
    writer.finish();
    wait_until("every appended line", || {
        match sample(
            &agent.metrics(),
            "mlnode_nvswitch_sxid_errors_total",
            &[("sxid", "12028")],
        ) {
            Some(203.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // SIGTERM while the reader follows: nothing waits on it.
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(elapsed < common::agent::EXIT_BOUND, "{elapsed:?}");
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
        let file = common::needs!(common::journal::write_compressed(
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
            common::journal::kernel_messages(&file),
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
    let file = common::needs!(common::journal::write(
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

    // A copy cut short beside it (shorter than its header says): skipped, the other one read.
    std::fs::write(
        dir.path().join("system@0001.journal"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    assert_eq!(scan(dir.path())["entries"], cut["entries"]);
}
