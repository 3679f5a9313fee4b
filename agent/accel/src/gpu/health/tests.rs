//! The health verdicts on made-up GPU states and instants.

use super::*;
use crate::gpu::state::DeviceRead;
use crate::gpu::{GpuIdentity, GpuReading};
use std::time::Duration;

fn gpu(recovery_action: Option<u32>) -> DeviceRead {
    DeviceRead::Read {
        identity: GpuIdentity {
            index: 0,
            uuid: "GPU-aaaa".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            model_name: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        },
        reading: Box::new(GpuReading {
            recovery_action,
            ..GpuReading::default()
        }),
    }
}

fn state(t0: Instant) -> GpuState {
    // No sampler round recorded: the made-up instants below never look stalled.
    let mut state = GpuState {
        stall_after: Duration::from_secs(3),
        ..GpuState::default()
    };
    state.apply(0, gpu(Some(0)), 1.0, t0);
    state
}

/// [`assess`] and what the kernel log adds, as `GpuHealth::report` combines them.
fn with_log(state: &GpuState, lines: &[(&str, Instant)], from_node: &FromNode) -> Report {
    let mut facts = LogFacts {
        history_read: true,
        ..LogFacts::default()
    };
    let mut parser = crate::kernel_log::parse::Parser::default();
    for (line, at) in lines {
        if let Some(event) = parser.line(line) {
            facts.apply(event, *at);
        }
    }
    let mut report = assess(state, &XidPolicy::default(), from_node, lines[0].1);
    add_logged(&mut report, state, &facts, &XidPolicy::default(), from_node);
    report
}

/// GPU 0 of [`state`] is at 0000:18:00 on the bus.
#[test]
fn a_logged_xid_holds_like_nvmls_and_one_seen_by_both_is_one() {
    let t0 = Instant::now();
    let before_start = t0.checked_sub(Duration::from_secs(60)).unwrap_or(t0);
    let mut state = state(t0);
    // XID 119 (RESET_GPU, linked to no recovery action) from before the agent started.
    let report = with_log(&state, &[("NVRM: Xid (PCI:0000:18:00): 119, pid=77, name=vllm, Timeout after 6s of waiting for RPC response from GPU0 GSP!", before_start)], &FromNode::default());
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].reason, "FatalXID");
    assert!(report.problems[0].message.contains("GPU 0 (GPU-aaaa, 00000000:18:00.0): the kernel log has XID 119 (RESET_GPU, process vllm)"), "{}", report.problems[0].message);
    assert_eq!(
        report.held["GPU-aaaa"],
        [119].into(),
        "kept across an agent restart as NVML's are"
    );
    // NVML saw it too: one problem, NVML's.
    state.record_xid(0, 119, None, t0);
    let report = with_log(
        &state,
        &[("NVRM: Xid (PCI:0000:18:00): 119, Timeout", t0)],
        &FromNode::default(),
    );
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].message.contains("reported XID 119"),
        "{}",
        report.problems[0].message
    );
    // An XID that holds nothing, and one another GPU logged: nothing here.
    let quiet = with_log(
        &self::state(t0),
        &[(
            "NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception",
            t0,
        )],
        &FromNode::default(),
    );
    assert!(quiet.problems.is_empty());
}

#[test]
fn a_logged_xid_the_driver_links_is_cleared_by_a_later_none_and_by_the_operator() {
    let t0 = Instant::now();
    let xid_at = t0 + Duration::from_secs(10);
    let mut state = state(t0);
    let line = [(
        "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        xid_at,
    )];
    assert_eq!(
        with_log(&state, &line, &FromNode::default()).problems[0].reason,
        "FatalXID"
    );
    state.apply(0, gpu(Some(0)), 1.0, xid_at + Duration::from_secs(3));
    assert!(
        with_log(&state, &line, &FromNode::default())
            .problems
            .is_empty(),
        "the driver says NONE since"
    );
    let cleared = FromNode {
        cleared_before: Some(xid_at + Duration::from_secs(1)),
        ..FromNode::default()
    };
    let fall = [(
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        xid_at,
    )];
    assert_eq!(
        with_log(&state, &fall, &FromNode::default()).problems[0].reason,
        "GPUFallenOffBus"
    );
    assert!(
        with_log(&state, &fall, &cleared).problems.is_empty(),
        "cleared by the operator after it"
    );
}

