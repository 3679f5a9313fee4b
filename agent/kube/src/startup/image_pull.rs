//! `image_pull` split in two: `image_transfer`, the pull until the last of the image's layers was
//! in containerd's content store, and `image_unpack`, the rest of it. Pure: the kubelet's `Pulled`
//! event and the times containerd committed the image's blobs in; the split out.
//!
//! The two always add up to the kubelet's pull figure, and neither is ever negative. What is
//! placed on the node's clock is the pull's end: the kubelet's figure says how long it took, and
//! the `Pulled` event when it ended, but only to the whole second (the API's timestamps are
//! rounded down). Where this pull fetched the blob its `imageID` names (the index or manifest,
//! the first blob of a pull), that commit, nanoseconds, begins the pull, and the end is that plus
//! the kubelet's figure: late by the registry's answer to the manifest's request (milliseconds on
//! a node's link to its registry). Otherwise (the manifest came in with another pull of the same
//! image, running or done) the end is taken as the middle of the event's second: within half a
//! second.
//!
//! Overlapping pulls need nothing of their own: a layer another pull fetched while this one ran
//! was waited for by this one (containerd fetches a blob once), and counts; one in the store
//! before this pull began was not fetched by it, and does not.

use serde::Serialize;

use super::lazy::content_store::Commits;

/// How much earlier than its `Pulled` event's second a pull may have begun, beyond its figure: the
/// event is recorded after the pull returns, within milliseconds.
const EVENT_DELAY: f64 = 0.25;

/// One pull split, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Split {
    pub transfer_seconds: f64,
    pub unpack_seconds: f64,
}

/// Why a pull has no split.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Unsplit {
    #[error(
        "every layer of the image was in containerd's content store before its pull began: the \
         pull fetched none"
    )]
    NothingFetched,
    #[error(
        "the image's blobs were committed after its pull ended: the image was pulled again since"
    )]
    CommittedLater,
}

/// One pull: the kubelet's figure (`seconds`), its `Pulled` event's time (whole seconds) and the
/// image's commits.
pub fn split(seconds: f64, pulled_at: f64, commits: &Commits) -> Result<Split, Unsplit> {
    let last_layer = commits
        .layers
        .iter()
        .copied()
        .reduce(f64::max)
        .ok_or(Unsplit::NothingFetched)?;
    let latest_end = pulled_at + 1.0;
    if last_layer > latest_end || commits.image > latest_end {
        return Err(Unsplit::CommittedLater);
    }
    // The pull returned after its last layer was in, and within the event's second (no later
    // than `latest_end`, which neither the event nor the last layer passes).
    let earliest_end = pulled_at.max(last_layer);
    let fetched_by_this_pull = commits.image >= pulled_at - seconds - EVENT_DELAY;
    let end = if fetched_by_this_pull {
        commits.image + seconds
    } else {
        pulled_at + 0.5
    }
    .clamp(earliest_end, latest_end);
    let began = end - seconds;
    if last_layer <= began {
        return Err(Unsplit::NothingFetched);
    }
    let transfer_seconds = (last_layer - began).clamp(0.0, seconds);
    Ok(Split {
        transfer_seconds,
        unpack_seconds: seconds - transfer_seconds,
    })
}

/// A startup's pulls split, summed over them; or why not.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PodSplit {
    Split(Split),
    Absent { absent: String },
}

impl PodSplit {
    /// The sum of `pulls` (each pull of the startup that was no cache hit, split or not).
    pub fn of(pulls: impl IntoIterator<Item = Result<Split, String>>) -> PodSplit {
        let mut sum: Option<Split> = None;
        for pull in pulls {
            match pull {
                Err(absent) => return PodSplit::Absent { absent },
                Ok(split) => {
                    let total = sum.get_or_insert(Split {
                        transfer_seconds: 0.0,
                        unpack_seconds: 0.0,
                    });
                    total.transfer_seconds += split.transfer_seconds;
                    total.unpack_seconds += split.unpack_seconds;
                }
            }
        }
        match sum {
            Some(split) => PodSplit::Split(split),
            None => PodSplit::Absent {
                absent: "no image was pulled: each was on the node (a cache hit)".into(),
            },
        }
    }

