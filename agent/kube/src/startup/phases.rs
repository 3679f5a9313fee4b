//! Splitting one pod startup into phases. Each phase has one source, and a phase whose source is
//! missing is absent, never a made-up 0; the total (creation to Ready) is always known.
//!
//! * `scheduling`: `metadata.creationTimestamp` to the `PodScheduled` condition's transition;
//! * `image_pull`: the durations kubelet's `Pulled` events report, summed over the pod's containers
//!   (init containers included); a `Container image "x" already present on machine` event is a
//!   cache hit of 0 s, and is counted as one;
//! * `container_start`: the end of the main container's pull (its `Pulled` event) to its
//!   `state.running.startedAt`;
//! * `model_load`: the main container's start to the last open of a weight file of the pod's model
//!   (from file-access events on the cache);
//! * `readiness`: the end of the model load to the `Ready` condition's transition.
//!
//! Beside them, not one of them (it overlaps the init containers or the server's own start):
//! `model_download`, the model's weights written into its cache during the startup
//! ([`ModelDownload`]). And `image_pull` split into `image_transfer` and `image_unpack`, where
//! containerd's content store is read ([`super::image_pull`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod};
use serde::Serialize;

use super::image_pull::PodSplit;
use super::lazy::split::{LazyLoad, Stretch};

/// Timestamps in the API are whole seconds: a step that looks a second negative is clock rounding
/// and counts as 0; anything more negative is clock skew, and the phase is unknown.
const SKEW_TOLERANCE: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Scheduling,
    ImagePull,
    ContainerStart,
    ModelLoad,
    Readiness,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Scheduling,
        Phase::ImagePull,
        Phase::ContainerStart,
        Phase::ModelLoad,
        Phase::Readiness,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Scheduling => "scheduling",
            Phase::ImagePull => "image_pull",
            Phase::ContainerStart => "container_start",
            Phase::ModelLoad => "model_load",
            Phase::Readiness => "readiness",
        }
    }
}

/// What one `Pulled` event says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pull {
    pub image: String,
    /// The pull itself, as kubelet measured it; 0 for a cache hit.
    pub seconds: f64,
    /// Newer kubelets also report the time including waiting for the serialized puller.
    pub including_waiting_seconds: Option<f64>,
    /// Newer kubelets report the image size.
    pub size_bytes: Option<u64>,
    pub cache_hit: bool,
    /// When the `Pulled` event was recorded (whole seconds): the pull had just ended.
    #[serde(skip)]
    pub pulled_at: Option<f64>,
    /// The container the image was pulled for, as the event names it
    /// (`spec.containers{name}`, `spec.initContainers{name}`).
    #[serde(skip)]
    pub field_path: Option<String>,
}

/// One finished startup.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Startup {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub model_name: Option<String>,
    pub phases: BTreeMap<Phase, f64>,
    pub total_seconds: f64,
    pub pulls: Vec<Pull>,
    /// Main-container restarts before Ready.
    pub restarts: i32,
    /// When each phase ran: what happened during a phase (the snapshotter's fetching) is split by
    /// these.
    #[serde(skip)]
    pub intervals: Intervals,
    /// Where a lazily loaded image's bytes were fetched, where the snapshotter is read
    /// (`startup.soci`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lazy_load: Option<LazyLoad>,
    /// The model's weights written into its cache during the startup (by an init container, or
    /// the server), where they were: a stretch beside the phases, not one of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_download: Option<ModelDownload>,
    /// The pulls split into transfer and unpack, or why not; only where containerd's content
    /// store is read (`startup.content_store`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_split: Option<PodSplit>,
}

/// The model's weights written into its cache during one startup: from the first write to the
/// last weight file completed (closed after writing), by the agent's clock, each file once at its
/// last completion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelDownload {
    pub seconds: f64,
    pub bytes: u64,
    pub files: usize,
    /// None for a stretch of 0 s (one small file written at once).
    pub bytes_per_second: Option<f64>,
}

impl ModelDownload {
    pub fn of(download: &mlnode_core::loads::Download) -> ModelDownload {
        let seconds = (download.last_completed - download.first_write).max(0.0);
        ModelDownload {
            seconds,
            bytes: download.bytes,
            files: download.files,
            bytes_per_second: (seconds > 0.0).then(|| download.bytes as f64 / seconds),
        }
    }
}

