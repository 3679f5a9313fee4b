//! The RDMA collector: EFA and InfiniBand devices from the RDMA core's sysfs class.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::rdma::collector::Holders;
use crate::rdma::health::RdmaHealth;
use crate::rdma::settings::RdmaSettings;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;
use mlnode_core::settings::Toggle;

pub struct Rdma {
    pub settings: RdmaSettings,
    /// `kubelet.rdma_resource_names`: one device per id.
    pub resources: Vec<String>,
    /// `kubelet.rdma_shared_resource_names`: every device to each holder.
    pub shared_resources: Vec<String>,
}

impl Component for Rdma {
    fn about(&self) -> About {
        About::collector(Subsystem::Rdma, "RDMA collector", self.settings.enabled)
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let holders =
                (!self.resources.is_empty() || !self.shared_resources.is_empty()).then(|| {
                    Holders {
                        assignments: cx.assignments.clone(),
                        exclusive: self.resources.clone(),
                        shared: self.shared_resources.clone(),
                    }
                });
            let started = crate::rdma::start(&self.settings, holders, &cx.registry);
            if started.is_ok() {
                cx.devices.resources.extend(self.resources.iter().cloned());
                cx.devices
                    .resources
                    .extend(self.shared_resources.iter().cloned());
            }
            // A node that must have EFA devices is judged even when it has none at all.
            let must_have =
                self.settings.enabled != Toggle::Off && self.settings.expected_efa_devices > 0;
            if started.is_ok() || must_have {
                cx.health
                    .push(Box::new(RdmaHealth::new(self.settings.clone())));
            }
            let devices = started.map_err(NotStarted::Absent)?;
            Ok(Started::up(format!(
                "{devices} devices in {}",
                self.settings.sysfs_root.display()
            )))
        }
        .boxed()
    }
}
