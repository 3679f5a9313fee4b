//! The GPU collector on NVIDIA's own descriptions of its hardware rather than values typed here:
//! go-nvml's mock DGX A100, H100, H200 and B200 servers (pkg/nvml/mock, v0.13.4-1), MIG instances
//! created through the mock's own calls at NVIDIA's placements and named by go-nvlib, and the PCI
//! tree go-nvlib's `MockNvpci` writes (pkg/nvpci, v0.13.0). tests/programs/nvidia-mocks walks each through
//! NVIDIA's interfaces; the agent reads the same values through the C ABI (tests/fake-nvml) and
//! sysfs, and its series must say what NVIDIA's mock answered.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::devices::fake_nvml::{fake_nvml, Scenario};

/// The families a GPU has when NVML answers its identity, memory and MIG layout and nothing else:
/// the agent's bookkeeping, and what the mock models. Any other GPU series would be a reading the
/// mock never gave.
const MODELLED: [&str; 18] = [
    "mlnode_gpu_count",
    "mlnode_gpu_info",
    "mlnode_gpu_lost",
    "mlnode_gpu_pci_devices",
    "mlnode_gpu_pci_virtual_functions",
    "mlnode_gpu_readings_age_seconds",
    "mlnode_gpu_nvml_released",
    "mlnode_gpu_nvml_reinits_total",
    "mlnode_gpu_memory_total_bytes",
    "mlnode_gpu_memory_used_bytes",
    "mlnode_gpu_memory_free_bytes",
    "mlnode_gpu_mig_mode",
    "mlnode_gpu_mig_instance_info",
    "mlnode_gpu_mig_memory_total_bytes",
    "mlnode_gpu_mig_memory_used_bytes",
    "mlnode_gpu_mig_memory_free_bytes",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
];

