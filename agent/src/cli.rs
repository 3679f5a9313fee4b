//! The command line: `verify` and `manifest`. Each command turns its arguments into the library's
//! plain types, runs it, and prints; nothing here decides what is verified.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::cache::hasher::Control;
use crate::cache::manifest::native::NativeHash;
use crate::cache::manifest::{SignerField, SignerFields, TrustPolicy};
use crate::cache::report::{FileStatus, Report};
use crate::cache::settings::Threads;
use crate::cache::{self, manifest, VerifyOptions};
use crate::config::{self, LogFormat, Override};
use crate::settings::Within;

/// Exit codes: 0 verified, 1 verification failed (signature and trust policy included), 2 bad
/// usage or a manifest that cannot be used at all.
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "mlnode-agent",
    version,
    about = "Node agent for GPU and AWS Neuron inference nodes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Verify a model cache (plain directory or Hugging Face repo cache) against a trusted manifest.
    Verify(VerifyArgs),
    /// Write the native manifest of a model directory to standard output.
    Manifest(ManifestArgs),
    /// Run the agent: keep the configured model caches verified and serve /metrics, /healthz, /readyz.
    Serve(ServeArgs),
    /// Print the configuration `serve` would run with (same flags and variables), and where each
    /// value that differs from the default came from: file, variable or flag.
    Config(ConfigArgs),
    /// Print the startup phases of the Ready pods on this node (or the ones named), from the API server.
    StartupReport(StartupReportArgs),
    /// Read this boot's kernel log from the journal once, as `serve` does at start with
    /// `kernel_log.enabled`, and print the faults the agent finds in it.
    KernelLog(KernelLogArgs),
}

#[derive(Args, Debug)]
pub struct KernelLogArgs {
    /// A journal directory (repeatable; default: /var/log/journal and /run/log/journal, each read
    /// when it exists).
    #[arg(long = "directory", short = 'D')]
    pub directories: Vec<PathBuf>,
    /// The boot to read, as `_BOOT_ID` or the kernel's UUID (default: this one).
    #[arg(long)]
    pub boot_id: Option<String>,
    /// libsystemd, which reads the journal: a name the dynamic loader finds, or a path (default:
    /// `kernel_log.library`'s, libsystemd.so.0).
    #[arg(long)]
    pub library: Option<PathBuf>,
    /// Print one JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StartupReportArgs {
    /// Only pods in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only this pod (with --namespace, or searched in every namespace).
    #[arg(long)]
    pub pod: Option<String>,
    /// The node whose pods to report (default: $NODE_NAME, else this host's name).
    #[arg(long)]
    pub node: Option<String>,
    /// The agent's config, to name each pod's model by the cache it mounts.
    #[arg(long, env = "MLNODE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// YAML config file. Without one, an embedded default verifies the example model in this
    /// repository and listens on 127.0.0.1:9400.
    #[arg(long, env = "MLNODE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to serve on (the `listen` key).
    #[arg(long)]
    pub listen: Option<String>,
    /// Set any config key, such as `--set verify.threads=4` (repeatable; after MLNODE_* variables).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print the config file's JSON Schema instead (every key the agent takes, and its JSON
    /// types), as the Helm chart checks its `config` value against.
    #[arg(long, conflicts_with_all = ["config", "listen", "set"])]
    pub schema: bool,
}

