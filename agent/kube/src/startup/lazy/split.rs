//! The snapshotter's readings taken during one startup, split over its phases: how many bytes of
//! the pod's image were fetched from the registry, and read by the workload, in each, and for how
//! much of each the snapshotter was fetching. Pure: the samples, the phases' intervals and the
//! image's layers in, the figures out.
//!
//! Between two readings the snapshotter's rise is spread over the phases in proportion to their
//! share of that time (the readings say how much, not when within it), and the time between two
//! readings whose fetched bytes rose counts as fetching. A phase is measured only where readings
//! bracket it with none failed in between: a snapshotter that stopped, or could not be read,
//! leaves the phases it did not see absent, never 0.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::soci::Reading;
use super::Digest;

/// API times are whole seconds, rounded down; a reading within a second of a phase's ends
/// brackets it.
const TOLERANCE: f64 = 1.0;

/// One attempt to read the snapshotter: its reading, or `None` where it failed.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: f64,
    pub reading: Option<Reading>,
}

/// A stretch of a startup that fetch figures are given for: a phase, or, where the model load is
/// unknown (the weights are in the image, where no open of the node's cache ends it), the main
/// container's start to Ready as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stretch {
    ImagePull,
    ContainerStart,
    ModelLoad,
    Readiness,
    StartToReady,
}

impl Stretch {
    pub const ALL: [Stretch; 5] = [
        Stretch::ImagePull,
        Stretch::ContainerStart,
        Stretch::ModelLoad,
        Stretch::Readiness,
        Stretch::StartToReady,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stretch::ImagePull => "image_pull",
            Stretch::ContainerStart => "container_start",
            Stretch::ModelLoad => "model_load",
            Stretch::Readiness => "readiness",
            Stretch::StartToReady => "start_to_ready",
        }
    }
}

/// What the snapshotter did for the pod's image during one stretch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Fetch {
    /// Bytes of the image's layers fetched from the registry.
    pub fetched_bytes: u64,
    /// Bytes the workload read through the lazily loaded layers (fetched then, or before).
    pub read_bytes: u64,
    /// How much of the stretch the snapshotter spent fetching the image's layers.
    pub fetch_seconds: f64,
}

/// A startup's image as the snapshotter saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LazyLoad {
    /// Whether the snapshotter mounted any of the image's layers lazily: false for an image with
    /// no SOCI index, or one the snapshotter fell back to pulling whole; `None` where it was not
    /// read during the startup.
    pub lazy: Option<bool>,
    /// Per stretch; only for a lazily loaded image, and only the stretches readings bracketed.
    pub fetched: BTreeMap<Stretch, Fetch>,
}

/// Splits what `samples` (in time order) saw of `layers` over `stretches`.
pub fn split(
    samples: &[Sample],
    layers: &BTreeSet<Digest>,
    stretches: &[(Stretch, (f64, f64))],
) -> LazyLoad {
    let Some((first, last)) = stretches
        .iter()
        .map(|(_, interval)| *interval)
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
    else {
        return LazyLoad::default();
    };
    let during: Vec<&Reading> = samples
        .iter()
        .filter(|s| (first - TOLERANCE..=last + TOLERANCE).contains(&s.at))
        .filter_map(|s| s.reading.as_ref())
        .collect();
    let lazy = (!during.is_empty()).then(|| {
        during
            .iter()
            .any(|r| layers.iter().any(|l| r.contains_key(l)))
    });
    let mut fetched = BTreeMap::new();
    if lazy == Some(true) {
        for &(stretch, interval) in stretches {
            if let Some(fetch) = within(samples, layers, interval) {
                fetched.insert(stretch, fetch);
            }
        }
    }
    LazyLoad { lazy, fetched }
}

/// The figures for one interval, where readings bracket it with none failed in between.
fn within(
    samples: &[Sample],
    layers: &BTreeSet<Digest>,
    (from, until): (f64, f64),
) -> Option<Fetch> {
    // The last reading at or before the start, else one within the tolerance after it; the first
    // at or after the end, else the last within the tolerance before it.
    let start = samples
        .iter()
        .rposition(|s| s.at <= from)
        .or_else(|| (samples.first()?.at <= from + TOLERANCE).then_some(0))?;
    let end = samples[start..]
        .iter()
        .position(|s| s.at >= until)
        .map(|i| start + i)
        .or_else(|| (samples.last()?.at >= until - TOLERANCE).then_some(samples.len() - 1))?;
    let bracket = &samples[start..=end];
    if bracket.iter().any(|s| s.reading.is_none()) {
        return None;
    }
    let mut fetched = 0.0;
    let mut read = 0.0;
    let mut seconds = 0.0;
    for pair in bracket.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (Some(before), Some(after)) = (&a.reading, &b.reading) else {
            continue;
        };
        let overlap = (b.at.min(until) - a.at.max(from)).max(0.0);
        let length = b.at - a.at;
        if overlap == 0.0 || length <= 0.0 {
            continue;
        }
        let share = overlap / length;
        let (rise_fetched, rise_read) = rises(before, after, layers);
        fetched += rise_fetched * share;
        read += rise_read * share;
        if rise_fetched > 0.0 {
            seconds += overlap;
        }
    }
    Some(Fetch {
        fetched_bytes: fetched.round() as u64,
        read_bytes: read.round() as u64,
        fetch_seconds: seconds,
    })
}

