//! A container started the way the kubelet and containerd start it, emulated without either: a
//! private mount namespace (`unshare(CLONE_NEWNS)`), the image as a chroot, the root filesystem
//! read-only when the manifest says so, every volume bind-mounted at its `mountPath` (read-only
//! where the manifest says), the UID and GID of the securityContext, no capability left in any set
//! when `drop: [ALL]`, `no_new_privs` for `allowPrivilegeEscalation: false`, and exactly the
//! environment the runtime builds. Not emulated: the network, PID and UTS namespaces, cgroups and
//! seccomp (the process shares the host's loopback, which the tests rely on).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One bind mount into the container: a host path at a path inside the container.
#[derive(Clone, Debug)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// Everything the runtime needs to start the process.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// The image's root file system, unpacked.
    pub rootfs: PathBuf,
    pub read_only_root: bool,
    pub mounts: Vec<Mount>,
    pub uid: u32,
    pub gid: u32,
    /// Capabilities are all dropped: the tests refuse a spec that adds any.
    pub no_new_privs: bool,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

/// Whether this process may create a mount namespace and chroot (root on CI; not in every sandbox).
pub fn supported() -> Result<(), String> {
    let output = Command::new("unshare")
        .args(["--mount", "true"])
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "unshare --mount is not permitted here ({}): the as-deployed test needs root and CAP_SYS_ADMIN",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// A mount(2) call prepared before fork: nothing is allocated between fork and exec.
struct Call {
    source: Option<CString>,
    target: CString,
    fstype: Option<CString>,
    flags: libc::c_ulong,
}

impl Call {
    fn run(&self) -> std::io::Result<()> {
        let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: every pointer is a NUL-terminated string owned by `self`, or null.
        let rc = unsafe {
            libc::mount(
                ptr(&self.source),
                self.target.as_ptr(),
                ptr(&self.fstype),
                self.flags,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Vec<Call> {
    let mut calls = vec![Call {
        source: Some(cstring(source)),
        target: cstring(target),
        fstype: None,
        flags: libc::MS_BIND | libc::MS_REC,
    }];
    if read_only {
        calls.push(Call {
            source: None,
            target: cstring(target),
            fstype: None,
            flags: libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
        });
    }
    calls
}

/// The highest capability number this kernel knows.
fn last_capability() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Starts the container's process, its standard output and error going to `log`.
pub fn start(spec: &ContainerSpec, log: &Path) -> Child {
    let root = &spec.rootfs;
    let mut calls = vec![Call {
        source: None,
        target: CString::new("/").unwrap(),
        fstype: None,
        flags: libc::MS_REC | libc::MS_PRIVATE,
    }];
    calls.extend(bind(root, root, false));
    calls.push(Call {
        source: Some(CString::new("proc").unwrap()),
        target: cstring(&root.join("proc")),
        fstype: Some(CString::new("proc").unwrap()),
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
    });
    for mount in &spec.mounts {
        // Mounts apply in order, so a nested mount point lies in the volume mounted before it.
        let target = root.join(mount.target.trim_start_matches('/'));
        calls.extend(bind(&mount.source, &target, mount.read_only));
    }
    if spec.read_only_root {
        calls.push(Call {
            source: None,
            target: cstring(root),
            fstype: None,
            flags: libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
        });
    }
    let chroot_to = cstring(root);
    let (uid, gid, no_new_privs) = (spec.uid, spec.gid, spec.no_new_privs);
    let last_cap = last_capability();
    let mut command = Command::new(&spec.argv[0]);
    command
        .args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("stderr")).unwrap());
    // SAFETY: the closure runs between fork and exec and only makes system calls on data
    // prepared above.
    unsafe {
        command.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            for call in &calls {
                call.run()?;
            }
            check(libc::chroot(chroot_to.as_ptr()))?;
            check(libc::chdir(c"/".as_ptr()))?;
            // drop: [ALL]: the bounding and ambient sets while the capability to do so is still
            // held, then the user, then the inheritable, permitted and effective sets. An execve
            // by UID 0 gets permitted = inheritable | bounding, so both must be empty.
            for cap in 0..=last_cap {
                check(libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0))?;
            }
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
            #[repr(C)]
            struct Header {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let header = Header {
                version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
                pid: 0,
            };
            let data = [
                Data {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                },
                Data {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                },
            ];
            check(libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int)?;
            if no_new_privs {
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            }
            Ok(())
        });
    }
    command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", spec.argv))
}

/// A directory laid out as the kubelet's atomic writer lays out a ConfigMap, Secret or projected
/// volume (k8s.io/kubernetes `pkg/volume/util/atomic_writer.go`): the files in a timestamped
/// directory, `..data` a symlink to it, and each key a symlink through `..data`.
pub fn atomic_volume(dir: &Path, files: &[(&str, &[u8])]) {
    let stamp = "..2026_11_30_04_00_00.000000001";
    std::fs::create_dir_all(dir.join(stamp)).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(stamp).join(name), bytes).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
    std::os::unix::fs::symlink(stamp, dir.join("..data")).unwrap();
}

