//! NVML failing as drivers fail: a lost GPU, a library that is not there, a GPU in a failure
//! state, NVML itself failing, an init or a call that blocks.

use super::*;

#[test]
fn a_lost_gpu_is_named_while_the_others_keep_reporting() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    scenario.set(5, "lost", json!(true));
    agent.wait_for("GPU 5 lost", Duration::from_secs(5), |m| {
        sample(
            m,
            "mlnode_gpu_lost",
            &[
                ("gpu", "5"),
                ("UUID", "GPU-00000005-1111-2222-3333-444444444445"),
                ("pci_bus_id", "00000000:57:00.0"),
            ],
        ) == Some(1.0)
    });
    agent.wait_for(
        "no stale readings for a lost GPU",
        Duration::from_secs(5),
        |m| sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "5")]).is_none(),
    );
    let metrics = agent.metrics();
    for i in (0..8).filter(|&i| i != 5) {
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_temperature_celsius",
                &[("gpu", &gpu(i))]
            ),
            Some((40 + i) as f64)
        );
        assert_eq!(
            sample(&metrics, "mlnode_gpu_lost", &[("gpu", &gpu(i))]),
            Some(0.0)
        );
    }
    assert!(agent.log().contains("fell off the bus"));
    scenario.set(5, "lost", json!(false));
    agent.wait_for("GPU 5 back", Duration::from_secs(5), |m| {
        sample(m, "mlnode_gpu_lost", &[("gpu", "5")]) == Some(0.0)
    });
}

#[test]
fn missing_library_leaves_the_agent_running_with_collector_down() {
    let scenario = Scenario::new(8);
    let config = "models: []\nnvml:\n  library: /nonexistent/libnvidia-ml.so.1\n";
    let agent = Agent::start_with_env(config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    // The collector is down from the start; the log line says when start-up gave up, and why.
    agent.wait_for_log("the collector given up", Duration::from_secs(20), |log| {
        log.contains("no NVIDIA GPU collector")
    });
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_collector_up",
            &[("collector", "nvml")]
        ),
        Some(0.0)
    );
    assert_eq!(agent.get("/healthz").0, 200);
    let log = agent.log();
    assert_eq!(
        log.matches("no NVIDIA GPU collector").count(),
        1,
        "one clear log line: {log}"
    );
    assert!(log.contains("/nonexistent/libnvidia-ml.so.1"), "{log}");
}

/// A GPU whose handle call answers RESET_REQUIRED (the state after an XID 48/79-class failure),
/// IRQ_ISSUE or UNKNOWN is flagged with why, its readings are dropped rather than kept as if
/// current, and the others keep reporting; when it can be read again, both come back.
#[test]
fn a_gpu_in_a_failure_state_is_flagged_and_its_readings_dropped() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    let utilization =
        |m: &str, gpu: &str| sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", gpu)]);
    agent.wait_for("8 GPUs read", Duration::from_secs(20), |m| {
        utilization(m, "2").is_some()
    });
    for (code, reason) in [(16, "reset_required"), (11, "irq_issue"), (999, "unknown")] {
        scenario.set(2, "handle_error", json!(code));
        agent.wait_for(reason, Duration::from_secs(10), |m| {
            sample(m, "mlnode_gpu_failure", &[("gpu", "2"), ("reason", reason)]) == Some(1.0)
        });
        let metrics = agent.metrics();
        assert_eq!(
            utilization(&metrics, "2"),
            None,
            "{reason}: no stale reading"
        );
        assert!(
            utilization(&metrics, "3").is_some(),
            "the other GPUs keep reporting"
        );
        assert_eq!(
            sample(&metrics, "mlnode_gpu_lost", &[("gpu", "2")]),
            Some(0.0)
        );
    }
    scenario.set(2, "handle_error", json!(0));
    agent.wait_for("read again", Duration::from_secs(10), |m| {
        utilization(m, "2").is_some() && !m.contains("mlnode_gpu_failure{")
    });
}

/// When NVML stops answering altogether (it cannot count the GPUs), the collector is down and no
/// reading is exported as if current; when it answers again, both come back. One log line each way.
#[test]
fn a_failing_nvml_is_reported_down_and_its_readings_dropped() {
    let scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    let up = |m: &str| sample(m, "mlnode_collector_up", &[("collector", "nvml")]);
    agent.wait_for("8 GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0) && up(m) == Some(1.0)
    });
    // The fake answers NVML_ERROR_UNKNOWN to every call without its scenario.
    let hidden = scenario.path().with_extension("hidden");
    std::fs::rename(scenario.path(), &hidden).unwrap();
    agent.wait_for("collector down", Duration::from_secs(10), |m| {
        up(m) == Some(0.0)
    });
    let metrics = agent.metrics();
    for gone in [
        "mlnode_gpu_count",
        "mlnode_gpu_utilization_ratio",
        "mlnode_gpu_memory_used_bytes",
    ] {
        assert!(
            !metrics.lines().any(|l| l.starts_with(gone)),
            "{gone} still exported:\n{metrics}"
        );
    }
    std::fs::rename(&hidden, scenario.path()).unwrap();
    agent.wait_for("collector up again", Duration::from_secs(10), |m| {
        up(m) == Some(1.0) && sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    let log = agent.log();
    assert_eq!(log.matches("NVML stopped answering").count(), 1, "{log}");
    assert_eq!(log.matches("NVML answers again").count(), 1, "{log}");
}

/// A wedged driver blocks `nvmlInit`: the agent still serves (model caches, /healthz) with the
/// GPU collector down, and SIGTERM still stops it promptly.
#[test]
fn a_blocking_nvml_init_holds_up_nothing_else() {
    let mut scenario = Scenario::new(8);
    scenario.value["init_delay_ms"] = json!(120_000);
    scenario.write();
    let model = testbed::models::PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let config = format!(
        "nvml:\n  library: {:?}\n{}",
        fake_nvml().display().to_string(),
        testbed::agent::model_config("llama", model.root(), &manifest)
    );
    let mut agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for(
        "the cache verified while NVML blocks",
        Duration::from_secs(20),
        |m| sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0),
    );
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_collector_up", &[("collector", "nvml")]),
        Some(0.0)
    );
    assert_eq!(agent.get("/healthz").0, 200);
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(elapsed < EXIT_BOUND, "{elapsed:?}");
}

#[test]
fn a_hanging_nvml_call_drops_the_readings_without_stalling_scrapes() {
    let mut scenario = Scenario::new(2);
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", "1")]).is_some()
    });
    // GPU 1's driver starts blocking every call for 8 s: a round now takes minutes.
    scenario.set(1, "call_delay_ms", json!(8000));
    agent.wait_for("readings dropped", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[]).is_none()
    });
    let started = std::time::Instant::now();
    let m = agent.metrics();
    // A scrape that waited on the driver would take a call's 8 s; the bound leaves a loaded
    // machine room.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "a scrape does not wait on the driver"
    );
    assert!(sample(&m, "mlnode_gpu_readings_age_seconds", &[]).is_some_and(|age| age > 3.0));
    assert_eq!(
        sample(&m, "mlnode_gpu_count", &[]),
        Some(2.0),
        "the GPUs are still named"
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_utilization_ratio", &[("gpu", "0")]),
        None,
        "GPU 0 was read in a round that did not finish: not current either"
    );
    scenario.set(1, "call_delay_ms", json!(0));
    agent.wait_for("readings back", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", "1")]).is_some()
    });
    assert!(
        agent.log().contains("an NVML call was hanging"),
        "{}",
        agent.log()
    );
}