#[test]
fn no_verdict_is_true_while_the_history_is_being_read() {
    let t0 = Instant::now();
    let mut report = assess(&state(t0), &XidPolicy::default(), &FromNode::default(), t0);
    add_logged(
        &mut report,
        &state(t0),
        &LogFacts::default(),
        &XidPolicy::default(),
        &FromNode::default(),
    );
    let reasons: Vec<&str> = report.problems.iter().map(|p| p.reason.as_str()).collect();
    assert_eq!(reasons, ["KernelLogPending"]);
}

#[test]
fn a_gpu_nvml_does_not_list_is_named_by_its_address() {
    let t0 = Instant::now();
    let report = with_log(
        &state(t0),
        &[
            ("NVRM: The NVIDIA GPU 0000:bd:00.0", t0),
            ("NVRM: (PCI ID: 10de:2330) installed in this system has", t0),
            (
                "NVRM: fallen off the bus and is not responding to commands.",
                t0,
            ),
        ],
        &FromNode::default(),
    );
    assert_eq!(report.problems.len(), 1);
    assert_eq!(report.problems[0].reason, "GPUFallenOffBus");
    assert!(
        report.problems[0]
            .message
            .starts_with("the GPU at PCI 0000:bd:00 (not listed by NVML) fell off the bus"),
        "{}",
        report.problems[0].message
    );
}

/// One more NVIDIA GPU on the scanned bus.
fn also_on_bus(state: &mut GpuState, address: &str) {
    state.pci.as_mut().unwrap().devices.push(address.into());
}

fn reasons(state: &GpuState, now: Instant) -> Vec<String> {
    assess(state, &XidPolicy::default(), &FromNode::default(), now)
        .problems
        .into_iter()
        .map(|p| p.reason)
        .collect()
}

#[test]
fn the_drivers_verdict_comes_first_and_names_the_gpu() {
    let t0 = Instant::now();
    let mut state = state(t0);
    assert!(reasons(&state, t0).is_empty());
    for (value, reason) in [
        (1, "GPUResetRequired"),
        (2, "NodeRebootRequired"),
        (3, "DrainP2PRequired"),
        (4, "DrainAndResetRequired"),
        (9, "UnknownRecoveryAction"),
    ] {
        state.apply(0, gpu(Some(value)), 1.0, t0);
        let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].reason, reason);
        assert!(
            problems[0]
                .message
                .contains("GPU 0 (GPU-aaaa, 00000000:18:00.0)")
                && problems[0].message.contains(&value.to_string()),
            "{}",
            problems[0].message
        );
    }
    state.apply(0, gpu(Some(0)), 1.0, t0);
    assert!(reasons(&state, t0).is_empty(), "NONE again: healthy again");
}

/// XID 48 on a driver that links recovery actions: held while the driver has not spoken since,
/// cleared by a NONE read after it (the GPU was reset). XID 46, which the driver links to no
/// action, holds on through NONE; XID 94 (restart the application) never holds.
#[test]
fn a_none_after_the_xid_clears_what_the_driver_links() {
    let t0 = Instant::now();
    let mut state = state(t0);
    let xid_at = t0 + Duration::from_secs(10);
    state.record_xid(0, 48, None, xid_at);
    state.record_xid(0, 94, None, xid_at);
    assert_eq!(reasons(&state, xid_at), ["FatalXID"]);
    state.apply(0, gpu(Some(1)), 1.0, xid_at + Duration::from_secs(1));
    assert_eq!(reasons(&state, xid_at), ["GPUResetRequired", "FatalXID"]);
    // NONE read too soon after the XID may predate the driver's decision: still held.
    state.apply(0, gpu(Some(0)), 1.0, xid_at + Duration::from_secs(2));
    assert_eq!(reasons(&state, xid_at), ["FatalXID"]);
    state.apply(0, gpu(Some(0)), 1.0, xid_at + Duration::from_secs(3));
    assert!(
        reasons(&state, xid_at).is_empty(),
        "reset and NONE: back in"
    );

    state.record_xid(0, 46, None, xid_at);
    state.apply(0, gpu(Some(0)), 1.0, xid_at + Duration::from_secs(60));
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), xid_at).problems;
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0]
            .message
            .contains("46 (ROBUST_CHANNEL_GPU_TIMEOUT_ERROR, RESET_GPU)"),
        "{}",
        problems[0].message
    );
}