/// When the measured phases began and ended (Unix seconds), and the main container's start to
/// Ready, which is known where the model load is not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Intervals {
    pub phases: BTreeMap<Phase, (f64, f64)>,
    pub start_to_ready: Option<(f64, f64)>,
}

impl Intervals {
    /// The stretches of the startup that fetch figures are given for, with their intervals: its measured phases, and the main
    /// container's start to Ready where the model load is unknown.
    pub fn stretches(&self) -> Vec<(Stretch, (f64, f64))> {
        let mut stretches: Vec<(Stretch, (f64, f64))> = [
            (Stretch::ImagePull, Phase::ImagePull),
            (Stretch::ContainerStart, Phase::ContainerStart),
            (Stretch::ModelLoad, Phase::ModelLoad),
            (Stretch::Readiness, Phase::Readiness),
        ]
        .into_iter()
        .filter_map(|(stretch, phase)| Some((stretch, *self.phases.get(&phase)?)))
        .collect();
        if !self.phases.contains_key(&Phase::ModelLoad) {
            if let Some(start_to_ready) = self.start_to_ready {
                stretches.push((Stretch::StartToReady, start_to_ready));
            }
        }
        stretches
    }
}

/// Parses a Go `time.Duration` string as kubelet prints it: `1.234s`, `850ms`, `2m3.5s`,
/// `1h0m0.5s`, `1.5µs`.
pub fn parse_go_duration(text: &str) -> Option<f64> {
    let mut rest = text.trim();
    if rest == "0" || rest == "0s" {
        return Some(0.0);
    }
    let mut total = 0.0;
    let mut parsed_any = false;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let (scale, unit_len) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("μs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .iter()
        .find(|(unit, _)| rest.starts_with(unit))
        .map(|(unit, scale)| (*scale, unit.len()))?;
        total += number * scale;
        rest = &rest[unit_len..];
        parsed_any = true;
    }
    // A Go time.Duration is an int64 of nanoseconds: anything longer (or not finite) is not one
    // kubelet printed, and an infinite observation would poison every histogram sum.
    (parsed_any && total.is_finite() && total <= GO_DURATION_MAX_SECONDS).then_some(total)
}

/// `math.MaxInt64` nanoseconds, about 292 years.
const GO_DURATION_MAX_SECONDS: f64 = 9_223_372_036.854_775;

/// Reads a `Pulled` event's message.
pub fn parse_pulled(message: &str) -> Option<Pull> {
    let image = message.split('"').nth(1)?.to_string();
    if message.starts_with("Container image") && message.contains("already present on machine") {
        return Some(Pull {
            image,
            seconds: 0.0,
            including_waiting_seconds: None,
            size_bytes: None,
            cache_hit: true,
            pulled_at: None,
            field_path: None,
        });
    }
    // Successfully pulled image "x" in 1.234s (1.5s including waiting). Image size: 123 bytes.
    let after = message.split_once("\" in ")?.1;
    let (pull, rest) = after
        .split_once(' ')
        .unwrap_or((after.trim_end_matches('.'), ""));
    let seconds = parse_go_duration(pull.trim_end_matches('.'))?;
    let including_waiting_seconds = rest
        .strip_prefix('(')
        .and_then(|r| r.split_once(" including waiting)"))
        .and_then(|(d, _)| parse_go_duration(d));
    let size_bytes = message
        .split_once("Image size: ")
        .and_then(|(_, s)| s.split_whitespace().next())
        .and_then(|n| n.parse().ok());
    Some(Pull {
        image,
        seconds,
        including_waiting_seconds,
        size_bytes,
        cache_hit: false,
        pulled_at: None,
        field_path: None,
    })
}

/// An API time as Unix seconds.
pub fn seconds_of(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    time.0.as_millisecond() as f64 / 1000.0
}

/// When an event happened: `eventTime`, else `lastTimestamp`, else `firstTimestamp`.
fn event_time(event: &Event) -> Option<f64> {
    event
        .event_time
        .as_ref()
        .map(|t| t.0.as_millisecond() as f64 / 1000.0)
        .or_else(|| event.last_timestamp.as_ref().map(seconds_of))
        .or_else(|| event.first_timestamp.as_ref().map(seconds_of))
}

/// When the condition `kind` last turned True; None while it is not True.
pub fn condition_time(pod: &Pod, kind: &str) -> Option<f64> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(seconds_of)
}

