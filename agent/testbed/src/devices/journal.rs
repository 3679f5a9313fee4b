//! Journal files written by systemd's own tools: entries in the Journal Export Format
//! (systemd `docs/JOURNAL_EXPORT_FORMATS.md`: `FIELD=value` lines, a blank line between entries),
//! turned into a `.journal` file by Debian's `systemd-journal-remote`, and read back with
//! `journalctl --file` to check what systemd itself sees in it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// One journal entry, as journald stores a kernel message (systemd `src/journal/journald-kmsg.c`:
/// `_TRANSPORT=kernel`, `SYSLOG_IDENTIFIER=kernel`, `PRIORITY`, `SYSLOG_FACILITY=0`).
pub struct Entry {
    pub message: String,
    pub realtime_usec: u64,
    /// `__MONOTONIC_TIMESTAMP`: rising in the order the entries are made, as the kernel's clock
    /// rises in the order lines are logged ([`monotonic_usec`]).
    pub monotonic_usec: u64,
    pub boot_id: String,
    pub transport: &'static str,
    /// The kernel message level: 3 for the Neuron runtime's KERN_ERR, 4 for NVRM's default.
    pub priority: u8,
}

/// This boot's id as `_BOOT_ID` carries it.
pub fn this_boot() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "")
}

fn now_usec() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// CLOCK_MONOTONIC now, and never twice the same: entries of one boot in different files (each
/// systemd-journal-remote process starts its own sequence numbers) are ordered by it, as journald's
/// are by the sequence numbers its files share.
fn monotonic_usec() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000;
    let previous = LAST.fetch_max(now, Ordering::Relaxed);
    if previous >= now {
        LAST.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        now
    }
}

/// A GPU's slot as the NVIDIA driver prints it in an XID line (`PCI:%04x:%02x:%02x`: no
/// function), from NVML's bus id (`00000000:5A:00.0`).
pub fn driver_slot(nvml_bus_id: &str) -> String {
    let lower = nvml_bus_id.to_ascii_lowercase();
    let (domain, rest) = lower.split_once(':').unwrap();
    let domain = u32::from_str_radix(domain, 16).unwrap();
    format!("{domain:04x}:{}", rest.trim_end_matches(".0"))
}

/// A kernel message of this boot, logged `seconds_ago`.
pub fn kernel(message: &str, seconds_ago: u64) -> Entry {
    Entry {
        message: message.to_string(),
        realtime_usec: now_usec() - seconds_ago * 1_000_000,
        monotonic_usec: monotonic_usec(),
        boot_id: this_boot(),
        transport: "kernel",
        priority: 4,
    }
}

/// `entries` in the Journal Export Format.
fn export(entries: &[Entry]) -> Vec<u8> {
    let mut export = Vec::new();
    for e in entries {
        let facility = if e.transport == "kernel" {
            "SYSLOG_FACILITY=0\nSYSLOG_IDENTIFIER=kernel\n"
        } else {
            "SYSLOG_IDENTIFIER=vllm\n"
        };
        write!(
            export,
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID={}\n_TRANSPORT={}\nPRIORITY={}\n{facility}_HOSTNAME=ip-10-0-1-23\n",
            e.realtime_usec, e.monotonic_usec, e.boot_id, e.transport, e.priority
        )
        .unwrap();
        // A message with a newline is a binary field: the name, a newline, its length as
        // little-endian 64 bits, the bytes.
        if e.message.contains('\n') {
            export.extend_from_slice(b"MESSAGE\n");
            export.extend_from_slice(&(e.message.len() as u64).to_le_bytes());
            export.extend_from_slice(e.message.as_bytes());
            export.extend_from_slice(b"\n\n");
        } else {
            writeln!(export, "MESSAGE={}\n", e.message).unwrap();
        }
    }
    export
}

/// How journal-remote compresses the payloads it stores (over 512 bytes).
#[derive(Clone, Copy, Debug)]
pub enum Compression {
    /// Debian's systemd 252 as installed: zstd, whatever it is asked.
    Default,
    /// `SYSTEMD_JOURNAL_COMPRESS` (systemd `docs/ENVIRONMENT.md`), honoured from systemd 253 on:
    /// bookworm-backports' 254, which scripts/test.sh unpacks and names in
    /// `MLNODE_TEST_JOURNAL_REMOTE_BACKPORT`.
    Chosen(&'static str),
}

/// systemd-journal-remote writing `dir/<name>` (a name ending in `.journal`) from what it is fed,
/// as it arrives: journald appending to its file. Err names what is missing.
pub struct Writer {
    child: std::process::Child,
}

impl Writer {
    /// `systemd-journal-remote` writing `name` in `dir`, in its default compression.
    pub fn start(dir: &Path, name: &str) -> Result<Writer, String> {
        Writer::start_compressed(dir, name, Compression::Default)
    }

    /// As [`Writer::start`], in `compression`.
    pub fn start_compressed(
        dir: &Path,
        name: &str,
        compression: Compression,
    ) -> Result<Writer, String> {
        let mut command = match compression {
            Compression::Default => {
                if !Path::new(JOURNAL_REMOTE).exists() {
                    return Err(format!(
                        "{JOURNAL_REMOTE} (Debian package systemd-journal-remote) is needed"
                    ));
                }
                Command::new(JOURNAL_REMOTE)
            }
            Compression::Chosen(algorithm) => {
                let binary = std::env::var_os("MLNODE_TEST_JOURNAL_REMOTE_BACKPORT")
                    .map(PathBuf::from)
                    .filter(|path| path.exists())
                    .ok_or("systemd-journal-remote 253 or later is needed to choose the compression: scripts/test.sh unpacks bookworm-backports' and sets MLNODE_TEST_JOURNAL_REMOTE_BACKPORT")?;
                // Unpacked, not installed: its libsystemd-shared lies beside it.
                let root = binary.ancestors().nth(3).unwrap();
                let mut command = Command::new(&binary);
                command.env("SYSTEMD_JOURNAL_COMPRESS", algorithm).env(
                    "LD_LIBRARY_PATH",
                    root.join("usr/lib/x86_64-linux-gnu/systemd"),
                );
                command
            }
        };
        std::fs::create_dir_all(dir).unwrap();
        let child = command
            .arg(format!("--output={}", dir.join(name).display()))
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("systemd-journal-remote: {e}"))?;
        Ok(Writer { child })
    }

    pub fn append(&mut self, entries: &[Entry]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(&export(entries)).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes its input and waits for it to write the rest and close the file.
    pub fn finish(mut self) {
        drop(self.child.stdin.take());
        let output = self.child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "systemd-journal-remote: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Writes `entries` into `dir/<name>` at once. Err names what is missing.
pub fn write(dir: &Path, name: &str, entries: &[Entry]) -> Result<PathBuf, String> {
    write_compressed(dir, name, entries, Compression::Default)
}

/// As [`write`], in `compression`.
pub fn write_compressed(
    dir: &Path,
    name: &str,
    entries: &[Entry],
    compression: Compression,
) -> Result<PathBuf, String> {
    let mut writer = Writer::start_compressed(dir, name, compression)?;
    writer.append(entries);
    writer.finish();
    Ok(dir.join(name))
}

/// This boot's kernel messages in `file`, as journalctl reads them (`-k -b -o cat`).
pub fn kernel_messages(file: &Path) -> Vec<String> {
    let output = Command::new("journalctl")
        .args(["--file"])
        .arg(file)
        .args(["-k", "-b", "-o", "cat", "--no-pager"])
        .output()
        .expect("journalctl is installed with systemd");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