    pub fn split(&self) -> Option<Split> {
        match self {
            PodSplit::Split(split) => Some(*split),
            PodSplit::Absent { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// A pull from 100.2 to 106.4 (the kubelet says 6.2 s; its `Pulled` event 106): the manifest
    /// in at 100.21, three layers fetched side by side, the last in at 104.9.
    fn pull(image: f64) -> Commits {
        Commits {
            image,
            layers: vec![101.0, 104.9, 103.5],
        }
    }

    #[test]
    fn a_pull_that_fetched_its_manifest_is_placed_by_it_to_the_milliseconds() {
        let parts = split(6.2, 106.0, &pull(100.21)).unwrap();
        assert!(near(parts.transfer_seconds, 4.69), "{parts:?}");
        assert!(near(parts.unpack_seconds, 1.51), "{parts:?}");
    }

    #[test]
    fn a_pull_whose_manifest_was_already_in_is_placed_by_its_events_second_within_half_of_it() {
        // The same image pulled by another pod first, its manifest in at 50.
        let parts = split(6.2, 106.0, &pull(50.0)).unwrap();
        assert!(near(parts.transfer_seconds, 4.6), "{parts:?}");
        assert!(near(parts.unpack_seconds, 1.6), "true 1.5: {parts:?}");
        // A second pull of an image in the store: milliseconds, nothing fetched.
        let again = Commits {
            image: 50.0,
            layers: vec![51.0, 52.0],
        };
        assert_eq!(split(0.03, 106.0, &again), Err(Unsplit::NothingFetched));
    }

    #[test]
    fn a_layer_in_before_the_pull_began_was_not_fetched_by_it_and_one_in_meanwhile_was() {
        // Layers shared with an image pulled earlier (in at 60) and one fetched by a pull
        // running beside this one, in at 102: both waited for, or not, as the store says.
        let commits = Commits {
            image: 100.21,
            layers: vec![60.0, 102.0, 60.0],
        };
        let parts = split(6.2, 106.0, &commits).unwrap();
        assert!(near(parts.transfer_seconds, 1.79), "{parts:?}");
        // Every layer in before: none fetched.
        let commits = Commits {
            image: 100.21,
            layers: vec![60.0, 60.0],
        };
        assert_eq!(split(6.2, 106.0, &commits), Err(Unsplit::NothingFetched));
    }

    #[test]
    fn never_negative_and_always_the_kubelets_figure_in_sum_whatever_the_times_say() {
        for (seconds, pulled_at, image, last) in [
            (6.2, 106.0, 100.21, 106.99),
            (6.2, 106.0, 99.0, 100.0),
            (0.0, 106.0, 106.0, 106.0),
            (0.5, 106.0, 105.9, 105.95),
            (30.0, 106.0, 76.3, 90.0),
            (6.2, 106.0, 106.9, 106.95),
        ] {
            let commits = Commits {
                image,
                layers: vec![last],
            };
            if let Ok(split) = split(seconds, pulled_at, &commits) {
                assert!(split.transfer_seconds >= 0.0 && split.unpack_seconds >= 0.0);
                assert!(near(split.transfer_seconds + split.unpack_seconds, seconds));
            }
        }
        // Committed after the pull's event's second: pulled again since.
        let later = Commits {
            image: 200.0,
            layers: vec![201.0],
        };
        assert_eq!(split(6.2, 106.0, &later), Err(Unsplit::CommittedLater));
        assert_eq!(
            split(
                6.2,
                106.0,
                &Commits {
                    image: 100.0,
                    layers: vec![]
                }
            ),
            Err(Unsplit::NothingFetched),
            "an image of no layers"
        );
    }

    #[test]
    fn a_startups_pulls_add_up_and_one_unsplit_pull_leaves_the_startup_unsplit() {
        let one = Split {
            transfer_seconds: 1.0,
            unpack_seconds: 0.5,
        };
        assert_eq!(
            PodSplit::of([Ok(one), Ok(one)]).split(),
            Some(Split {
                transfer_seconds: 2.0,
                unpack_seconds: 1.0
            })
        );
        assert_eq!(
            PodSplit::of([Ok(one), Err("no store".into())]),
            PodSplit::Absent {
                absent: "no store".into()
            }
        );
        let hits = PodSplit::of([]);
        assert!(serde_json::to_string(&hits).unwrap().contains("cache hit"));
        assert_eq!(
            serde_json::to_value(PodSplit::of([Ok(one)])).unwrap(),
            serde_json::json!({"transfer_seconds": 1.0, "unpack_seconds": 0.5})
        );
    }
}
