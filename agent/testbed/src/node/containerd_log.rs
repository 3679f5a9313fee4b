//! containerd's own record of an image pull, read from its log (logrus's text format, debug
//! level): the CRI's "Pulled image" line, written as its pull returns with the pull's duration
//! (containerd v2.4 internal/cri/server/images/image_pull.go), and a "diff applied" line for each
//! layer applied to a snapshot, written as the apply ends with its duration and the layer's digest
//! (core/diff/apply/apply.go). The tests hold the agent's transfer and unpack against it.

use std::collections::BTreeMap;

use super::workload::go_duration;

/// Two applies at most this far apart are one after the other, not one waiting for its layer.
const BACK_TO_BACK: f64 = 0.05;

/// One pull as containerd recorded it; times are Unix seconds by the node's clock.
#[derive(Clone, Debug)]
pub struct PullRecord {
    /// When the pull returned.
    pub ended: f64,
    /// Its duration, by containerd.
    pub seconds: f64,
    /// The image's layers applied, each at its last apply before the pull returned.
    pub applies: Vec<Apply>,
}

#[derive(Clone, Debug)]
pub struct Apply {
    pub digest: String,
    pub ended: f64,
    pub seconds: f64,
}

impl PullRecord {
    /// When it began, by its own figure.
    pub fn began(&self) -> f64 {
        self.ended - self.seconds
    }

    /// The end of the last layer's apply.
    pub fn last_applied(&self) -> Option<f64> {
        self.applies.iter().map(|a| a.ended).reduce(f64::max)
    }

    /// The start of the last layer's apply: no layer was applied before it was in, and containerd
    /// applies one at a time, so every layer was in by then.
    pub fn last_apply_began(&self) -> Option<f64> {
        self.applies
            .iter()
            .max_by(|a, b| a.ended.total_cmp(&b.ended))
            .map(|a| a.ended - a.seconds)
    }

    /// When containerd began applying the layers it applied last, back to back: the start of the
    /// last run of applies each begun within [`BACK_TO_BACK`] of the previous one's end. A layer
    /// is applied once it is in and the layers under it are applied, so a layer fetched early is
    /// applied while the others come in, and the run after the transfer begins with the apply of
    /// the last layer in; where every layer comes in together, with the first's. The pull's end
    /// if none was applied.
    pub fn applying_from(&self) -> f64 {
        let mut applies: Vec<&Apply> = self.applies.iter().collect();
        applies.sort_by(|a, b| a.ended.total_cmp(&b.ended));
        let mut run_start: Option<f64> = None;
        for apply in applies.iter().rev() {
            if run_start.is_some_and(|start| start - apply.ended > BACK_TO_BACK) {
                break;
            }
            run_start = Some(apply.ended - apply.seconds);
        }
        run_start.unwrap_or(self.ended)
    }
}

/// The last pull of `image` (as the pod names it) in `log`, with the applies of `layers`.
pub fn pull_record(log: &str, image: &str, layers: &[String]) -> Option<PullRecord> {
    let entries: Vec<BTreeMap<String, String>> = log.lines().map(fields).collect();
    let pulled = entries.iter().rev().find(|entry| {
        entry
            .get("msg")
            .is_some_and(|msg| msg.starts_with(&format!("Pulled image \"{image}\" with image id")))
    })?;
    let ended = time(pulled)?;
    let seconds = go_duration(pulled["msg"].rsplit(" in ").next()?)?;
    let mut applies: BTreeMap<&str, Apply> = BTreeMap::new();
    for entry in &entries {
        if entry.get("msg").map(String::as_str) != Some("diff applied") {
            continue;
        }
        let (Some(digest), Some(at)) = (entry.get("digest"), time(entry)) else {
            continue;
        };
        let Some(layer) = layers.iter().find(|l| *l == digest) else {
            continue;
        };
        if at <= ended {
            applies.insert(
                layer,
                Apply {
                    digest: digest.clone(),
                    ended: at,
                    seconds: go_duration(entry.get("d")?)?,
                },
            );
        }
    }
    Some(PullRecord {
        ended,
        seconds,
        applies: applies.into_values().collect(),
    })
}