/// Every GPU of each of NVIDIA's four mock DGX servers, as the agent labels it: name, UUID, bus
/// id, minor number, compute capability, driver and CUDA versions, memory; every reading the mock
/// does not model absent, not 0; on the H100 and the B200 a full 7-slice split and a mixed one.
#[test]
fn the_agent_reports_what_nvidias_mock_servers_answer() {
    testbed::needs!(testbed::devices::nvidia_mocks::binary());
    for (server, mig) in [
        ("dgxa100", false),
        ("dgxh100", true),
        ("dgxh200", false),
        ("dgxb200", true),
    ] {
        let (scenario, answers) = testbed::devices::nvidia_mocks::server(server, mig).unwrap();
        let gpus = answers["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 8, "{server}: a DGX has eight GPUs");
        let scenario = Scenario::of(scenario);
        let agent = crate::gpu::start(&scenario, "  dcgm_names: true\n");
        agent.wait_for(
            &format!("{server}'s eight GPUs"),
            Duration::from_secs(30),
            |m| {
                m.lines()
                    .filter(|l| l.starts_with("mlnode_gpu_info{"))
                    .count()
                    == 8
            },
        );
        let m = agent.metrics();
        for gpu in gpus {
            the_gpu_is_labelled_as_the_mock_answered(server, &m, &answers, gpu);
            if gpu["mig_devices"].as_array().is_some_and(|d| !d.is_empty()) {
                the_mig_devices_are_the_mocks_instances(server, &m, gpu);
            }
        }
        let unmodelled: BTreeSet<&str> = m
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .filter(|name| name.starts_with("mlnode_gpu_") || name.starts_with("DCGM_"))
            .filter(|name| !MODELLED.contains(name))
            .collect();
        assert!(
            unmodelled.is_empty(),
            "{server}: series for readings the mock never gave: {unmodelled:?}"
        );
        assert_eq!(
            sample(&m, "mlnode_collector_up", &[("collector", "nvml")]),
            Some(1.0),
            "{server}: NVML is up with every telemetry call NOT_SUPPORTED"
        );
        // With every GPU MIG-enabled or not as the mock says.
        for gpu in gpus {
            let uuid = gpu["uuid"].as_str().unwrap();
            assert_eq!(
                sample(&m, "mlnode_gpu_mig_mode", &[("UUID", uuid)]),
                Some(gpu["mig_mode"].as_f64().unwrap()),
                "{server} {uuid}"
            );
        }
    }
}

fn the_gpu_is_labelled_as_the_mock_answered(server: &str, m: &str, answers: &Value, gpu: &Value) {
    let index = gpu["index"].to_string();
    let uuid = gpu["uuid"].as_str().unwrap();
    let line = m
        .lines()
        .find(|l| l.starts_with("mlnode_gpu_info{") && l.contains(&format!("UUID=\"{uuid}\"")))
        .unwrap_or_else(|| panic!("{server}: no mlnode_gpu_info for {uuid}:\n{m}"));
    let label = |name: &str| {
        let start = line
            .find(&format!("{name}=\""))
            .unwrap_or_else(|| panic!("{server}: no {name} in {line}"))
            + name.len()
            + 2;
        line[start..].split('"').next().unwrap().to_string()
    };
    // NVML's bus id (8-digit domain) is the mock's (nvml.h's legacy 4-digit form) on the bus.
    assert_eq!(
        mlnode_agent::pci::sysfs_bus_id(&label("pci_bus_id")).as_deref(),
        gpu["pci_bus_id"].as_str(),
        "{server}: {line}"
    );
    let cuda = answers["cuda_driver_version"].as_i64().unwrap();
    for (name, want) in [
        ("gpu", index.clone()),
        ("device", format!("nvidia{index}")),
        ("modelName", gpu["name"].as_str().unwrap().to_string()),
        (
            "DCGM_FI_DRIVER_VERSION",
            answers["driver_version"].as_str().unwrap().to_string(),
        ),
        ("minor_number", gpu["minor_number"].to_string()),
        (
            "cuda_compute_capability",
            format!("{}.{}", gpu["cuda_major"], gpu["cuda_minor"]),
        ),
        (
            "cuda_driver_version",
            format!("{}.{}", cuda / 1000, cuda % 1000 / 10),
        ),
    ] {
        assert_eq!(label(name), want, "{server}: {name} of {line}");
    }
    assert_eq!(
        sample(m, "mlnode_gpu_memory_total_bytes", &[("UUID", uuid)]),
        gpu["memory_total"].as_f64(),
        "{server} {uuid}"
    );
}

/// Each MIG device the mock created is one instance series, by NVIDIA's ids, with go-nvlib's
/// profile name, its GPU instance profile's memory, and as many slices in its name as the profile
/// has; the seven slices of the GPU are all given out.
fn the_mig_devices_are_the_mocks_instances(server: &str, m: &str, gpu: &Value) {
    let uuid = gpu["uuid"].as_str().unwrap();
    let devices = gpu["mig_devices"].as_array().unwrap();
    let instances = m
        .lines()
        .filter(|l| {
            l.starts_with("mlnode_gpu_mig_instance_info{")
                && l.contains(&format!("UUID=\"{uuid}\""))
        })
        .count();
    assert_eq!(instances, devices.len(), "{server} {uuid}");
    let mut slices = BTreeSet::new();
    for device in devices {
        let profile = device["profile"].as_str().unwrap();
        let gpu_instance = device["gpu_instance_id"].to_string();
        let labels = [
            ("UUID", uuid),
            ("GPU_I_ID", gpu_instance.as_str()),
            ("GPU_I_PROFILE", profile),
        ];
        let compute_instance = device["compute_instance_id"].to_string();
        let info = [
            labels.as_slice(),
            &[
                ("mig_uuid", device["uuid"].as_str().unwrap()),
                ("compute_instance_id", compute_instance.as_str()),
            ],
        ]
        .concat();
        assert_eq!(
            sample(m, "mlnode_gpu_mig_instance_info", &info),
            Some(1.0),
            "{server}: {device}"
        );
        assert_eq!(
            sample(m, "mlnode_gpu_mig_memory_total_bytes", &labels),
            device["memory_bytes"].as_f64(),
            "{server}: {device}"
        );
        // `<c>c.<g>g.<m>gb`, `<g>g.<m>gb` where the compute instance is the whole GPU instance.
        let fields: Vec<&str> = profile.split('.').collect();
        let count = |suffix: char| -> Option<u32> {
            fields
                .iter()
                .find_map(|f| f.strip_suffix(suffix)?.parse().ok())
        };
        let g = count('g').unwrap_or_else(|| panic!("{server}: profile {profile}"));
        assert_eq!(g, device["gpu_instance_slices"], "{server}: {device}");
        assert_eq!(
            count('c').unwrap_or(g),
            device["compute_instance_slices"],
            "{server}: {device}"
        );
        for slice in 0..g {
            slices.insert(device["placement_start"].as_u64().unwrap() as u32 + slice);
        }
    }
    assert_eq!(
        slices.len(),
        7,
        "{server} {uuid}: every slice given out: {devices:?}"
    );
}

/// NVIDIA's PCI tree for an A100 host (go-nvlib's `MockNvpci`): eight physical functions, two of
/// them with SR-IOV virtual functions, one bound to vfio-pci for a VM, and a Mellanox NIC. NVML
/// (go-nvml's DGX A100) lists the seven the host keeps. The agent counts the physical functions
/// as nvpci's own `GetGPUs` does, counts the virtual functions apart, names the GPU handed to the
/// VM, and finds no GPU missing.
#[test]
fn nvidias_pci_tree_counts_physical_functions_and_names_a_gpu_handed_to_a_vm() {
    testbed::needs!(testbed::devices::nvidia_mocks::binary());
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let (mut scenario, answers) = testbed::devices::nvidia_mocks::server("dgxa100", false).unwrap();
    let addresses: Vec<&str> = answers["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci_bus_id"].as_str().unwrap())
        .collect();
    let vm = addresses[7];
    let dir = tempfile::tempdir().unwrap();
    let tree = testbed::devices::nvidia_mocks::pci_tree(
        dir.path(),
        &[
            "--a100",
            &addresses.join(","),
            "--vfs",
            &format!("{}=4", addresses[0]),
            "--vfs",
            &format!("{}=2", addresses[1]),
            "--vfio",
            vm,
        ],
    )
    .unwrap();
    let root = Path::new(tree["root"].as_str().unwrap());
    // A ConnectX-7 beside the GPUs (vendor 0x15b3 Mellanox, class 0x020700 InfiniBand
    // controller): no GPU.
    testbed::devices::fake_nvml::pci_function(
        root,
        "0000:c1:00.0",
        ["0x15b3", "0x1021", "0x020700"],
    );
    // The GPU the VM holds is bound to vfio-pci: an NVML initialised now does not list it.
    scenario["devices"][7]["bound"] = json!(false);
    let scenario = Scenario::of(scenario);
    let nvidia_gpus = tree["gpus"].as_array().unwrap();
    let virtual_functions = tree["all"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["is_vf"] == true)
        .count();
    let to_vms: Vec<&Value> = nvidia_gpus
        .iter()
        .filter(|d| d["driver"] == "vfio-pci")
        .collect();
    assert_eq!(
        (nvidia_gpus.len(), virtual_functions, to_vms.len()),
        (8, 6, 1),
        "nvpci's reading of its tree: {tree:#}"
    );
    let agent = Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\n  expected_gpus: 8\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\n",
            fake_nvml().display().to_string(),
            root.display().to_string()
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    agent.wait_for("the bus read", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_pci_devices", &[]).is_some()
            && sample(m, "mlnode_gpu_count", &[]).is_some()
    });
    let m = agent.metrics();
    assert_eq!(
        sample(&m, "mlnode_gpu_pci_devices", &[]),
        Some(nvidia_gpus.len() as f64)
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_pci_virtual_functions", &[]),
        Some(virtual_functions as f64)
    );
    assert_eq!(sample(&m, "mlnode_gpu_count", &[]), Some(7.0));
    let vm_bus_id = format!(
        "0000{}",
        to_vms[0]["address"].as_str().unwrap().to_uppercase()
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_pci_passthrough",
            &[("pci_bus_id", vm_bus_id.as_str())]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        m.lines()
            .filter(|l| l.starts_with("mlnode_gpu_pci_passthrough{"))
            .count(),
        1
    );
    let condition = testbed::wait_until(
        "AcceleratorHealthy written",
        Duration::from_secs(20),
        || {
            let condition = api.condition("AcceleratorHealthy");
            (condition["status"] != Value::Null)
                .then(|| condition.clone())
                .ok_or_else(|| format!("{condition}\n{}", agent.log()))
        },
    );
    assert_eq!(
        condition["status"], "True",
        "no GPU missing: the VM's is accounted for: {condition}"
    );
}

