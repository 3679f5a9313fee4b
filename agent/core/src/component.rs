//! How every subsystem starts, in node_exporter's shape: one contract, so that the daemon is a list
//! of components and adding a collector is writing one. A component is given a [`StartContext`]
//! (the registry, the task set, the shutdown token, and what the components before it offer) and
//! says whether it started. The start log, `mlnode_collector_up` and the list of required
//! components that are not running come from [`start`], never from a component.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use prometheus::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::assignments::SharedAssignments;
use crate::health::{HealthSource, LatestReports};
use crate::metrics::{AgentMetrics, Subsystem};
use crate::pods::SharedPods;
use crate::settings::Toggle;
use crate::state::ModelState;

/// What a component starts with, and what the components started before it offer.
pub struct StartContext {
    pub node_name: String,
    pub registry: Registry,
    pub up: AgentMetrics,
    /// Every task a component spawns; the daemon waits for them at shutdown.
    pub tasks: JoinSet<()>,
    /// Cancelled on SIGTERM or SIGINT; a component's tasks stop at their next await.
    pub shutdown: CancellationToken,
    /// The models kept verified, for the server and the readiness gates.
    pub models: Vec<Arc<ModelState>>,
    /// Which container holds which device: written by the kubelet poller, read by collectors.
    pub assignments: SharedAssignments,
    /// The node's pods by UID: written by the node's pod watch, read by whoever names a pod.
    pub pods: SharedPods,
    /// The devices the running collectors label by their holder, for the kubelet poller.
    pub devices: LabelledDevices,
    /// The running accelerator collectors' health, for the readiness gate.
    pub health: Vec<Box<dyn HealthSource>>,
    /// Accelerator collectors the operator required (`enabled: true`) that are not running, in
    /// words, for the accelerator gate.
    pub required_missing: Vec<String>,
    /// The collectors' reports as the readiness controller last took them, for the pods' gates.
    pub latest_reports: LatestReports,
}

/// The extended resources (and DRA drivers) whose devices a running collector labels by the
/// container holding them: what the kubelet's pod-resources answers are kept for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelledDevices {
    /// Resource names (`nvidia.com/gpu`, `aws.amazon.com/neuroncore`; a trailing `*` matches by
    /// prefix).
    pub resources: Vec<String>,
    /// DRA drivers whose claimed devices are named through their ResourceSlices.
    pub dra_drivers: Vec<String>,
}

impl StartContext {
    pub fn new(node_name: &str, registry: &Registry, up: &AgentMetrics) -> StartContext {
        StartContext {
            node_name: node_name.to_string(),
            registry: registry.clone(),
            up: up.clone(),
            tasks: JoinSet::new(),
            shutdown: CancellationToken::new(),
            models: Vec::new(),
            assignments: SharedAssignments::default(),
            pods: Default::default(),
            devices: LabelledDevices::default(),
            health: Vec::new(),
            required_missing: Vec::new(),
            latest_reports: LatestReports::new(None),
        }
    }
}

/// A subsystem the agent runs: a collector, a controller, a poller.
pub trait Component: Send {
    /// What it is, for the start log and `mlnode_collector_up`.
    fn about(&self) -> About;
    /// Registers its series and spawns its tasks on the context, or says why it does not run.
    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>>;
}

/// What a component is, to the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct About {
    /// What `mlnode_collector_up{collector}` reports it as; its config section has the same name.
    /// None for a helper with no series of its own.
    pub subsystem: Option<Subsystem>,
    /// What it is, for the log ("NVIDIA GPU collector").
    pub what: &'static str,
    /// Whether the operator required it (`true`), left it to the node (`auto`) or turned it off.
    pub enabled: Toggle,
    /// An accelerator collector, whose absence where it is required the accelerator gate reports.
    pub judges_devices: bool,
}

impl About {
    /// An accelerator collector.
    pub fn collector(subsystem: Subsystem, what: &'static str, enabled: Toggle) -> About {
        About {
            judges_devices: true,
            ..About::part(subsystem, what, enabled)
        }
    }

    /// Any other subsystem with a `mlnode_collector_up` series.
    pub fn part(subsystem: Subsystem, what: &'static str, enabled: Toggle) -> About {
        About {
            subsystem: Some(subsystem),
            what,
            enabled,
            judges_devices: false,
        }
    }

    /// A helper of the others, with no series of its own, that runs where it has work.
    pub fn helper(what: &'static str) -> About {
        About {
            subsystem: None,
            what,
            enabled: Toggle::Auto,
            judges_devices: false,
        }
    }
}

/// A component that runs, and what the start log says of it.
#[derive(Debug)]
pub struct Started {
    /// Facts for the log line ("8 GPUs from libnvidia-ml.so.1").
    pub detail: String,
    /// Whether `mlnode_collector_up` is 1 from now on (it works once started), or the component's
    /// task says when it works (a sampler that knows whether the driver still answers, a
    /// controller that has synced with the API server).
    pub up: Up,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Up {
    Now,
    WhenItSaysSo,
}

impl Started {
    pub fn up(detail: impl Into<String>) -> Started {
        Started {
            detail: detail.into(),
            up: Up::Now,
        }
    }

