//! The kernel log source: the node's journal, read on a thread of its own (opt-in,
//! `kernel_log.enabled`). Its facts go to the GPU and Neuron verdicts, which the daemon hands
//! the same [`LogFacts`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::kernel_log::facts::LogFacts;
use crate::kernel_log::journal::{self, KernelLogMetrics};
use crate::kernel_log::settings::KernelLogSettings;
use crate::shared::Shared;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};

pub struct KernelLog {
    pub settings: KernelLogSettings,
    pub facts: Shared<LogFacts>,
}

impl Component for KernelLog {
    fn about(&self) -> About {
        About::helper("kernel log reader")
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            if !self.settings.enabled {
                return Err(NotStarted::Absent(
                    "disabled (kernel_log.enabled: false)".into(),
                ));
            }
            let metrics = KernelLogMetrics::register(&cx.registry)?;
            let stop = Arc::new(AtomicBool::new(false));
            let detail = format!("journal in {:?}", self.settings.journal_dirs);
            journal::spawn(self.settings, self.facts, metrics, stop.clone())
                .map_err(|e| NotStarted::Absent(format!("cannot start its thread: {e}")))?;
            // The reader sees the stop within a poll interval; nothing waits for it.
            let shutdown = cx.shutdown.child_token();
            cx.tasks.spawn(async move {
                shutdown.cancelled().await;
                stop.store(true, Ordering::Relaxed);
            });
            Ok(Started::up(detail))
        }
        .boxed()
    }
}