/// Each problem carries the XID behind it, for the repair engines: the driver's action the latest
/// XID it links to one (XID 43, which it links to none, is passed over), a held XID the latest held,
/// a repeat its own number, a kernel-log XID the latest logged, and a previous agent's memory of an
/// unlisted GPU its highest number. A problem no XID came with carries none.
#[test]
fn each_problem_carries_the_xid_behind_it() {
    let t0 = Instant::now();
    let second = Duration::from_secs(1);
    let mut state = state(t0);
    let xids = |state: &GpuState, from_node: &FromNode| -> Vec<(String, Option<u64>)> {
        assess(state, &XidPolicy::default(), from_node, t0)
            .problems
            .into_iter()
            .map(|p| (p.reason, p.xid.map(|c| c.xid)))
            .collect()
    };
    state.record_xid(0, 48, None, t0);
    state.record_xid(0, 43, None, t0 + second);
    state.apply(0, gpu(Some(1)), 1.0, t0 + second * 2);
    assert_eq!(
        xids(&state, &FromNode::default()),
        [
            ("GPUResetRequired".to_string(), Some(48)),
            ("FatalXID".to_string(), Some(48))
        ]
    );
    state.record_xid(0, 79, None, t0 + second * 3);
    state.apply(0, gpu(Some(2)), 1.0, t0 + second * 4);
    assert_eq!(
        xids(&state, &FromNode::default()),
        [
            ("NodeRebootRequired".to_string(), Some(79)),
            ("FatalXID".to_string(), Some(79))
        ],
        "the latest: the GPU off the bus after its ECC error"
    );
    let unlisted = FromNode {
        since: Some(t0),
        faults: [("GPU-gone".to_string(), [48, 64].into())].into(),
        ..FromNode::default()
    };
    assert_eq!(
        xids(&self::state(t0), &unlisted),
        [("FatalXID".to_string(), Some(64))]
    );

    let mut quiet = self::state(t0);
    quiet.apply(0, gpu(Some(1)), 1.0, t0);
    assert_eq!(
        xids(&quiet, &FromNode::default()),
        [("GPUResetRequired".to_string(), None)],
        "no XID seen: none named"
    );
    for i in 0..4 {
        quiet.record_xid(0, 13, None, t0 + second * i);
    }
    let repeats = repeated(&quiet, &XidThresholds::default(), t0 + second * 4);
    assert_eq!(
        repeats[0].xid,
        Some(mlnode_core::health::XidCause {
            xid: 13,
            repeated: true
        })
    );
    let logged = with_log(
        &self::state(t0),
        &[
            (
                "NVRM: Xid (PCI:0000:18:00): 79, pid=77, GPU has fallen off the bus.",
                t0 + second,
            ),
            (
                "NVRM: Xid (PCI:0000:18:00): 48, pid=77, An uncorrectable double bit error",
                t0,
            ),
        ],
        &FromNode::default(),
    );
    assert_eq!(
        logged
            .problems
            .iter()
            .map(|p| p.xid.map(|c| c.xid))
            .collect::<Vec<_>>(),
        [Some(79)],
        "{:?}",
        logged.problems
    );
}

/// A driver without the field (None): the catalog alone decides, and nothing clears a held XID.
#[test]
fn without_the_field_the_catalog_decides() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.apply(0, gpu(None), 1.0, t0);
    state.record_xid(0, 79, None, t0);
    state.apply(0, gpu(None), 1.0, t0 + Duration::from_secs(60));
    assert_eq!(reasons(&state, t0), ["FatalXID"]);
}

fn with_fabric(state: u8, status: u32, health_mask: u32) -> DeviceRead {
    let DeviceRead::Read {
        identity,
        mut reading,
    } = gpu(Some(0))
    else {
        unreachable!()
    };
    reading.fabric = Some(FabricReading {
        state,
        status,
        health_mask: Some(health_mask),
    });
    DeviceRead::Read { identity, reading }
}

