//! The RDMA collector: EFA and InfiniBand devices from the RDMA core's sysfs class.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::rdma::settings::RdmaSettings;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;

pub struct Rdma {
    pub settings: RdmaSettings,
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
            let devices =
                crate::rdma::start(&self.settings, &cx.registry).map_err(NotStarted::Absent)?;
            Ok(Started::up(format!(
                "{devices} devices in {}",
                self.settings.sysfs_root.display()
            )))
        }
        .boxed()
    }
}