    pub fn reporting(detail: impl Into<String>) -> Started {
        Started {
            detail: detail.into(),
            up: Up::WhenItSaysSo,
        }
    }
}

/// Why a component does not run.
#[derive(Debug, thiserror::Error)]
pub enum NotStarted {
    /// Turned off, or what it needs is not on this node (no driver, no cluster): the agent runs
    /// on without it.
    #[error("{0}")]
    Absent(String),
    /// Its series cannot be registered: a defect, and the agent stops.
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Starts each component in order, saying in the log and in `mlnode_collector_up` which run.
/// A component that is not there is an error in the log where the operator required it
/// (`enabled: true`) and information where it was optional. Only a metrics defect stops the
/// start.
pub async fn start(
    components: Vec<Box<dyn Component>>,
    cx: &mut StartContext,
) -> Result<(), prometheus::Error> {
    for component in components {
        let About {
            subsystem,
            what,
            enabled,
            judges_devices,
        } = component.about();
        match component.start(cx).await {
            Ok(started) => {
                tracing::info!(detail = %started.detail, "{what} started");
                if let (Some(subsystem), Up::Now) = (subsystem, started.up) {
                    cx.up.set_up(subsystem, true);
                }
            }
            Err(NotStarted::Metrics(e)) => return Err(e),
            Err(NotStarted::Absent(reason)) => {
                let section = subsystem.map_or("", Subsystem::as_str);
                if enabled == Toggle::On {
                    tracing::error!(%reason, "no {what} ({section}.enabled: true)");
                    if judges_devices {
                        cx.required_missing.push(format!(
                            "{section} collector required ({section}.enabled: true) but not running"
                        ));
                    }
                } else {
                    tracing::info!(%reason, "no {what}");
                }
                if let Some(subsystem) = subsystem {
                    cx.up.set_up(subsystem, false);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// A component that starts with `outcome`, and offers a device resource when it does.
    struct Fake {
        subsystem: Subsystem,
        enabled: Toggle,
        outcome: fn() -> Result<Started, NotStarted>,
    }

    impl Component for Fake {
        fn about(&self) -> About {
            match self.subsystem {
                Subsystem::Nvml => About::collector(self.subsystem, "fake collector", self.enabled),
                _ => About::part(self.subsystem, "fake part", self.enabled),
            }
        }

        fn start<'a>(
            self: Box<Self>,
            cx: &'a mut StartContext,
        ) -> BoxFuture<'a, Result<Started, NotStarted>> {
            async move {
                let started = (self.outcome)()?;
                cx.devices.resources.push(self.subsystem.as_str().into());
                Ok(started)
            }
            .boxed()
        }
    }

    fn up(registry: &Registry) -> Vec<(String, f64)> {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "mlnode_collector_up")
            .flat_map(|f| f.get_metric().iter())
            .map(|m| {
                (
                    m.get_label()[0].value().to_string(),
                    m.get_gauge().get_value(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn the_contract_says_which_run_and_which_required_ones_do_not() {
        let registry = Registry::new();
        let build = crate::metrics::Build {
            version: "0",
            revision: "test",
        };
        let agent = AgentMetrics::register(&registry, build).unwrap();
        for subsystem in Subsystem::ALL {
            agent.set_up(subsystem, false);
        }
        let mut cx = StartContext::new("node-1", &registry, &agent);
        let components: Vec<Box<dyn Component>> = vec![
            Box::new(Fake {
                subsystem: Subsystem::Nvml,
                enabled: Toggle::On,
                outcome: || Err(NotStarted::Absent("no driver".into())),
            }),
            Box::new(Fake {
                subsystem: Subsystem::Neuron,
                enabled: Toggle::Auto,
                outcome: || Ok(Started::up("2 devices")),
            }),
            Box::new(Fake {
                subsystem: Subsystem::Readiness,
                enabled: Toggle::Auto,
                outcome: || Ok(Started::reporting("synced later")),
            }),
            Box::new(Fake {
                subsystem: Subsystem::Startup,
                enabled: Toggle::On,
                outcome: || Err(NotStarted::Absent("no cluster".into())),
            }),
        ];
        start(components, &mut cx).await.unwrap();
        let up = up(&registry);
        let value = |name: &str| up.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        assert_eq!(value("nvml"), Some(0.0));
        assert_eq!(value("neuron"), Some(1.0));
        assert_eq!(
            value("readiness"),
            Some(0.0),
            "its own task says when it works"
        );
        assert_eq!(value("startup"), Some(0.0));
        assert_eq!(
            cx.required_missing,
            ["nvml collector required (nvml.enabled: true) but not running"],
            "only a required accelerator collector is missing for the accelerator gate"
        );
        assert_eq!(cx.devices.resources, ["neuron", "readiness"]);
    }

    #[tokio::test]
    async fn a_metrics_defect_stops_the_start() {
        let registry = Registry::new();
        let build = crate::metrics::Build {
            version: "0",
            revision: "test",
        };
        let agent = AgentMetrics::register(&registry, build).unwrap();
        let mut cx = StartContext::new("node-1", &registry, &agent);
        let components: Vec<Box<dyn Component>> = vec![Box::new(Fake {
            subsystem: Subsystem::Neuron,
            enabled: Toggle::Auto,
            outcome: || Err(NotStarted::Metrics(prometheus::Error::AlreadyReg)),
        })];
        assert!(start(components, &mut cx).await.is_err());
    }
}