/// nvml.h's states: NOT_STARTED and IN_PROGRESS hold the node (CUDA fails until the GPU is
/// registered), COMPLETED with an error fails it, COMPLETED with SUCCESS is fit; a degraded
/// bandwidth or a route in recovery is reported, not gated.
#[test]
fn fabric_registration_gates_and_its_health_is_reported() {
    let t0 = Instant::now();
    let mut state = state(t0);
    for (fabric_state, status, reason) in [
        (1, 0, Some("FabricNotReady")),
        (2, 0, Some("FabricNotReady")),
        (3, 0, None),
        (3, 999, Some("FabricFailed")),
    ] {
        state.apply(0, with_fabric(fabric_state, status, 0), 1.0, t0);
        assert_eq!(
            reasons(&state, t0).first().map(String::as_str),
            reason,
            "state {fabric_state} status {status}"
        );
    }
    // DEGRADED_BW TRUE (1 at shift 0), ROUTE_RECOVERY FALSE (2 at shift 2), the rest unsupported.
    state.apply(0, with_fabric(3, 0, 0b1001), 1.0, t0);
    assert!(reasons(&state, t0).is_empty());
    let fabric = state.gpus[&0].reading.as_ref().unwrap().fabric.unwrap();
    assert_eq!(
        fabric.health_checks(),
        [("degraded_bandwidth", true), ("route_recovery", false)]
    );
}

/// XID 13 alone is the application's; a fourth within the hour holds the node by the default
/// thresholds, naming the GPU and the XID, and lets go once the oldest leave the window. XID
/// 43, which no threshold lists, never does.
#[test]
fn repeats_beyond_the_threshold_hold_until_they_age_out() {
    let t0 = Instant::now();
    let mut state = state(t0);
    let thresholds = XidThresholds::default();
    let minute = Duration::from_secs(60);
    for i in 0..3 {
        state.record_xid(0, 13, None, t0 + minute * i);
        state.record_xid(0, 43, None, t0 + minute * i);
    }
    state.record_xid(0, 43, None, t0 + minute * 3);
    assert!(repeated(&state, &thresholds, t0 + minute * 3).is_empty());
    state.record_xid(0, 13, None, t0 + minute * 10);
    let problems = repeated(&state, &thresholds, t0 + minute * 10);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, "XIDRepeated");
    assert!(
        problems[0].message.contains(
            "GPU 0 (GPU-aaaa, 00000000:18:00.0) reported XID 13 (ROBUST_CHANNEL_GR_EXCEPTION) more than 3 times within 1h"
        ),
        "{}",
        problems[0].message
    );
    assert_eq!(repeated(&state, &thresholds, t0 + minute * 60).len(), 1);
    assert!(
        repeated(&state, &thresholds, t0 + minute * 61).is_empty(),
        "the first left the hour"
    );
}

fn with_rows(pending: bool, failed: bool, action: u32) -> DeviceRead {
    let DeviceRead::Read {
        identity,
        mut reading,
    } = gpu(Some(action))
    else {
        unreachable!()
    };
    reading.remapped_rows = Some(crate::gpu::RemappedRows {
        correctable: 0,
        uncorrectable: 2,
        pending,
        failed,
    });
    DeviceRead::Read { identity, reading }
}

/// A failed remapping says the GPU needs replacing, whatever else the driver says; a pending
/// one asks for a reset unless the driver's recovery action asks for it already.
#[test]
fn dead_memory_and_a_pending_remap_are_named() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.apply(0, with_rows(false, false, 0), 1.0, t0);
    assert!(reasons(&state, t0).is_empty());
    state.apply(0, with_rows(true, false, 0), 1.0, t0);
    assert_eq!(reasons(&state, t0), ["RowRemapPending"]);
    state.apply(0, with_rows(true, false, 1), 1.0, t0);
    assert_eq!(
        reasons(&state, t0),
        ["GPUResetRequired"],
        "the driver asks already"
    );
    state.apply(0, with_rows(false, true, 0), 1.0, t0);
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, "RowRemapFailed");
    assert!(
        problems[0]
            .message
            .contains("GPU 0 (GPU-aaaa, 00000000:18:00.0) failed to remap")
            && problems[0].message.contains("needs replacing"),
        "{}",
        problems[0].message
    );
}

fn with_nvlink(links: &[bool], recovery: u64) -> DeviceRead {
    let DeviceRead::Read {
        identity,
        mut reading,
    } = gpu(Some(0))
    else {
        unreachable!()
    };
    reading.nvlink = Some(crate::gpu::NvLinkReading {
        links: (0..).zip(links.iter().copied()).collect(),
        errors: [Some(0), Some(0), Some(7), Some(recovery)],
    });
    DeviceRead::Read { identity, reading }
}