#[derive(Args, Debug)]
pub struct HashingArgs {
    /// Hashing threads (0: one per core; at most 256).
    #[arg(long, default_value = "0")]
    pub threads: Within<Threads>,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The model directory, or a Hugging Face repo cache folder (models--org--name).
    pub root: PathBuf,
    /// Native JSON manifest or OpenSSF model_signing bundle. Without one, a Hugging Face cache is
    /// checked against its own blob names (integrity only: docs/cache-verification.md).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Expected revision: a commit, or a ref name such as `main` in a Hugging Face cache.
    #[arg(long)]
    pub revision: Option<String>,
    #[command(flatten)]
    pub signer: SignerFields,
    /// Files or folders under ROOT that are neither checked nor extra, besides those a bundle's
    /// own ignore list names (model_signing's --ignore-paths); relative to ROOT, or a path inside it.
    #[arg(long, visible_alias = "ignore_paths")]
    pub ignore_paths: Vec<PathBuf>,
    /// Fail when ROOT holds files the manifest does not list (always so for a signed bundle,
    /// unless --ignore-unsigned-files).
    #[arg(long)]
    pub fail_on_extra: bool,
    /// With a signed bundle, let files it does not list pass (model_signing's
    /// --ignore_unsigned_files).
    #[arg(long)]
    pub ignore_unsigned_files: bool,
    /// Print one JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub hashing: HashingArgs,
}

#[derive(Args, Debug)]
pub struct ManifestArgs {
    /// The model directory, or a Hugging Face repo cache folder.
    pub root: PathBuf,
    /// The revision to record (plain directory), or the snapshot to describe (Hugging Face cache).
    #[arg(long)]
    pub revision: Option<String>,
    /// The hash each file's content is recorded with: sha256 (what every tool reads), or blake3
    /// (several times faster to verify on the same cores).
    #[arg(long, value_enum, default_value_t = NativeHash::Sha256)]
    pub hash: NativeHash,
    #[command(flatten)]
    pub hashing: HashingArgs,
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Verify(args) => verify(args),
        Command::Manifest(args) => write_manifest(args),
        Command::Serve(args) => serve(args),
        Command::Config(args) => print_config(args),
        Command::StartupReport(args) => startup_report(args),
        Command::KernelLog(args) => kernel_log(args),
    }
}

fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("mlnode-agent: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// Runs `work` on a pool of `threads` hashing threads, with a progress bar on a terminal.
fn with_pool<T: Send>(
    threads: usize,
    work: impl FnOnce(&Control) -> T + Send,
) -> Result<T, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("hash-{i}"))
        .build()
        .map_err(|e| format!("cannot start {threads} hashing threads: {e}"))?;
    let control = Arc::new(Control::default());
    let progress = std::io::stderr()
        .is_terminal()
        .then(|| spawn_progress(control.clone()));
    let result = pool.install(|| work(&control));
    if let Some((done, bar)) = progress {
        done.store(true, Ordering::Relaxed);
        let _ = bar.join();
    }
    Ok(result)
}

fn spawn_progress(
    control: Arc<Control>,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = done.clone();
    let handle = std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        while !finished.load(Ordering::Relaxed) {
            bar.set_length(control.planned_bytes.load(Ordering::Relaxed));
            bar.set_position(control.hashed_bytes.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
    });
    (done, handle)
}

/// A signer field as `verify` takes it: the flag that sets it.
fn flag(field: SignerField) -> String {
    format!("--{}", field.key().replace('_', "-"))
}