/// How much `layers` fetched and served between two readings. A figure that fell was reset (the
/// layer mounted again, or the snapshotter restarted between two readings that both succeeded):
/// it rose from 0.
fn rises(before: &Reading, after: &Reading, layers: &BTreeSet<Digest>) -> (f64, f64) {
    let rise = |a: f64, b: f64| if b >= a { b - a } else { b };
    layers
        .iter()
        .filter_map(|layer| {
            Some((
                before.get(layer).copied().unwrap_or_default(),
                *after.get(layer)?,
            ))
        })
        .fold((0.0, 0.0), |(fetched, read), (a, b)| {
            (
                fetched + rise(a.fetched, b.fetched),
                read + rise(a.served, b.served),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::startup::lazy::soci::LayerFigures;

    fn digest(n: u8) -> Digest {
        Digest::parse(&format!("sha256:{}", format!("{n:02x}").repeat(32))).unwrap()
    }

    /// A reading of the pod's layer 1 (and of layer 9, which no image of the pod has).
    fn at(at: f64, fetched: f64, served: f64) -> Sample {
        let mut reading = Reading::new();
        reading.insert(digest(1), LayerFigures { fetched, served });
        reading.insert(
            digest(9),
            LayerFigures {
                fetched: 1e9 * at,
                served: 1e9 * at,
            },
        );
        Sample {
            at,
            reading: Some(reading),
        }
    }

    fn failed(at: f64) -> Sample {
        Sample { at, reading: None }
    }

    fn layers() -> BTreeSet<Digest> {
        [digest(1)].into()
    }

    const STRETCHES: [(Stretch, (f64, f64)); 3] = [
        (Stretch::ImagePull, (100.0, 100.5)),
        (Stretch::ContainerStart, (100.5, 101.0)),
        (Stretch::StartToReady, (101.0, 105.0)),
    ];

    #[test]
    fn each_rise_goes_to_the_stretch_it_happened_in_and_another_images_layer_is_ignored() {
        let samples = [
            at(100.0, 0.0, 0.0),
            at(101.0, 10.0, 0.0),
            at(102.0, 10.0, 0.0),
            at(103.0, 50.0, 40.0),
            at(105.0, 90.0, 90.0),
        ];
        let load = split(&samples, &layers(), &STRETCHES);
        assert_eq!(load.lazy, Some(true));
        assert_eq!(
            load.fetched[&Stretch::ImagePull],
            Fetch {
                fetched_bytes: 5,
                read_bytes: 0,
                fetch_seconds: 0.5
            },
            "half of the first second's rise"
        );
        assert_eq!(load.fetched[&Stretch::ContainerStart].fetched_bytes, 5);
        assert_eq!(
            load.fetched[&Stretch::StartToReady],
            Fetch {
                fetched_bytes: 80,
                read_bytes: 90,
                fetch_seconds: 3.0
            },
            "no fetching between 101 and 102"
        );
    }

    #[test]
    fn an_image_none_of_whose_layers_the_snapshotter_mounted_is_not_lazy_and_has_no_figures() {
        let samples = [at(100.0, 0.0, 0.0), at(105.0, 10.0, 0.0)];
        let other: BTreeSet<Digest> = [digest(2)].into();
        assert_eq!(
            split(&samples, &other, &STRETCHES),
            LazyLoad {
                lazy: Some(false),
                fetched: BTreeMap::new()
            }
        );
    }

    #[test]
    fn a_snapshotter_that_stopped_mid_startup_leaves_what_it_did_not_see_absent() {
        let samples = [
            at(100.0, 0.0, 0.0),
            at(101.0, 10.0, 0.0),
            failed(102.0),
            failed(103.0),
        ];
        let load = split(&samples, &layers(), &STRETCHES);
        assert_eq!(load.lazy, Some(true));
        assert_eq!(
            load.fetched.keys().copied().collect::<Vec<_>>(),
            [Stretch::ImagePull, Stretch::ContainerStart]
        );
        // Back again before Ready: the failed readings between still leave the stretch unknown.
        let samples = [
            at(100.0, 0.0, 0.0),
            at(101.0, 10.0, 0.0),
            failed(103.0),
            at(105.0, 2.0, 2.0),
        ];
        let load = split(&samples, &layers(), &STRETCHES);
        assert!(!load.fetched.contains_key(&Stretch::StartToReady));
        // Never read during the startup: unknown, not "not lazy".
        let load = split(&[failed(100.0), failed(105.0)], &layers(), &STRETCHES);
        assert_eq!(load, LazyLoad::default());
    }

    #[test]
    fn a_figure_that_fell_between_two_readings_rose_from_zero() {
        let samples = [at(101.0, 100.0, 100.0), at(105.0, 30.0, 20.0)];
        let load = split(&samples, &layers(), &STRETCHES[2..]);
        assert_eq!(load.fetched[&Stretch::StartToReady].fetched_bytes, 30);
        assert_eq!(load.fetched[&Stretch::StartToReady].read_bytes, 20);
    }

    #[test]
    fn readings_that_do_not_reach_a_stretchs_ends_leave_it_absent() {
        // Sampling began after the pull (the agent started late) and ended before Ready.
        let samples = [at(102.5, 0.0, 0.0), at(103.0, 1.0, 1.0)];
        let load = split(&samples, &layers(), &STRETCHES);
        assert_eq!(load.lazy, Some(true));
        assert!(load.fetched.is_empty(), "{load:?}");
    }
}