/// A link seen active that goes inactive fails the GPU, naming the link; one never seen active
/// (a board whose link is not cabled) does not. Recovery errors that rise fail it for
/// `nvml.nvlink_error_window`; a total that falls (the driver reloaded) is no rise.
#[test]
fn an_nvlink_lost_or_recovering_is_named() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.nvlink_error_window = Duration::from_secs(900);
    state.apply(0, with_nvlink(&[true, true, false], 4), 1.0, t0);
    assert!(reasons(&state, t0).is_empty(), "link 2 never came up");
    state.apply(0, with_nvlink(&[true, false, false], 4), 1.0, t0);
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, "NVLinkInactive");
    assert!(
        problems[0]
            .message
            .contains("GPU 0 (GPU-aaaa, 00000000:18:00.0): NVLink link 1 was active"),
        "{}",
        problems[0].message
    );
    state.apply(0, with_nvlink(&[true, true, false], 4), 1.0, t0);
    assert!(reasons(&state, t0).is_empty(), "link 1 back");

    let rose = t0 + Duration::from_secs(10);
    state.apply(0, with_nvlink(&[true, true, false], 6), 1.0, rose);
    assert_eq!(reasons(&state, rose), ["NVLinkRecoveryErrors"]);
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), rose).problems;
    assert!(
        problems[0]
            .message
            .contains("rose to 6 within the last 900 s"),
        "{}",
        problems[0].message
    );
    assert_eq!(
        reasons(&state, rose + Duration::from_secs(899)),
        ["NVLinkRecoveryErrors"]
    );
    assert!(reasons(&state, rose + Duration::from_secs(900)).is_empty());
    // The driver reloaded: counted from 0 again, then quiet.
    let reloaded = rose + Duration::from_secs(1000);
    state.apply(0, with_nvlink(&[true, true, false], 0), 1.0, reloaded);
    assert!(reasons(&state, reloaded).is_empty());
}

/// An H100 on the bus that NVML does not list is missed by its address; a node expected to have
/// 8 with 7 on the bus is missed too. NVML's bus ids (8-digit domain, upper case) match sysfs'.
#[test]
fn every_gpu_on_the_bus_is_accounted_for() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.pci = Some(crate::pci::BusScan {
        devices: vec!["0000:18:00.0".into()],
        ..Default::default()
    });
    assert!(reasons(&state, t0).is_empty(), "GPU 0 is 00000000:18:00.0");
    also_on_bus(&mut state, "0000:2a:00.0");
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
    assert_eq!(problems[0].reason, "GPUCountMismatch");
    assert!(
        problems[0].message.contains("not listed 0000:2a:00.0"),
        "{}",
        problems[0].message
    );
    state.pci.as_mut().unwrap().devices.pop();
    state.expected_gpus = Some(8);
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
    assert_eq!(problems[0].reason, "GPUCountMismatch");
    assert!(
        problems[0]
            .message
            .contains("8 GPU(s) expected (nvml.expected_gpus)"),
        "{}",
        problems[0].message
    );
    // Unconfigured, the node's instance-type label speaks; the setting wins over it.
    state.expected_gpus = None;
    let labelled = FromNode {
        expected: mlnode_core::health::ExpectedDevices {
            gpus: Some(8),
            neuron_devices: None,
        },
        ..FromNode::default()
    };
    let problems = assess(&state, &XidPolicy::default(), &labelled, t0).problems;
    assert!(
        problems[0]
            .message
            .contains("8 GPU(s) expected (karpenter.k8s.aws/instance-gpu-count), 1 on the PCI bus"),
        "{}",
        problems[0].message
    );
    state.expected_gpus = Some(1);
    assert!(assess(&state, &XidPolicy::default(), &labelled, t0)
        .problems
        .is_empty());
}

/// A GPU lost before its first read is listed by NVML without an address: it is the bus's one
/// unmatched GPU, and its verdict is `GPULost` alone, not a count mismatch as well.
#[test]
fn a_gpu_lost_before_its_first_read_is_not_also_a_count_mismatch() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.apply(1, DeviceRead::Failed(GpuFailure::Lost), 1.0, t0);
    state.pci = Some(crate::pci::BusScan {
        devices: vec!["0000:18:00.0".into(), "0000:2a:00.0".into()],
        ..Default::default()
    });
    assert_eq!(reasons(&state, t0), ["GPULost"]);
    also_on_bus(&mut state, "0000:3c:00.0");
    assert_eq!(reasons(&state, t0), ["GPUCountMismatch", "GPULost"]);
}