/// The value of `name` for the GPU `uuid`.
fn of_gpu(m: &str, name: &str, uuid: &str) -> Option<f64> {
    sample(m, name, &[("UUID", uuid)])
}

/// Each of NVIDIA's mock NVML profiles (k8s-test-infra v0.3.0: T4, L40S, A100, H100, B200, GB200,
/// GB300) as the agent reports it: the GPU count, and per GPU its name, UUID, bus id, memory,
/// power draw and limit, clocks, temperature, NVLink links and fabric state equal to the
/// profile's. What a profile's GPU has not is absent, not 0: NVLink and MIG on the T4 and the
/// L40S, GPM before Hopper, a fabric without NVSwitches.
#[test]
fn every_nvidia_mock_profile_is_reported_as_it_says() {
    for name in testbed::devices::nvml_profiles::PROFILES {
        let profile = testbed::devices::nvml_profiles::load(name).unwrap();
        let scenario = Scenario::of(testbed::devices::nvml_profiles::scenario(&profile));
        let devices = profile["devices"].as_array().unwrap();
        let gpm = matches!(
            profile["device_defaults"]["architecture"].as_str(),
            Some("hopper" | "blackwell")
        );
        let agent = crate::gpu::start(&scenario, "  dcgm_names: true\n");
        agent.wait_for(
            &format!("the {name} profile's GPUs"),
            Duration::from_secs(30),
            |m| {
                sample(m, "mlnode_gpu_count", &[]) == Some(devices.len() as f64)
                    // GPM ratios come from the second sample.
                    && (!gpm
                        || m.lines()
                            .filter(|l| l.starts_with("mlnode_gpu_sm_active_ratio{"))
                            .count()
                            == devices.len())
            },
        );
        let m = agent.metrics();
        let links = profile["nvlink"]["links_per_gpu"].as_u64().unwrap_or(0);
        for d in devices {
            let uuid = d["uuid"].as_str().unwrap();
            let f = |v: &Value| v.as_f64().unwrap();
            let info = m
                .lines()
                .find(|l| l.starts_with("mlnode_gpu_info{") && l.contains(uuid))
                .unwrap_or_else(|| panic!("{name}: no {uuid}:\n{m}"));
            assert!(
                info.contains(&format!("modelName=\"{}\"", d["name"].as_str().unwrap())),
                "{name}: {info}"
            );
            assert!(
                info.contains(&format!("minor_number=\"{}\"", d["minor_number"])),
                "{name}: {info}"
            );
            let bus = info
                .split("pci_bus_id=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next();
            assert_eq!(
                bus.and_then(mlnode_agent::pci::sysfs_bus_id),
                Some(d["pci"]["bus_id"].as_str().unwrap().to_lowercase()),
                "{name}: {info}"
            );
            for (series, want) in [
                (
                    "mlnode_gpu_memory_total_bytes",
                    f(&d["memory"]["total_bytes"]),
                ),
                (
                    "mlnode_gpu_memory_used_bytes",
                    f(&d["memory"]["used_bytes"]),
                ),
                (
                    "mlnode_gpu_memory_free_bytes",
                    f(&d["memory"]["free_bytes"]),
                ),
                (
                    "mlnode_gpu_memory_reserved_bytes",
                    f(&d["memory"]["reserved_bytes"]),
                ),
                (
                    "mlnode_gpu_power_watts",
                    f(&d["power"]["current_draw_mw"]) / 1000.0,
                ),
                (
                    "mlnode_gpu_power_limit_watts",
                    f(&d["power"]["enforced_limit_mw"]) / 1000.0,
                ),
                (
                    "mlnode_gpu_sm_clock_hertz",
                    f(&d["clocks"]["sm_current"]) * 1e6,
                ),
                (
                    "mlnode_gpu_memory_clock_hertz",
                    f(&d["clocks"]["memory_current"]) * 1e6,
                ),
                (
                    "mlnode_gpu_temperature_celsius",
                    f(&d["thermal"]["temperature_gpu_c"]),
                ),
            ] {
                assert_eq!(
                    of_gpu(&m, series, uuid),
                    Some(want),
                    "{name} {uuid}: {series}"
                );
            }
            let active: Vec<f64> = m
                .lines()
                .filter(|l| l.starts_with("mlnode_gpu_nvlink_link_active{") && l.contains(uuid))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(
                active,
                vec![1.0; links as usize],
                "{name} {uuid}: every one of the profile's {links} NVLink links active"
            );
            let fabric = of_gpu(&m, "mlnode_gpu_fabric_state", uuid);
            assert_eq!(
                fabric,
                d["fabric"].is_object().then_some(3.0),
                "{name} {uuid}: fabric registration COMPLETED where the profile has a fabric, else absent"
            );
            let mig = of_gpu(&m, "mlnode_gpu_mig_mode", uuid);
            let has_mig = d["mig"]["max_gpu_instances"].as_u64() > Some(0);
            assert_eq!(mig, has_mig.then_some(0.0), "{name} {uuid}: MIG mode");
            assert_eq!(
                of_gpu(&m, "mlnode_gpu_sm_active_ratio", uuid).is_some(),
                gpm,
                "{name} {uuid}: GPM from Hopper on only"
            );
        }
    }
}

/// The profiles' failure modes on one GPU of the H100 profile, each the verdict docs/readiness.md
/// gives it, while the other seven keep their series: `lost` and `fallen_off_bus` are `GPULost`;
/// `ecc_uncorrectable` with the README's XID 64 (NVIDIA's catalog: RESET_GPU) holds the node.
#[test]
fn each_failure_mode_of_the_profiles_gives_its_verdict() {
    for (failure, reason) in [
        (json!({"mode": "lost"}), "GPULost"),
        (
            json!({"mode": "fallen_off_bus", "xid": {"code": 79}}),
            "GPULost",
        ),
        (
            json!({"mode": "ecc_uncorrectable", "xid": {"code": 64}}),
            "FatalXID",
        ),
    ] {
        let mut profile = testbed::devices::nvml_profiles::load("h100").unwrap();
        profile["devices"][3]["failure"] = failure.clone();
        let scenario = Scenario::of(testbed::devices::nvml_profiles::scenario(&profile));
        // A node of its own each time: the last agent's verdict is not this one's.
        let (agent, api) = testbed::needs!(crate::gpu::start_with_readiness(&scenario));
        agent.wait_for("every GPU read", Duration::from_secs(20), |m| {
            sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
                && m.lines()
                    .filter(|l| l.starts_with("mlnode_gpu_memory_total_bytes{"))
                    .count()
                    >= 7
        });
        let condition = testbed::wait_until(
            &format!("the verdict on {failure}"),
            Duration::from_secs(20),
            || {
                let condition = api.condition("AcceleratorHealthy");
                (condition["reason"] == reason)
                    .then(|| condition.clone())
                    .ok_or_else(|| format!("{condition}\n{}", agent.log()))
            },
        );
        assert!(
            condition["message"].as_str().unwrap().contains("GPU 3"),
            "{failure}: {condition}"
        );
        let m = agent.metrics();
        for d in profile["devices"].as_array().unwrap() {
            let uuid = d["uuid"].as_str().unwrap();
            let listed = of_gpu(&m, "mlnode_gpu_memory_total_bytes", uuid).is_some();
            let failed = d["index"] == 3 && failure["mode"] != "ecc_uncorrectable";
            assert_eq!(listed, !failed, "{failure}: {uuid}'s series");
        }
    }
}