fn verify(args: VerifyArgs) -> ExitCode {
    let trust = match TrustPolicy::try_from(args.signer.clone()) {
        Ok(trust) => trust,
        Err(conflict) => {
            eprintln!("error: {}", conflict.explain(flag));
            return ExitCode::from(2);
        }
    };
    let loaded = match &args.manifest {
        Some(path) => manifest::load(path, &trust),
        None => manifest::hub::from_blob_names(&args.root, args.revision.as_deref()),
    };
    let mut manifest = match loaded {
        Ok(manifest) => manifest,
        // A signature or policy check that ran and failed is a failed verification, not bad usage.
        Err(e) => match e.failed_stage() {
            Some(stage) => return early_failure(args.json, stage, &e.explain(flag)),
            None if matches!(e, manifest::ManifestError::NoManifest { .. }) => {
                return usage_error(format!("{e} (give one with --manifest)"))
            }
            None => return usage_error(e.explain(flag)),
        },
    };
    for path in &args.ignore_paths {
        match relative_to(&args.root, path) {
            Ok(relative) => manifest.ignore_paths.push(relative),
            Err(e) => return usage_error(e),
        }
    }
    let options = VerifyOptions {
        revision: args.revision.clone(),
        fail_on_extra: args.fail_on_extra,
        ignore_unsigned_files: args.ignore_unsigned_files,
        manifest_path: args.manifest.clone(),
        // Only the JSON report lists the files that are ok; the summary counts them.
        keep_ok_lines: args.json,
        ..VerifyOptions::default()
    };
    let outcome = with_pool(args.hashing.threads.get(), |control| {
        cache::verify(&args.root, &manifest, &options, control)
    });
    let report = match outcome {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => return usage_error(e),
        Err(e) => return usage_error(e),
    };
    let printed = if args.json {
        let mut json = serde_json::to_value(&report).unwrap_or_default();
        if let Some(stage) = report_stage(&report) {
            json["stage"] = stage.into();
        }
        serde_json::to_string_pretty(&json)
            .map_err(std::io::Error::other)
            .and_then(|json| writeln!(std::io::stdout(), "{json}"))
    } else {
        print_summary(&args.root, &report)
    };
    if let Err(e) = printed {
        return usage_error(format!("cannot write the report: {e}"));
    }
    if report.is_verified() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

/// `path` as the manifest spells paths, relative to `root`: given relative to ROOT, or as a path
/// (relative to the working directory, as model_signing's scripts pass them) that lies inside it.
fn relative_to(root: &std::path::Path, path: &std::path::Path) -> Result<String, String> {
    let inside = std::fs::canonicalize(path)
        .ok()
        .zip(std::fs::canonicalize(root).ok())
        .and_then(|(path, root)| path.strip_prefix(root).ok().map(PathBuf::from));
    let relative = match inside {
        Some(relative) => relative,
        None if path.is_relative() => path.to_path_buf(),
        None => {
            return Err(format!(
                "--ignore-paths {}: not inside {}",
                path.display(),
                root.display()
            ))
        }
    };
    relative
        .to_str()
        .map(|p| p.trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("--ignore-paths {}: not a path under ROOT", path.display()))
}

/// The stage at which a verification that hashed files failed: the revision on disk, a file's
/// content, or (only extras failing) the extras policy.
fn report_stage(report: &Report) -> Option<&'static str> {
    if report.is_verified() {
        None
    } else if report.error.is_some() {
        Some("revision")
    } else if report
        .files
        .iter()
        .any(|f| !matches!(f.status, FileStatus::Ok | FileStatus::Extra))
    {
        Some("digest")
    } else {
        Some("extra")
    }
}

/// A verification that failed before any file was hashed: exit 1, and with `--json` a report
/// naming the stage.
fn early_failure(json: bool, stage: &str, error: &str) -> ExitCode {
    if json {
        let report =
            serde_json::json!({"status": "failed", "stage": stage, "error": error, "files": []});
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    }
    eprintln!("mlnode-agent: {error}");
    ExitCode::from(EXIT_FAILED)
}

fn print_summary(root: &std::path::Path, report: &Report) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for file in report.files.iter().filter(|f| f.status != FileStatus::Ok) {
        let detail = file.error.as_deref().unwrap_or("");
        writeln!(
            out,
            "{:<20} {}  {}",
            file.status.as_str(),
            file.path,
            detail
        )?;
    }
    if let Some(error) = &report.error {
        writeln!(out, "error: {error}")?;
    }
    if let Some(note) = &report.listing_error {
        writeln!(out, "note: {note}")?;
    }
    let counts: Vec<String> = report
        .counts()
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(status, n)| format!("{n} {}", status.as_str()))
        .collect();
    let rate = report.bytes_hashed as f64 / report.seconds.max(1e-9) / 1e9;
    writeln!(
        out,
        "{}: {} {} (revision {}): {}; {:.2} GB hashed in {:.2} s ({rate:.2} GB/s)",
        if report.is_verified() {
            "VERIFIED"
        } else {
            "FAILED"
        },
        root.display(),
        if report.is_verified() {
            "matches its manifest"
        } else {
            "does not match its manifest"
        },
        report.revision.as_deref().unwrap_or("not given"),
        if counts.is_empty() {
            "no files".to_string()
        } else {
            counts.join(", ")
        },
        report.bytes_hashed as f64 / 1e9,
        report.seconds,
    )
}