/// The libraries `ldd` says `binary` loads, by path.
fn ldd(binary: &Path) -> Vec<PathBuf> {
    let ldd = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from)
        .collect()
}

/// The image as the Dockerfile's final stage builds it: its entrypoint, default arguments and
/// user (the `FROM` base is distroless/cc: glibc and its loader, which are copied from this host).
pub struct Image {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: (u32, u32),
    /// (path in the image, file on this machine) for each COPY of the agent binary.
    pub binary_path: String,
    /// The script of the `libsystemd` stage (the kernel log's reader and what it links), when
    /// the final stage copies its `/out/` into the image.
    pub libsystemd_stage: Option<String>,
}

impl Image {
    /// The final stage of the Dockerfile `text`: what it copies, its entrypoint, arguments and user.
    pub fn from_dockerfile(text: &str) -> Image {
        let stage = text.rsplit("\nFROM ").next().unwrap();
        let json_list = |keyword: &str| -> Vec<String> {
            stage
                .lines()
                .find_map(|l| l.strip_prefix(keyword))
                .map(|rest| serde_json::from_str(rest.trim()).unwrap())
                .unwrap_or_default()
        };
        let user = stage
            .lines()
            .find_map(|l| l.strip_prefix("USER "))
            .map(|u| {
                let (uid, gid) = u.trim().split_once(':').unwrap_or((u.trim(), u.trim()));
                (uid.parse().unwrap(), gid.parse().unwrap())
            })
            .unwrap_or((0, 0));
        let binary_path = stage
            .lines()
            .find(|l| l.starts_with("COPY ") && l.contains("mlnode-agent"))
            .and_then(|l| l.split_whitespace().last())
            .unwrap()
            .to_string();
        let libsystemd_stage = stage
            .lines()
            .any(|l| l == "COPY --from=libsystemd /out/ /")
            .then(|| {
                let stage = text
                    .split("\nFROM ")
                    .find(|s| s.contains(" AS libsystemd\n"))?;
                let run = stage.split_once("\nRUN ")?.1;
                Some(run.split("\n\n").next()?.to_string())
            })
            .flatten();
        Image {
            libsystemd_stage,
            entrypoint: json_list("ENTRYPOINT "),
            cmd: json_list("CMD "),
            user,
            binary_path,
        }
    }

    /// Unpacks the image into `rootfs`: the binary, glibc and its loader (what distroless/cc
    /// ships), /etc/passwd, and empty mount points the runtime needs.
    pub fn unpack(&self, rootfs: &Path, binary: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(rootfs).unwrap();
        std::fs::set_permissions(rootfs, std::fs::Permissions::from_mode(0o755)).unwrap();
        let put = |path: &str, from: &Path| {
            let to = rootfs.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            // A hard link where it can be (the binary is hundreds of MB in a debug build).
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to).unwrap();
            }
        };
        put(&self.binary_path, binary);
        for library in ldd(binary) {
            put(
                &library.display().to_string(),
                &library.canonicalize().unwrap(),
            );
        }
        if let Some(script) = &self.libsystemd_stage {
            // The stage's own script, on this Debian host (which has the package: its apt steps
            // are left out), writing into the image where the final stage copies `/out/`.
            let script: Vec<&str> = script
                .lines()
                .filter(|l| !l.contains("apt-get install"))
                .collect();
            let script = script
                .join("\n")
                .replacen("apt-get update", "true", 1)
                .replace("/out", &rootfs.display().to_string());
            let output = Command::new("bash")
                .args(["-euc", &script])
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "the Dockerfile's libsystemd stage: {}\n{script}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        for dir in ["proc", "sys", "dev", "tmp", "etc", "run"] {
            std::fs::create_dir_all(rootfs.join(dir)).unwrap();
        }
        std::fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        )
        .unwrap();
    }
}