/// A GPU bound to vfio-pci is a VM's: NVML not listing it is no mismatch, and a GPU that is
/// missing beside it is said with it named apart.
#[test]
fn a_gpu_handed_to_a_vm_is_not_missed() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.pci = Some(crate::pci::BusScan {
        devices: vec!["0000:18:00.0".into(), "0000:2a:00.0".into()],
        drivers: [("0000:2a:00.0".to_string(), "vfio-pci".to_string())].into(),
        ..Default::default()
    });
    assert!(reasons(&state, t0).is_empty());
    also_on_bus(&mut state, "0000:3c:00.0");
    let problems = assess(&state, &XidPolicy::default(), &FromNode::default(), t0).problems;
    assert_eq!(
        problems[0].message,
        "the PCI bus has 3 NVIDIA GPU(s) and NVML lists 1: not listed 0000:3c:00.0 (besides 0000:2a:00.0, handed to a VM through vfio-pci)"
    );
}

/// XIDs a previous agent held on this boot hold the GPU for this one, even through the
/// driver's NONE for one it links to no recovery action; the operator's clearing time clears
/// what was seen before it, the carried XIDs included; a held XID is reported for the next
/// agent to carry.
#[test]
fn carried_faults_hold_until_cleared() {
    let t0 = Instant::now();
    let mut state = state(t0);
    let mut from_node = FromNode {
        since: Some(t0),
        faults: [
            ("GPU-aaaa".to_string(), [46].into()),
            ("GPU-gone".to_string(), [79].into()),
        ]
        .into(),
        ..FromNode::default()
    };
    state.apply(0, gpu(Some(0)), 1.0, t0 + Duration::from_secs(30));
    let assessment = assess(&state, &XidPolicy::default(), &from_node, t0);
    let reasons: Vec<&str> = assessment
        .problems
        .iter()
        .map(|p| p.reason.as_str())
        .collect();
    assert_eq!(reasons, ["FatalXID", "FatalXID"]);
    assert!(assessment.problems[1]
        .message
        .contains("GPU-gone, not listed by NVML now"));
    assert_eq!(
        assessment.held, from_node.faults,
        "carried on to the next agent"
    );

    state.record_xid(0, 79, None, t0 + Duration::from_secs(40));
    from_node.cleared_before = Some(t0 + Duration::from_secs(35));
    let assessment = assess(&state, &XidPolicy::default(), &from_node, t0);
    assert_eq!(
        assessment.held,
        [("GPU-aaaa".to_string(), [79].into())].into(),
        "only what came after the clearing"
    );
}

#[test]
fn failures_and_a_silent_nvml_are_problems_too() {
    let t0 = Instant::now();
    let mut state = state(t0);
    state.apply(0, DeviceRead::Failed(GpuFailure::Lost), 1.0, t0);
    assert_eq!(reasons(&state, t0), ["GPULost"]);
    state.fail("NVML: Unknown Error".into());
    assert_eq!(reasons(&state, t0)[0], "CollectorUnavailable");
    state.last_round = Some(t0);
    let stalled = assess(
        &state,
        &XidPolicy::default(),
        &FromNode::default(),
        t0 + Duration::from_secs(4),
    )
    .problems;
    assert!(stalled[1].message.contains("within 3 s"), "{stalled:?}");
}

/// A second GPU, at 0000:19:00, with a MIG device carved from it.
fn two_gpus_one_with_mig(t0: Instant) -> GpuState {
    let mut state = state(t0);
    state.apply(
        1,
        DeviceRead::Read {
            identity: GpuIdentity {
                index: 1,
                uuid: "GPU-bbbb".into(),
                pci_bus_id: "00000000:19:00.0".into(),
                ..Default::default()
            },
            reading: Box::new(GpuReading {
                recovery_action: Some(0),
                mig: vec![crate::gpu::MigInstance {
                    uuid: "MIG-cccc".into(),
                    ..Default::default()
                }],
                ..GpuReading::default()
            }),
        },
        1.0,
        t0,
    );
    state
}

fn holder(pod: &str) -> mlnode_core::assignments::Assignment {
    mlnode_core::assignments::Assignment {
        pod: pod.into(),
        namespace: "inference".into(),
        container: "vllm".into(),
    }
}