fn time(entry: &BTreeMap<String, String>) -> Option<f64> {
    let at = humantime::parse_rfc3339(entry.get("time")?).ok()?;
    Some(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// A logrus text line's `key=value` and `key="quoted \"value\""` fields.
fn fields(line: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut rest = line.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().to_string();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        fields.insert(key, value);
        rest = next.trim_start();
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    /// containerd 2.4's lines for a pull of the image_split scenario on the tests' node, copied
    /// from its log: the five layers' applies, then the pull's end.
    const LOG: &str = r#"time="2026-12-06T09:50:20.596063377Z" level=debug msg="diff applied" d=81.860556ms digest="sha256:ec5783f2d5c41dccc90140bcbcb753c981bdff9be8271843d032d4b5f74a3f29" media=application/vnd.docker.image.rootfs.diff.tar.gzip size=5615280
time="2026-12-06T09:50:20.630797910Z" level=debug msg="diff applied" d=28.280699ms digest="sha256:cacce5eb51d5e20e913c90c1b4cb7fac6c7c8f2da2a0707a02c037e68add23b8" media=application/vnd.docker.image.rootfs.diff.tar.gzip size=12585587
time="2026-12-06T09:50:20.682062274Z" level=debug msg="diff applied" d=45.805366ms digest="sha256:51a2aa3b5d89a6b7e2c3d52d585bfa774d7f10cac26702efd7afb6543a160c60" media=application/vnd.docker.image.rootfs.diff.tar.gzip size=12585589
time="2026-12-06T09:50:20.730158446Z" level=debug msg="diff applied" d=43.02437ms digest="sha256:68a4294a7b12d4422e3e5095b61c0cc94fc29280bc4c8f57bf7d489653a674c6" media=application/vnd.docker.image.rootfs.diff.tar.gzip size=12585587
time="2026-12-06T09:50:20.786701700Z" level=debug msg="diff applied" d=48.028025ms digest="sha256:8a23b36110fc3fed36fc04f2b17babdedea9c686eb30c59723ee2804d371819d" media=application/vnd.docker.image.rootfs.diff.tar.gzip size=12585591
time="2026-12-06T09:50:20.797148483Z" level=info msg="Pulled image \"127.0.0.1:5000/workload:split\" with image id \"sha256:157da7275861bd59e69aad1cdcd41dae7115ffefb60356906473bcfe711e4101\", repo tag \"127.0.0.1:5000/workload:split\", repo digest \"127.0.0.1:5000/workload@sha256:ddd873628a8d1762c93f6ca6831c92672daf8389995b54d89b2d6ca63ea7764a\", size \"55959426\" in 2.12418556s""#;

    #[test]
    fn a_pull_and_its_layers_applies_are_read_from_containerds_lines() {
        let layers: Vec<String> = LOG
            .lines()
            .filter_map(|line| Some(fields(line).get("digest")?.clone()))
            .collect();
        assert_eq!(layers.len(), 5);
        let image = "127.0.0.1:5000/workload:split";
        let record = pull_record(LOG, image, &layers[1..]).unwrap();
        assert!((record.seconds - 2.12418556).abs() < 1e-9);
        assert_eq!(record.applies.len(), 4, "only the layers asked for");
        assert!((record.applies.iter().map(|a| a.seconds).sum::<f64>() - 0.165138461).abs() < 1e-9);
        let record = pull_record(LOG, image, &layers).unwrap();
        // Back to back, from the first layer's apply's start (09:50:20.596063377 less
        // 81.860556 ms) to the last's end.
        assert!(
            (record.applying_from() - (record.ended - 0.797148483 + 0.596063377 - 0.081860556))
                .abs()
                < 1e-6
        );
        assert!(
            (record.last_applied().unwrap() - (record.ended - 0.797148483 + 0.786701700)).abs()
                < 1e-6
        );
        assert!(pull_record(LOG, "127.0.0.1:5000/workload:other", &layers).is_none());
    }
}