fn write_manifest(args: ManifestArgs) -> ExitCode {
    let outcome = with_pool(args.hashing.threads.get(), |control| {
        cache::generate::generate(&args.root, args.revision.as_deref(), args.hash, control)
    });
    let manifest = match outcome {
        Ok(Ok(manifest)) => manifest,
        Ok(Err(e @ cache::generate::GenerateError::Files(_))) => {
            eprintln!("mlnode-agent: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
        Ok(Err(e)) => return usage_error(e),
        Err(e) => return usage_error(e),
    };
    let json = match serde_json::to_string_pretty(&manifest) {
        Ok(json) => json,
        Err(e) => return usage_error(e),
    };
    match writeln!(std::io::stdout(), "{json}") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => usage_error(format!("cannot write the manifest: {e}")),
    }
}

/// The config `serve` runs with: the file, then `MLNODE_*` variables, `--set` flags and `--listen`.
fn serve_config(args: &ServeArgs) -> Result<(config::Config, config::Sources), ExitCode> {
    let mut overrides = Override::from_env().map_err(usage_error)?;
    for text in &args.set {
        overrides.push(Override::from_flag(text).map_err(usage_error)?);
    }
    if let Some(listen) = &args.listen {
        overrides.push(Override {
            origin: "flag --listen".into(),
            key: "listen".into(),
            value: listen.clone(),
        });
    }
    config::load_with_sources(args.config.as_deref(), &overrides).map_err(usage_error)
}

fn print_config(args: ConfigArgs) -> ExitCode {
    if args.schema {
        match serde_json::to_string_pretty(&config::json_schema()) {
            Ok(schema) => println!("{schema}"),
            Err(e) => return usage_error(format!("cannot write the schema: {e}")),
        }
        return ExitCode::SUCCESS;
    }
    match serve_config(&args.serve) {
        Ok((config, sources)) => {
            print!("{}", config::describe(&config, &sources));
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let (config, sources) = match serve_config(&args) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    init_logging(config.log_format);
    tracing::debug!(config = %config::describe(&config, &sources), "effective configuration");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mlnode-agent")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return usage_error(format!("cannot start the async runtime: {e}")),
    };
    let outcome = runtime.block_on(crate::daemon::run(config));
    // A blocking task stuck in a driver or file system call must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "mlnode-agent stopped");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Text on a terminal, JSON in a container's log; `RUST_LOG` filters (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube logs each failed request itself; the agent reports (and rate-limits) those errors.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
        });
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// The one-shot view of the phases, for an SRE at a terminal. Model loads are not seen here (no
/// file watch ran), so that phase and readiness show as unknown.
fn startup_report(args: StartupReportArgs) -> ExitCode {
    let config = match config::load(args.config.as_deref(), &[]) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    let node = args.node.clone().unwrap_or(config.node_name.clone());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return usage_error(format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(crate::startup::report::collect(
        &node,
        args.namespace.as_deref(),
        args.pod.as_deref(),
        &config
            .models
            .iter()
            .map(config::model_mount)
            .collect::<Vec<_>>(),
    ));
    match result {
        Ok(startups) => {
            print!("{}", crate::startup::report::table(&startups));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mlnode-agent: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn kernel_log(args: KernelLogArgs) -> ExitCode {
    use crate::kernel_log::journal;
    let defaults = crate::kernel_log::settings::KernelLogSettings::default();
    let boot = match &args.boot_id {
        Some(id) => {
            let id: String = id
                .chars()
                .filter(|c| *c != '-')
                .collect::<String>()
                .to_ascii_lowercase();
            if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return usage_error(format!(
                    "--boot-id {:?}: expected 32 hex digits, as journalctl --list-boots shows them",
                    args.boot_id.unwrap_or_default()
                ));
            }
            id
        }
        None => match journal::read_boot_id(&defaults.boot_id_file) {
            Ok(id) => id,
            Err(e) => return usage_error(e),
        },
    };
    let dirs = if args.directories.is_empty() {
        defaults.journal_dirs
    } else {
        args.directories
    };
    let library = args.library.unwrap_or(defaults.library);
    let started = std::time::Instant::now();
    let scan = match journal::scan(&library, &dirs, &boot) {
        Ok(scan) => scan,
        Err(e) => {
            eprintln!("mlnode-agent: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let facts = &scan.facts;
    let ago = |at: std::time::Instant| at.elapsed().as_secs();
    if args.json {
        let document = serde_json::json!({
            "boot_id": boot,
            "files": scan.files,
            "unreadable_files": scan.unreadable.iter().map(|u| serde_json::json!({
                "file": u.file, "reason": u.reason(), "error": u.error.to_string(),
                "incompatible_flags": u.incompatible_flags,
            })).collect::<Vec<_>>(),
            "entries": scan.entries,
            "bad_entries": scan.bad_entries,
            "seconds": seconds,
            "xids": facts.xids.iter().map(|((gpu, xid), l)| serde_json::json!({
                "gpu": gpu.to_string(), "xid": xid, "count": l.count, "process": l.process,
                "last_seconds_ago": ago(l.last),
                "immediate_action": crate::gpu::xid::immediate_action(*xid),
            })).collect::<Vec<_>>(),
            "fallen_off_bus": facts.fallen_off_bus.iter().map(|(gpu, l)| serde_json::json!({
                "gpu": gpu.to_string(), "count": l.count, "last_seconds_ago": ago(l.last),
            })).collect::<Vec<_>>(),
            "sxids": facts.sxids,
            "neuron_hardware_errors": facts.neuron_errors.iter().map(|((device, class), l)| serde_json::json!({
                "neuron_device_index": device, "error_type": class, "count": l.count, "last_seconds_ago": ago(l.last),
            })).collect::<Vec<_>>(),
        });
        println!("{document:#}");
        return ExitCode::SUCCESS;
    }
    println!(
        "boot {boot}: {} kernel entries read from {} journal files in {dirs:?} in {seconds:.2} s ({} unreadable entries, skipped)",
        scan.entries,
        scan.files.len(),
        scan.bad_entries
    );
    for unreadable in &scan.unreadable {
        println!("{}", unreadable.describe(&library));
    }
    for ((gpu, xid), l) in &facts.xids {
        let process = l
            .process
            .as_deref()
            .map(|p| format!(", process {p}"))
            .unwrap_or_default();
        println!(
            "XID {xid} ({}) on the GPU at {gpu}: {} time(s), last {} s ago{process}",
            crate::gpu::xid::immediate_action(*xid),
            l.count,
            ago(l.last)
        );
    }
    for (gpu, l) in &facts.fallen_off_bus {
        println!(
            "the GPU at {gpu} fell off the bus, last {} s ago",
            ago(l.last)
        );
    }
    for (sxid, count) in &facts.sxids {
        println!("NVSwitch SXid {sxid}: {count} time(s)");
    }
    for ((device, class), l) in &facts.neuron_errors {
        let device = device.map_or("a Neuron device".to_string(), |d| {
            format!("Neuron device {d}")
        });
        println!("NEURON_HW_ERR={class} on {device}: {} time(s)", l.count);
    }
    ExitCode::SUCCESS
}