/// The pods of the kubelet's assignments (pod-resources ids as the NVIDIA device plugin hands
/// them: a GPU's UUID, a MIG device's, `<uuid>::<n>` replicas, a DRA claim's UUID under its
/// driver) resolved to the GPU whose verdict they share; an id NVML does not list is held unlisted.
#[test]
fn each_pod_holds_the_gpu_its_device_is_or_is_carved_from() {
    let state = two_gpus_one_with_mig(Instant::now());
    let resources = vec![
        "nvidia.com/gpu".to_string(),
        "nvidia.com/mig-*".to_string(),
        "gpu.nvidia.com".to_string(),
    ];
    let mut assignments = Assignments::default();
    assignments.assign("nvidia.com/gpu", "GPU-aaaa", || holder("shared-0"));
    assignments.assign_replica("GPU-aaaa", "0", holder("shared-0"));
    assignments.assign_replica("GPU-aaaa", "1", holder("shared-1"));
    assignments.assign("nvidia.com/mig-*", "MIG-cccc", || holder("small-0"));
    assignments.assign("gpu.nvidia.com", "GPU-dddd", || holder("claimed-0"));
    assignments.assign("aws.amazon.com/neuron", "0", || holder("neuron-0"));
    let held = holdings(&state, &assignments, &resources);
    let of = |pod: &str| -> Vec<(String, String, bool)> {
        held[&mlnode_core::health::PodRef {
            namespace: "inference".into(),
            name: pod.into(),
        }]
            .iter()
            .map(|h| (h.device.clone(), h.name.clone(), h.listed))
            .collect()
    };
    let gpu0 = (
        "GPU-aaaa".to_string(),
        "GPU 0 (GPU-aaaa, 00000000:18:00.0)".to_string(),
        true,
    );
    assert_eq!(of("shared-0"), std::slice::from_ref(&gpu0), "one GPU, once");
    assert_eq!(of("shared-1"), [gpu0], "a replica holder holds the GPU");
    assert_eq!(
        of("small-0"),
        [(
            "GPU-bbbb".to_string(),
            "MIG device MIG-cccc of GPU 1 (GPU-bbbb, 00000000:19:00.0)".to_string(),
            true
        )]
    );
    assert_eq!(
        of("claimed-0"),
        [(
            "GPU-dddd".to_string(),
            "GPU-dddd, which NVML does not list".to_string(),
            false
        )]
    );
    assert_eq!(held.len(), 4, "not the Neuron device's holder: {held:?}");
}

/// Every verdict on one GPU is pinned to its UUID, the MIG device's too; a count mismatch is the
/// node's.
#[test]
fn a_gpus_verdicts_are_pinned_to_it_and_the_nodes_to_none() {
    let t0 = Instant::now();
    let mut state = two_gpus_one_with_mig(t0);
    state.record_xid(1, 79, None, t0);
    state.apply(1, DeviceRead::Failed(GpuFailure::Lost), 1.0, t0);
    state.pci = Some(crate::pci::BusScan {
        devices: vec![
            "0000:18:00.0".into(),
            "0000:19:00.0".into(),
            "0000:1a:00.0".into(),
        ],
        ..Default::default()
    });
    let report = assess(&state, &XidPolicy::default(), &FromNode::default(), t0);
    let pinned: Vec<(&str, Option<&str>)> = report
        .problems
        .iter()
        .map(|p| (p.reason.as_str(), p.devices.first().map(String::as_str)))
        .collect();
    assert_eq!(
        pinned,
        [
            ("GPUCountMismatch", None),
            ("GPULost", Some("GPU-bbbb")),
            ("FatalXID", Some("GPU-bbbb")),
        ]
    );
}

/// While the agent lets go of NVML for the driver's reset, the verdict stands pinned to the GPUs
/// being reset: the pods on them are out until NVML is taken back.
#[test]
fn a_release_for_a_reset_is_pinned_to_the_gpus_it_resets() {
    let t0 = Instant::now();
    let mut state = two_gpus_one_with_mig(t0);
    state.released = Some(crate::gpu::state::Released {
        targets: "GPU-bbbb (0000:19:00.0)".into(),
        uuids: vec!["GPU-bbbb".into()],
        reason: "GPUResetRequired",
        why: "the driver asks for a GPU reset".into(),
        until: "once the GPU is reset",
        timeout: None,
    });
    let report = assess(&state, &XidPolicy::default(), &FromNode::default(), t0);
    let released = &report.problems[0];
    assert_eq!(released.reason, "GPUResetRequired");
    assert_eq!(released.devices, ["GPU-bbbb"]);
    assert!(!released.concerns("GPU-aaaa"));
}