/// The container whose start, model load and readiness the phases follow: the one named by the
/// `mlnode.dev/container` annotation, else the first.
pub fn main_container(pod: &Pod) -> Option<String> {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("mlnode.dev/container"))
        .cloned();
    annotated.or_else(|| {
        pod.spec
            .as_ref()?
            .containers
            .first()
            .map(|c| c.name.clone())
    })
}

/// When the pod turned Ready. The condition's `lastTransitionTime` is whole seconds, rounded down:
/// the transition happened within the second after it, and no later than the agent saw it. A
/// sighting within that second narrows it to the watch's delay (milliseconds) rather than up to
/// a second early; one later (a relist after an outage) or earlier (clock skew) says nothing.
fn ready_time(transition: f64, seen: Option<f64>) -> f64 {
    seen.filter(|seen| (transition..transition + 1.0).contains(seen))
        .unwrap_or(transition)
}

/// `end - start`, unknown (None) when either end is missing or the clocks disagree by more than
/// rounding.
fn span(start: Option<f64>, end: Option<f64>) -> Option<f64> {
    let d = end? - start?;
    (d >= -SKEW_TOLERANCE).then_some(d.max(0.0))
}

/// The startup of a pod that is Ready, or None while it is not. `model_load_end` is the time of
/// the last weight-file open seen after the main container started; `ready_seen`, when the agent
/// saw the pod turn Ready as it happened (its pod watch's event).
pub fn compute(
    pod: &Pod,
    events: &[Event],
    model_name: Option<String>,
    model_load_end: Option<f64>,
    ready_seen: Option<f64>,
) -> Option<Startup> {
    let ready = ready_time(condition_time(pod, "Ready")?, ready_seen);
    let created = pod.metadata.creation_timestamp.as_ref().map(seconds_of)?;
    let main = main_container(pod)?;
    let status = pod.status.as_ref()?;
    let main_status = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == main)?;
    let started = main_status
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(seconds_of);

    // After a restart the startup begins when the previous container exited; only what happened
    // since counts (the pull, if any, of the new container's image).
    let restarted_at = (main_status.restart_count > 0)
        .then(|| {
            main_status
                .last_state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(seconds_of)
        })
        .flatten();
    let begin = restarted_at.unwrap_or(created);

    let mut pulls = Vec::new();
    let mut main_pull_end = None;
    let mut sorted: Vec<&Event> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Pulled"))
        .filter(|e| {
            restarted_at.is_none_or(|r| event_time(e).is_some_and(|t| t >= r - SKEW_TOLERANCE))
        })
        .collect();
    sorted.sort_by(|a, b| {
        event_time(a)
            .partial_cmp(&event_time(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for event in sorted {
        let Some(mut pull) = event.message.as_deref().and_then(parse_pulled) else {
            continue;
        };
        pull.pulled_at = event_time(event);
        pull.field_path = event.involved_object.field_path.clone();
        if pull.field_path.as_deref() == Some(&format!("spec.containers{{{main}}}")) {
            main_pull_end = event_time(event);
        }
        pulls.push(pull);
    }

    let mut intervals = Intervals::default();
    let mut put = |phase, from: Option<f64>, until: Option<f64>| {
        if span(from, until).is_some() {
            intervals
                .phases
                .insert(phase, (from.unwrap_or_default(), until.unwrap_or_default()));
        }
    };
    let scheduled = condition_time(pod, "PodScheduled");
    if restarted_at.is_none() {
        put(Phase::Scheduling, Some(created), scheduled);
    }
    // The pulls run from the pod's placing (or the restart) to the main container's image pulled.
    put(
        Phase::ImagePull,
        restarted_at.or(scheduled).or(Some(created)),
        main_pull_end,
    );
    put(
        Phase::ContainerStart,
        main_pull_end.or(restarted_at),
        started,
    );
    let load_end = model_load_end.filter(|end| {
        started.is_some_and(|s| *end >= s - SKEW_TOLERANCE) && *end <= ready + SKEW_TOLERANCE
    });
    put(Phase::ModelLoad, started, load_end);
    put(Phase::Readiness, load_end, Some(ready));
    intervals.start_to_ready = started
        .filter(|s| span(Some(*s), Some(ready)).is_some())
        .map(|s| (s, ready));

    let mut phases: BTreeMap<Phase, f64> = intervals
        .phases
        .iter()
        .map(|(phase, (from, until))| (*phase, (until - from).max(0.0)))
        .collect();
    // The image pull is what the kubelet measured, summed over the pod's pulls; without a
    // `Pulled` event it is unknown, whatever the interval.
    phases.remove(&Phase::ImagePull);
    if !pulls.is_empty() {
        phases.insert(Phase::ImagePull, pulls.iter().map(|p| p.seconds).sum());
    }

    Some(Startup {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        model_name,
        phases,
        total_seconds: (ready - begin).max(0.0),
        pulls,
        restarts: main_status.restart_count,
        intervals,
        lazy_load: None,
        model_download: None,
        image_pull_split: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sighting_within_the_second_of_readys_transition_narrows_it() {
        assert_eq!(ready_time(100.0, Some(100.35)), 100.35);
        assert_eq!(ready_time(100.0, None), 100.0);
        assert_eq!(
            ready_time(100.0, Some(130.0)),
            100.0,
            "seen after a relist: late"
        );
        assert_eq!(ready_time(100.0, Some(99.5)), 100.0, "skewed clocks");
        assert_eq!(ready_time(100.0, Some(101.0)), 100.0, "past the second");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1.234s"), Some(1.234));
        assert_eq!(parse_go_duration("850ms"), Some(0.85));
        assert_eq!(parse_go_duration("2m3.5s"), Some(123.5));
        assert_eq!(parse_go_duration("1h0m0.5s"), Some(3600.5));
        assert!((parse_go_duration("1.5µs").unwrap() - 1.5e-6).abs() < 1e-12);
        assert_eq!(parse_go_duration("0s"), Some(0.0));
        assert_eq!(parse_go_duration("fast"), None);
        assert_eq!(parse_go_duration("12"), None);
        // Found by the fuzz harness: 400 digits parse to infinity; no Go duration is that long.
        assert_eq!(parse_go_duration(&format!("{}s", "9".repeat(400))), None);
        assert_eq!(parse_go_duration("2562048h"), None, "past math.MaxInt64 ns");
        assert!(parse_go_duration("2562047h").is_some());
    }

    #[test]
    fn pulled_messages_of_every_kubelet_generation() {
        let new = parse_pulled("Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 1m32.415s (2m5.1s including waiting). Image size: 10234567890 bytes.").unwrap();
        assert!((new.seconds - 92.415).abs() < 1e-9, "{}", new.seconds);
        assert_eq!(
            (new.including_waiting_seconds, new.size_bytes, new.cache_hit),
            (Some(125.1), Some(10234567890), false)
        );
        assert_eq!(new.image, "vllm/vllm-openai:v0.11.0");
        let mid = parse_pulled(
            "Successfully pulled image \"busybox:1.36\" in 850ms (850ms including waiting)",
        )
        .unwrap();
        assert_eq!((mid.seconds, mid.size_bytes), (0.85, None));
        let old = parse_pulled("Successfully pulled image \"nginx:1.25\" in 3.2s").unwrap();
        assert_eq!((old.seconds, old.including_waiting_seconds), (3.2, None));
        let hit =
            parse_pulled("Container image \"vllm/vllm-openai:v0.11.0\" already present on machine")
                .unwrap();
        assert!(hit.cache_hit && hit.seconds == 0.0);
        assert_eq!(parse_pulled("Pulling image \"x\""), None);
    }

    #[test]
    fn a_known_model_load_splits_start_to_ready_into_its_phases() {
        let mut intervals = Intervals {
            phases: [
                (Phase::Scheduling, (0.0, 1.0)),
                (Phase::ImagePull, (1.0, 2.0)),
                (Phase::ContainerStart, (2.0, 3.0)),
                (Phase::ModelLoad, (3.0, 4.0)),
                (Phase::Readiness, (4.0, 5.0)),
            ]
            .into(),
            start_to_ready: Some((3.0, 5.0)),
        };
        let names = |intervals: &Intervals| -> Vec<Stretch> {
            intervals.stretches().into_iter().map(|(s, _)| s).collect()
        };
        assert_eq!(
            names(&intervals),
            [
                Stretch::ImagePull,
                Stretch::ContainerStart,
                Stretch::ModelLoad,
                Stretch::Readiness
            ]
        );
        intervals.phases.remove(&Phase::ModelLoad);
        intervals.phases.remove(&Phase::Readiness);
        assert_eq!(
            names(&intervals),
            [
                Stretch::ImagePull,
                Stretch::ContainerStart,
                Stretch::StartToReady
            ]
        );
    }
}
