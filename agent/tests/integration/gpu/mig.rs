//! Multi-Instance GPU: each MIG device a set of series of its own, with the pod holding it.

use super::*;

#[test]
fn mig_devices_are_series_of_their_own_with_their_pods() {
    let mut scenario = Scenario::new(2);
    let instance = |uuid: &str, gi: u32, profile: &str, used: u64| {
        json!({"uuid": uuid, "gpu_instance_id": gi, "compute_instance_id": 0, "profile": profile,
               "memory": {"total": 10_737_418_240u64, "used": used, "free": 10_737_418_240u64 - used, "reserved": 0}})
    };
    // GPU instance 7 has GPM counters of its own (nvmlGpmMigSampleGet); instance 2 none.
    let with_gpm = |mut instance: Value| {
        instance["gpm"] = json!({"graphics_util": 40.0, "sm_util": 35.0, "any_tensor_util": 20.0, "dram_bw_util": 10.0});
        instance
    };
    // GPU 0 as a MIG-enabled H100 seen without the mig/monitor capability: two instances.
    scenario.set(
        0,
        "mig",
        json!({"enabled": true, "monitor_capability": false, "instances": [
            with_gpm(instance("MIG-11111111-2222-3333-4444-555555555555", 7, "1g.10gb", 1 << 30)),
            instance("MIG-66666666-7777-8888-9999-000000000000", 2, "3g.40gb", 2 << 30),
        ]}),
    );
    // The device plugin's mixed strategy (a resource per profile) and single strategy
    // (nvidia.com/gpu), both with EKS's ::N replica suffix.
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        testbed::node::pod_resources::response(&[
            (
                "vllm-small-0",
                "nvidia.com/mig-1g.10gb",
                &["MIG-11111111-2222-3333-4444-555555555555::0"],
            ),
            (
                "vllm-mid-0",
                "nvidia.com/gpu",
                &["MIG-66666666-7777-8888-9999-000000000000"],
            ),
        ]),
    );
    let extra = format!(
        "  dcgm_names: true\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let agent = start(&scenario, &extra);
    agent.wait_for("MIG instances with pods", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_mig_memory_used_bytes",
            &[("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
        )
        .is_some()
            && sample(
                m,
                "mlnode_gpu_mig_memory_used_bytes",
                &[("GPU_I_ID", "2"), ("pod", "vllm-mid-0")],
            )
            .is_some()
    });
    let m = agent.metrics();
    let parent = [
        ("gpu", "0"),
        ("UUID", "GPU-00000000-1111-2222-3333-444444444440"),
    ];
    assert_eq!(sample(&m, "mlnode_gpu_mig_mode", &parent), Some(1.0));
    assert_eq!(
        sample(&m, "mlnode_gpu_mig_mode", &[("gpu", "1")]),
        Some(0.0)
    );
    // What NVML refuses on a MIG GPU is absent, not 0; the rest of it is read.
    for absent in [
        "mlnode_gpu_utilization_ratio",
        "mlnode_gpu_memory_used_bytes",
    ] {
        assert_eq!(sample(&m, absent, &[("gpu", "0")]), None, "{absent}");
    }
    assert!(sample(&m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]).is_some());
    assert!(sample(&m, "mlnode_gpu_memory_used_bytes", &[("gpu", "1")]).is_some());
    // dcgm-exporter's per-instance framebuffer series, labelled GPU_I_ID and GPU_I_PROFILE.
    assert_eq!(
        sample(
            &m,
            "DCGM_FI_DEV_FB_USED",
            &[
                parent[0],
                parent[1],
                ("GPU_I_ID", "2"),
                ("GPU_I_PROFILE", "3g.40gb"),
                ("pod", "vllm-mid-0")
            ]
        ),
        Some(2048.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_mig_instance_info",
            &[
                ("GPU_I_ID", "7"),
                ("GPU_I_PROFILE", "1g.10gb"),
                ("mig_uuid", "MIG-11111111-2222-3333-4444-555555555555")
            ]
        ),
        Some(1.0)
    );
    assert!(
        !m.lines()
            .any(|l| l.contains("pod=\"") && !l.contains("GPU_I_ID")),
        "the pods hold MIG devices, not the whole GPU"
    );
    // Per-instance GPM, under its own names and dcgm-exporter's (told apart by GPU_I_ID).
    agent.wait_for(
        "GPU instance 7's GPM ratios",
        Duration::from_secs(10),
        |m| {
            sample(
                m,
                "mlnode_gpu_mig_sm_active_ratio",
                &[("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
            ) == Some(0.35)
        },
    );
    let m = agent.metrics();
    for (ours, dcgm, value) in [
        (
            "mlnode_gpu_mig_graphics_engine_active_ratio",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            0.4,
        ),
        (
            "mlnode_gpu_mig_sm_active_ratio",
            "DCGM_FI_PROF_SM_ACTIVE",
            0.35,
        ),
        (
            "mlnode_gpu_mig_tensor_pipe_active_ratio",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            0.2,
        ),
        (
            "mlnode_gpu_mig_dram_active_ratio",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            0.1,
        ),
    ] {
        let instance7 = [("GPU_I_ID", "7"), ("GPU_I_PROFILE", "1g.10gb")];
        assert_eq!(sample(&m, ours, &instance7), Some(value), "{ours}");
        assert_eq!(sample(&m, dcgm, &instance7), Some(value), "{dcgm}");
        assert_eq!(sample(&m, ours, &[("GPU_I_ID", "2")]), None, "{ours}");
    }
    assert!(agent.log().contains("MIG"), "{}", agent.log());

    // An XID inside instance 7 (NVML's event carries its GPU and compute instance ids).
    scenario.set(
        0,
        "xid_events",
        json!([{"xid": 31, "gpu_instance_id": 7, "compute_instance_id": 0}]),
    );
    agent.wait_for("the instance's XID", Duration::from_secs(10), |m| {
        sample(
            m,
            "mlnode_gpu_mig_xid_errors_total",
            &[
                ("GPU_I_ID", "7"),
                ("GPU_I_PROFILE", "1g.10gb"),
                ("pod", "vllm-small-0"),
                ("xid", "31"),
            ],
        ) == Some(1.0)
    });
    let m = agent.metrics();
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_xid_errors_total",
            &[("gpu", "0"), ("xid", "31")]
        ),
        Some(1.0),
        "the GPU counts it too"
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_mig_xid_errors_total", &[("GPU_I_ID", "2")]),
        None
    );
}
