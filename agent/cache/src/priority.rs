//! How hard a verification may use the node. While the node is held for this agent (nothing serves
//! from it yet) hashing runs at full speed; otherwise in the kernel's idle CPU class (`SCHED_IDLE`)
//! and idle I/O class (`IOPRIO_CLASS_IDLE`), so it only gets the cycles and disk time inference
//! leaves over. A thread that drops to the idle classes cannot come back without `CAP_SYS_NICE`,
//! which the agent does not have, so each priority has its own pool of hashing threads.

use std::sync::Arc;

use super::hasher::Control;
use super::settings::PrioritySetting;
use super::state::Workload;
use super::throttle::Throttle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    Normal,
    Idle,
}

impl Priority {
    pub const ALL: [Priority; 2] = [Priority::Normal, Priority::Idle];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::Idle => "idle",
        }
    }
}

/// What is known of the node and the model when a verification starts.
#[derive(Clone, Copy, Debug)]
pub struct Situation {
    /// The readiness controller last saw this agent's startup taint on the node.
    pub node_tainted: bool,
    /// What the kubelet says of the node's pods.
    pub workload: Workload,
    /// A server has opened this model's weight files since the agent started.
    pub served: bool,
}

/// `auto` runs at full speed only while the agent knows nothing serves from the model: the node
/// holds its taint, or the kubelet says no pod holds an accelerator and nobody has opened the
/// weights. Where it cannot know, it yields: after a restart (every node, in a rollout) the opens
/// that happened before the agent started are unseen, so "nobody opened the weights" alone is no
/// evidence that nothing serves.
pub fn decide(setting: PrioritySetting, situation: Situation) -> Priority {
    match setting {
        PrioritySetting::Normal => Priority::Normal,
        PrioritySetting::Idle => Priority::Idle,
        PrioritySetting::Auto
            if situation.node_tainted
                || (situation.workload == Workload::NoAcceleratorPods && !situation.served) =>
        {
            Priority::Normal
        }
        PrioritySetting::Auto => Priority::Idle,
    }
}

/// `serve`'s hashing threads: one pool per priority, `threads` each (0: one per CPU the process
/// may use, which follows the container's CPU quota), and the read rate they all share.
pub struct Hashers {
    normal: Arc<rayon::ThreadPool>,
    idle: Arc<rayon::ThreadPool>,
    throttle: Option<Arc<Throttle>>,
}

impl Hashers {
    pub fn new(
        threads: usize,
        max_bytes_per_second: Option<u64>,
    ) -> Result<Hashers, rayon::ThreadPoolBuildError> {
        let normal = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hash-{i}"))
            .build()?;
        let idle = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hash-idle-{i}"))
            .start_handler(|_| {
                if let Err(e) = lower_current_thread() {
                    tracing::warn!(error = %e, "cannot lower a hashing thread to the idle classes; it hashes at normal priority");
                }
            })
            .build()?;
        Ok(Hashers {
            normal: Arc::new(normal),
            idle: Arc::new(idle),
            throttle: max_bytes_per_second.map(|rate| Arc::new(Throttle::new(rate))),
        })
    }

    pub fn pool(&self, priority: Priority) -> Arc<rayon::ThreadPool> {
        match priority {
            Priority::Normal => self.normal.clone(),
            Priority::Idle => self.idle.clone(),
        }
    }

    /// The control of one verification in `serve`.
    pub fn control(&self) -> Control {
        Control::for_serve(self.throttle.clone())
    }
}

/// `ioprio_set(2)` constants from the kernel's `include/uapi/linux/ioprio.h`.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_IDLE: libc::c_int = 3;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;

/// Puts the calling thread in the idle CPU and I/O classes. Lowering needs no privilege.
pub fn lower_current_thread() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for SCHED_IDLE.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ioprio_set takes three integers; who 0 is the calling thread.
    let set = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_full_speed_only_while_nothing_can_be_serving() {
        use Workload::*;
        let auto = |node_tainted, workload, served| {
            decide(
                PrioritySetting::Auto,
                Situation {
                    node_tainted,
                    workload,
                    served,
                },
            )
        };
        assert_eq!(
            auto(true, AcceleratorPods, true),
            Priority::Normal,
            "taint held"
        );
        assert_eq!(auto(true, Unknown, false), Priority::Normal, "taint held");
        assert_eq!(
            auto(false, NoAcceleratorPods, false),
            Priority::Normal,
            "the kubelet says nothing holds a device, nobody opened the weights"
        );
        assert_eq!(
            auto(false, NoAcceleratorPods, true),
            Priority::Idle,
            "but someone opened the weights"
        );
        assert_eq!(
            auto(false, AcceleratorPods, false),
            Priority::Idle,
            "a restarted agent on a serving node: the opens happened before it started"
        );
        assert_eq!(
            auto(false, Unknown, false),
            Priority::Idle,
            "no kubelet answer: it cannot know"
        );
        let any = Situation {
            node_tainted: true,
            workload: NoAcceleratorPods,
            served: false,
        };
        assert_eq!(decide(PrioritySetting::Idle, any), Priority::Idle);
        let serving = Situation {
            node_tainted: false,
            workload: AcceleratorPods,
            served: true,
        };
        assert_eq!(decide(PrioritySetting::Normal, serving), Priority::Normal);
    }

    #[test]
    fn the_idle_pool_hashes_in_the_idle_classes_and_the_normal_pool_does_not() {
        let hashers = Hashers::new(1, None).unwrap();
        let policy = |priority| {
            hashers.pool(priority).install(|| {
                // SAFETY: querying the calling thread's policy (pid 0: the caller).
                let sched = unsafe { libc::sched_getscheduler(0) };
                // SAFETY: ioprio_get takes two integers; who 0 is the calling thread.
                let io = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
                (sched, io >> IOPRIO_CLASS_SHIFT)
            })
        };
        assert_eq!(policy(Priority::Idle), (libc::SCHED_IDLE, 3));
        let (sched, io_class) = policy(Priority::Normal);
        assert_eq!(sched, libc::SCHED_OTHER);
        assert_ne!(io_class, 3);
    }
}
