//! The model monitors: one task per configured model, keeping its cache verified.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::cache::monitor::{self, Monitor};
use crate::cache::settings::{ModelConfig, VerifySettings};
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;
use mlnode_core::settings::Toggle;
use mlnode_core::state::{ModelState, Readiness};

/// Started first, before the server: the server and the readiness gates read the models' state.
pub struct Models {
    pub models: Vec<ModelConfig>,
    pub settings: VerifySettings,
    /// The hashing pools, the file watch and what the monitors share with the rest.
    pub shared: monitor::Shared,
}

impl Component for Models {
    fn about(&self) -> About {
        About::part(
            Subsystem::ModelCache,
            "model cache verification",
            Toggle::On,
        )
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            // A restarted agent may find what a previous one verified; until it has looked, the
            // node's and the pods' verdicts stand.
            let first = if self.settings.trust_unchanged_after_restart {
                Readiness::Resuming
            } else {
                Readiness::Starting
            };
            for model in self.models {
                let state = Arc::new(ModelState::new(&model.name, first.clone()));
                cx.models.push(state.clone());
                let monitor =
                    Monitor::new(model, self.settings.clone(), self.shared.clone(), state);
                cx.tasks.spawn(monitor.run(cx.shutdown.child_token()));
            }
            Ok(Started::up(format!("{} models", cx.models.len())))
        }
        .boxed()
    }
}
