//! The Pod Security Standards as the PodSecurity admission plugin checks them, at version `latest`:
//! each check below follows one file of k8s.io/pod-security-admission `policy/` (named beside it),
//! over the pod spec as JSON. The restricted level runs every baseline check except the ones its
//! own checks override (`OverrideCheckIDs`), as `policy/registry.go` does.

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    /// The level a namespace label value names (`pod-security.kubernetes.io/enforce`); an absent
    /// label is `privileged`, the API server's default.
    pub fn parse(value: Option<&str>) -> Level {
        match value {
            Some("restricted") => Level::Restricted,
            Some("baseline") => Level::Baseline,
            _ => Level::Privileged,
        }
    }
}

/// `visitContainers`: containers, init containers and ephemeral containers.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

fn any_container(spec: &Value, bad: impl Fn(&Value) -> bool) -> bool {
    containers(spec).any(bad)
}

fn is_true(v: &Value) -> bool {
    v.as_bool() == Some(true)
}

fn windows(spec: &Value) -> bool {
    spec["os"]["name"] == "windows"
}

/// Ids of the failing checks of `level` for a pod (`metadata`, `spec`).
pub fn violations(metadata: &Value, spec: &Value, level: Level) -> Vec<&'static str> {
    let mut failed = Vec::new();
    if level == Level::Privileged {
        return failed;
    }
    let pod_sc = &spec["securityContext"];
    let restricted = level == Level::Restricted;
    let annotations = metadata["annotations"].as_object();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);

    // check_windowsHostProcess.go
    if is_true(&pod_sc["windowsOptions"]["hostProcess"])
        || any_container(spec, |c| {
            is_true(&c["securityContext"]["windowsOptions"]["hostProcess"])
        })
    {
        failed.push("windowsHostProcess");
    }
    // check_hostNamespaces.go
    if ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .any(|k| is_true(&spec[k]))
    {
        failed.push("hostNamespaces");
    }
    // check_privileged.go
    if any_container(spec, |c| is_true(&c["securityContext"]["privileged"])) {
        failed.push("privileged");
    }
    // check_capabilities_baseline.go / check_capabilities_restricted.go (overrides it)
    const BASELINE_CAPS: [&str; 13] = [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ];
    let added = |c: &Value| -> Vec<String> {
        c["securityContext"]["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    };
    if restricted {
        let bad = !windows(spec)
            && any_container(spec, |c| {
                let drops_all = c["securityContext"]["capabilities"]["drop"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|v| v == "ALL"));
                !drops_all || added(c).iter().any(|a| a != "NET_BIND_SERVICE")
            });
        if bad {
            failed.push("capabilities_restricted");
        }
    } else if any_container(spec, |c| {
        added(c)
            .iter()
            .any(|a| !BASELINE_CAPS.contains(&a.as_str()))
    }) {
        failed.push("capabilities_baseline");
    }
    // check_hostPathVolumes.go / check_restrictedVolumes.go (overrides it)
    let volumes: Vec<&Value> = spec["volumes"].as_array().into_iter().flatten().collect();
    if restricted {
        const ALLOWED: [&str; 9] = [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "image",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ];
        let bad = volumes.iter().any(|v| {
            !v.as_object()
                .is_some_and(|o| o.keys().any(|k| ALLOWED.contains(&k.as_str())))
        });
        if bad {
            failed.push("restrictedVolumes");
        }
    } else if volumes.iter().any(|v| v.get("hostPath").is_some()) {
        failed.push("hostPathVolumes");
    }
    // check_hostPorts.go
    if any_container(spec, |c| {
        c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["hostPort"].as_u64().unwrap_or(0) != 0)
    }) {
        failed.push("hostPorts");
    }
    // check_appArmorProfile.go
    let apparmor_ok = |v: &Value| v.is_null() || v == "RuntimeDefault" || v == "Localhost";
    let apparmor_annotation_bad = annotations.is_some_and(|a| {
        a.iter().any(|(k, v)| {
            k.starts_with("container.apparmor.security.beta.kubernetes.io/")
                && !v.as_str().is_some_and(|v| {
                    v.is_empty() || v == "runtime/default" || v.starts_with("localhost/")
                })
        })
    });
    if !apparmor_ok(&pod_sc["appArmorProfile"]["type"])
        || any_container(spec, |c| {
            !apparmor_ok(&c["securityContext"]["appArmorProfile"]["type"])
        })
        || apparmor_annotation_bad
    {
        failed.push("appArmorProfile");
    }
    // check_seLinuxOptions.go (1.31 types)
    let selinux_bad = |o: &Value| {
        o.is_object()
            && (![
                "",
                "container_t",
                "container_init_t",
                "container_kvm_t",
                "container_engine_t",
            ]
            .contains(&o["type"].as_str().unwrap_or(""))
                || !o["user"].as_str().unwrap_or("").is_empty()
                || !o["role"].as_str().unwrap_or("").is_empty())
    };
    if selinux_bad(&pod_sc["seLinuxOptions"])
        || any_container(spec, |c| {
            selinux_bad(&c["securityContext"]["seLinuxOptions"])
        })
    {
        failed.push("seLinuxOptions");
    }
    // check_procMount_baseline.go (user-namespaced pods are exempt from 1.35)
    let user_namespaced = spec["hostUsers"].as_bool() == Some(false);
    if !user_namespaced
        && any_container(spec, |c| {
            let mount = &c["securityContext"]["procMount"];
            !mount.is_null() && mount != "Default"
        })
    {
        failed.push("procMount");
    }
    // check_seccompProfile_baseline.go / check_seccompProfile_restricted.go (overrides it)
    let seccomp_valid = |t: &Value| t == "RuntimeDefault" || t == "Localhost";
    let seccomp_set_bad = |sc: &Value| {
        let t = &sc["seccompProfile"]["type"];
        !t.is_null() && !seccomp_valid(t)
    };
    let annotation_bad = annotation("seccomp.security.alpha.kubernetes.io/pod").is_some_and(|v| {
        !(v == "runtime/default" || v == "docker/default" || v.starts_with("localhost/"))
    });
    if restricted {
        let pod_set = seccomp_valid(&pod_sc["seccompProfile"]["type"]);
        let bad = !windows(spec)
            && (seccomp_set_bad(pod_sc)
                || any_container(spec, |c| {
                    seccomp_set_bad(&c["securityContext"])
                        || (c["securityContext"]["seccompProfile"].is_null() && !pod_set)
                }));
        if bad {
            failed.push("seccompProfile_restricted");
        }
    } else if seccomp_set_bad(pod_sc)
        || any_container(spec, |c| seccomp_set_bad(&c["securityContext"]))
        || annotation_bad
    {
        failed.push("seccompProfile_baseline");
    }
    // check_sysctls.go (1.37 allowed set)
    const SAFE_SYSCTLS: [&str; 14] = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    ];
    if pod_sc["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| !SAFE_SYSCTLS.contains(&s["name"].as_str().unwrap_or("")))
    {
        failed.push("sysctls");
    }
    // check_hostProbesAndhostLifecycle.go
    let host_set = |h: &Value| {
        ["httpGet", "tcpSocket"]
            .iter()
            .any(|k| !h[k]["host"].as_str().unwrap_or("").is_empty())
    };
    if any_container(spec, |c| {
        ["livenessProbe", "readinessProbe", "startupProbe"]
            .iter()
            .any(|p| host_set(&c[p]))
            || ["postStart", "preStop"]
                .iter()
                .any(|h| host_set(&c["lifecycle"][h]))
    }) {
        failed.push("hostProbesAndHostLifecycle");
    }
    if !restricted {
        return failed;
    }
    // check_allowPrivilegeEscalation.go
    if !windows(spec)
        && any_container(spec, |c| {
            c["securityContext"]["allowPrivilegeEscalation"].as_bool() != Some(false)
        })
    {
        failed.push("allowPrivilegeEscalation");
    }
    // check_runAsNonRoot.go
    let pod_non_root = pod_sc["runAsNonRoot"].as_bool();
    if !user_namespaced
        && (pod_non_root == Some(false)
            || any_container(spec, |c| {
                match c["securityContext"]["runAsNonRoot"].as_bool() {
                    Some(v) => !v,
                    None => pod_non_root != Some(true),
                }
            }))
    {
        failed.push("runAsNonRoot");
    }
    // check_runAsUser.go
    if !user_namespaced
        && (pod_sc["runAsUser"].as_u64() == Some(0)
            || any_container(spec, |c| {
                c["securityContext"]["runAsUser"].as_u64() == Some(0)
            }))
    {
        failed.push("runAsUser");
    }
    failed
}
