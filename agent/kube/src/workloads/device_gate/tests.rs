use mlnode_core::health::{DeviceKind, Held, Holdings, PodRef, Problem, Report};

use super::*;

const GPU0: &str = "GPU-8f1c0a52-3b8e-4d1c-9b61-5a3f0c2e7d10";
const GPU1: &str = "GPU-2b7e9d44-61a0-4f3b-8c15-0d9e6b4a1f23";

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "inference".into(),
        name: name.into(),
    }
}

fn gpu(uuid: &str, index: u32) -> Held {
    Held {
        device: uuid.into(),
        name: format!("GPU {index} ({uuid}, 00000000:{:02X}:00.0)", 0x18 + index),
        listed: true,
    }
}

/// Two single-GPU replicas on a two-GPU node, and the GPU report's problems.
fn report(problems: Vec<Problem>) -> Report {
    let holdings: Holdings = [
        (pod("vllm-0"), vec![gpu(GPU0, 0)]),
        (pod("vllm-1"), vec![gpu(GPU1, 1)]),
    ]
    .into();
    Report {
        devices: 2,
        problems,
        holdings,
        ..Report::new(DeviceKind::Gpu)
    }
}

fn decided(name: &str, reports: &[Report]) -> (Status, String, String) {
    let gate = decide(&pod(name), Some(reports)).expect("reports taken");
    assert_eq!(gate.condition_type, ACCELERATOR_HEALTHY);
    (gate.status, gate.reason, gate.message)
}

/// XID 79 on GPU 1, as the GPU collector words it (gpu::health): only the pod holding GPU 1 is
/// False, named by its UUID and bus id, the XID in the node condition's words; the other pod's
/// gate is what it was, so it is not rewritten.
#[test]
fn a_fault_takes_only_the_pod_holding_that_gpu() {
    let healthy = [report(vec![])];
    let before = decided("vllm-0", &healthy);
    assert_eq!(
        before,
        (
            Status::True,
            "AcceleratorsHealthy".into(),
            format!("GPU 0 ({GPU0}, 00000000:18:00.0): healthy")
        )
    );
    let fault = Problem::new(
        "FatalXID",
        format!("GPU 1 ({GPU1}, 00000000:19:00.0) reported XID 79 (GPU has fallen off the bus, RESTART_BM), which NVIDIA's catalog says needs the GPU reset or the machine restarted"),
    )
    .with_xid(Some(79))
    .on(GPU1);
    let faulty = [report(vec![fault])];
    let (status, reason, message) = decided("vllm-1", &faulty);
    assert_eq!((status, reason.as_str()), (Status::False, "FatalXID"));
    assert!(
        message.starts_with(&format!("GPU 1 ({GPU1}, 00000000:19:00.0) reported XID 79")),
        "{message}"
    );
    assert_eq!(
        decided("vllm-0", &faulty),
        before,
        "unchanged: not rewritten"
    );
}

/// A fault the driver's recovery action speaks for names the XID it followed, which its words do
/// not; a MIG device or a replica is judged by its GPU, and named as the pod holds it.
#[test]
fn a_mig_device_shares_its_gpus_fault_and_the_xid_is_named() {
    let mig = Held {
        device: GPU1.into(),
        name: format!("MIG device MIG-5c2e0f1a-7d3b-4e9c-a1b2-c3d4e5f60718 of GPU 1 ({GPU1}, 00000000:19:00.0)"),
        listed: true,
    };
    let mut report = report(vec![Problem::new(
        "GPUResetRequired",
        format!("the driver asks for a GPU reset of GPU 1 ({GPU1}, 00000000:19:00.0) (NVML recovery action 1)"),
    )
    .with_xid(Some(48))
    .on(GPU1)]);
    report.holdings.insert(pod("small-0"), vec![mig.clone()]);
    let (status, reason, message) = decided("small-0", &[report]);
    assert_eq!(
        (status, reason.as_str()),
        (Status::False, "GPUResetRequired")
    );
    assert_eq!(
        message,
        format!("{}: the driver asks for a GPU reset of GPU 1 ({GPU1}, 00000000:19:00.0) (NVML recovery action 1) (XID 48)", mig.name)
    );
}

/// A verdict on the node pins to no device: no pod's gate takes it (the module's doc says why).
#[test]
fn a_verdict_on_the_node_turns_no_pods_gate() {
    let reports = [report(vec![Problem::new(
        "GPUCountMismatch",
        "8 GPU(s) expected (nvml.expected_gpus), 7 on the PCI bus".into(),
    )])];
    assert_eq!(decided("vllm-0", &reports).0, Status::True);
    assert_eq!(decided("vllm-1", &reports).0, Status::True);
}

/// Never True by default: a pod the kubelet lists no accelerator for, one holding an id no
/// collector lists, and a node with no collector are Unknown, each with its reason; before the
/// readiness controller's first round, nothing is decided.
#[test]
fn what_cannot_be_judged_is_unknown_with_its_reason() {
    let mut with_unlisted = report(vec![]);
    with_unlisted.holdings.insert(
        pod("vllm-2"),
        vec![Held {
            device: "GPU-00000000-dead-beef-0000-000000000002".into(),
            name: "GPU-00000000-dead-beef-0000-000000000002, which NVML does not list".into(),
            listed: false,
        }],
    );
    let reports = [with_unlisted];
    let (status, reason, _) = decided("vllm-2", &reports);
    assert_eq!(
        (status, reason.as_str()),
        (Status::Unknown, "DeviceNotListed")
    );
    let (status, reason, _) = decided("no-gpu", &reports);
    assert_eq!(
        (status, reason.as_str()),
        (Status::Unknown, "DevicesNotResolved")
    );
    let (status, reason, _) = decided("vllm-0", &[]);
    assert_eq!(
        (status, reason.as_str()),
        (Status::Unknown, "NoAcceleratorMonitored")
    );
    assert_eq!(decide(&pod("vllm-0"), None), None);
}

/// A pod holding GPUs and a Neuron device (or two GPUs for tensor parallelism) is False while any
/// one is at fault, every fault said.
#[test]
fn a_pod_holding_several_devices_fails_with_any_of_them() {
    let mut report = report(vec![Problem::new(
        "GPULost",
        format!("GPU 1 ({GPU1}, 00000000:19:00.0) fell off the bus"),
    )
    .on(GPU1)]);
    report
        .holdings
        .insert(pod("tp-0"), vec![gpu(GPU0, 0), gpu(GPU1, 1)]);
    let (status, reason, message) = decided("tp-0", &[report]);
    assert_eq!((status, reason.as_str()), (Status::False, "GPULost"));
    assert_eq!(
        message,
        format!("GPU 1 ({GPU1}, 00000000:19:00.0) fell off the bus")
    );
}
