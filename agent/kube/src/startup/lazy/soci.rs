//! soci-snapshotter's Prometheus metrics (`metrics_address` in its config.toml, v0.16), read into
//! what each layer has fetched and served so far.
//!
//! Two of its families are per layer and say what a startup is waiting on:
//!
//! - `soci_fs_layer_fetched_size_bytes{digest,mountpoint}` (a counter, fs/metrics/layer): the
//!   layer's bytes fetched from the registry so far, per FUSE mount of it;
//! - `soci_fs_bytes_served{layer,operation_type="synchronous_bytes_served"}` (a gauge,
//!   fs/metrics/common): bytes the workload's reads were served through the layer's mount.
//!
//! The snapshotter also declares a `synchronous_bytes_fetched` count, but its source says it is
//! "not available now"; its `remote_registry_get` duration ends at the response's headers, not at
//! the last byte, so it is not the time spent fetching either. Time is taken from the samples
//! instead ([`super::split`]).
//!
//! The text is parsed whole: a line that is not the exposition format, or one of the two families
//! with another type or label set, means the endpoint is not what the agent was told it is, and
//! the reading is refused with the line and the reason rather than read as zero.

use std::collections::BTreeMap;

use super::Digest;

const FETCHED: &str = "soci_fs_layer_fetched_size_bytes";
const SERVED: &str = "soci_fs_bytes_served";
const SYNCHRONOUS_BYTES_SERVED: &str = "synchronous_bytes_served";

/// What the snapshotter has done for one layer, as of one reading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerFigures {
    /// Bytes fetched from the registry, summed over the layer's mounts.
    pub fetched: f64,
    /// Bytes served to the workload's reads through the layer's mounts.
    pub served: f64,
}

/// The per-layer figures of one reading; a layer the snapshotter has never mounted is not in it.
pub type Reading = BTreeMap<Digest, LayerFigures>;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum FormError {
    #[error("line {line}: {reason}; is the socket soci-snapshotter's metrics endpoint?")]
    Line { line: usize, reason: String },
    #[error("{family} is a {found}, where soci-snapshotter v0.16 serves a {expected}")]
    Type {
        family: &'static str,
        found: String,
        expected: &'static str,
    },
    #[error("no soci_ series at all: the socket is some other exporter's, not soci-snapshotter's (its metrics_address)")]
    NotSoci,
}

/// Reads one exposition of the snapshotter's metrics.
pub fn read(text: &str) -> Result<Reading, FormError> {
    let mut reading = Reading::new();
    let mut seen_soci = false;
    for (index, line) in text.lines().enumerate() {
        let at = |reason: String| FormError::Line {
            line: index + 1,
            reason,
        };
        let line = line.trim();
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if let (Some("TYPE"), Some(family), Some(kind)) =
                (words.next(), words.next(), words.next())
            {
                seen_soci |= family.starts_with("soci_");
                check_type(family, kind)?;
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let sample = Sample::parse(line).map_err(at)?;
        seen_soci |= sample.name.starts_with("soci_");
        match sample.name {
            FETCHED => {
                let digest = Digest::parse(sample.label("digest").map_err(at)?).map_err(at)?;
                sample.label("mountpoint").map_err(at)?;
                reading.entry(digest).or_default().fetched += sample.amount().map_err(at)?;
            }
            SERVED if sample.label("operation_type").map_err(at)? == SYNCHRONOUS_BYTES_SERVED => {
                let digest = Digest::parse(sample.label("layer").map_err(at)?).map_err(at)?;
                reading.entry(digest).or_default().served += sample.amount().map_err(at)?;
            }
            _ => {}
        }
    }
    if seen_soci {
        Ok(reading)
    } else {
        Err(FormError::NotSoci)
    }
}

fn check_type(family: &str, found: &str) -> Result<(), FormError> {
    let (family, expected) = match family {
        FETCHED => (FETCHED, "counter"),
        SERVED => (SERVED, "gauge"),
        _ => return Ok(()),
    };
    if found == expected {
        Ok(())
    } else {
        Err(FormError::Type {
            family,
            found: found.to_string(),
            expected,
        })
    }
}

/// One sample line of the text exposition format:
/// `name{label="value",...} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Result<Sample<'a>, String> {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or("a series name without a value")?;
        let name = &line[..name_end];
        if !is_name(name, true) {
            return Err(format!("{name:?} is not a series name"));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inside) = rest.strip_prefix('{') {
            rest = inside;
            loop {
                rest = rest.trim_start();
                if let Some(after) = rest.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (label, after) = rest.split_once('=').ok_or("a label without '='")?;
                let label = label.trim();
                if !is_name(label, false) {
                    return Err(format!("{label:?} is not a label name"));
                }
                let (value, after) = quoted(after.trim_start())?;
                labels.push((label, value));
                rest = after.trim_start();
                match rest.strip_prefix(',') {
                    Some(after) => rest = after,
                    None if rest.starts_with('}') => {}
                    None => return Err("labels not separated by ','".into()),
                }
            }
        }
        let mut fields = rest.split_whitespace();
        let value = fields.next().ok_or("a series without a value")?;
        let value = value
            .parse::<f64>()
            .map_err(|_| format!("{value:?} is not a number"))?;
        if let Some(timestamp) = fields.next() {
            timestamp
                .parse::<i64>()
                .map_err(|_| format!("{timestamp:?} is not a timestamp in milliseconds"))?;
        }
        if fields.next().is_some() {
            return Err("more than a value and a timestamp after the series".into());
        }
        Ok(Sample {
            name,
            labels,
            value,
        })
    }

    fn label(&self, name: &str) -> Result<&str, String> {
        self.labels
            .iter()
            .find(|(label, _)| *label == name)
            .map(|(_, value)| value.as_str())
            .ok_or_else(|| format!("{} without its {name} label", self.name))
    }

    /// A byte count: finite and not negative.
    fn amount(&self) -> Result<f64, String> {
        if self.value.is_finite() && self.value >= 0.0 {
            Ok(self.value)
        } else {
            Err(format!("{} is {}, not a byte count", self.name, self.value))
        }
    }
}

/// A label value in double quotes, with the format's three escapes; the text after it.
fn quoted(text: &str) -> Result<(String, &str), String> {
    let body = text
        .strip_prefix('"')
        .ok_or("a label value not in double quotes")?;
    let mut value = String::new();
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &body[at + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, escaped @ ('\\' | '"'))) => value.push(escaped),
                _ => return Err("an escape other than \\\\, \\\" or \\n".into()),
            },
            c => value.push(c),
        }
    }
    Err("a label value without its closing quote".into())
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*` for series, the same without ':' for labels.
fn is_name(text: &str, colons: bool) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    text.chars()
        .next()
        .is_some_and(|c| allowed(c) && !c.is_ascii_digit())
        && text.chars().all(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: &str = "sha256:507a7f7c82543fde896e979994ff940967d4f612a1bbbeca6a9ee07344d5155c";

    fn figures(text: &str) -> LayerFigures {
        read(text).unwrap()[&Digest::parse(LAYER).unwrap()]
    }

    #[test]
    fn soci_snapshotters_own_exposition_gives_each_layers_fetched_and_served_bytes() {
        // tests/fixtures/SOURCES: v0.16.1's /metrics after a server read its 64 MiB of weights.
        let text = include_str!("../../../../../tests/fixtures/soci/metrics.txt");
        let reading = read(text).unwrap();
        let layer = |digest: &str| reading[&Digest::parse(digest).unwrap()];
        assert_eq!(reading.len(), 2, "the two mounted layers");
        assert_eq!(
            layer(LAYER),
            LayerFigures {
                fetched: 67_116_245.0,
                served: 67_108_864.0
            },
            "the weights' layer: fetched whole, every weight byte read"
        );
        assert_eq!(
            layer("sha256:1d4d5568753473f6161e173a9c03d22cd3fa159c471630a69959981818539736"),
            LayerFigures {
                fetched: 5_088_046.0,
                served: 5_652_480.0
            }
        );
    }

    #[test]
    fn a_layer_mounted_twice_sums_its_mounts_and_other_operations_are_not_served_bytes() {
        let text = format!(
            "# TYPE soci_fs_layer_fetched_size_bytes counter\n\
             soci_fs_layer_fetched_size_bytes{{digest=\"{LAYER}\",mountpoint=\"/a\"}} 100\n\
             soci_fs_layer_fetched_size_bytes{{digest=\"{LAYER}\",mountpoint=\"/b\"}} 50 1700000000000\n\
             # TYPE soci_fs_bytes_served gauge\n\
             soci_fs_bytes_served{{layer=\"{LAYER}\",operation_type=\"synchronous_bytes_served\"}} 7\n\
             soci_fs_bytes_served{{layer=\"{LAYER}\",operation_type=\"something_new\"}} 1000\n"
        );
        assert_eq!(
            figures(&text),
            LayerFigures {
                fetched: 150.0,
                served: 7.0
            }
        );
    }

    #[test]
    fn label_values_keep_their_escapes_and_commas() {
        let text = format!(
            "soci_fs_layer_fetched_size_bytes{{mountpoint=\"/a \\\"b\\\",c\\\\d\\n\", digest=\"{LAYER}\",}} 3e+06\n"
        );
        assert_eq!(figures(&text).fetched, 3e6);
    }

    #[test]
    fn another_form_is_refused_naming_the_line_and_the_reason() {
        let cases = [
            ("soci_fs_bytes_served 5 6 7\n", "line 1: more than a value"),
            (
                "# a comment\nsoci_fs_layer_fetched_size_bytes{digest=\"sha256:abc\",mountpoint=\"/\"} 1\n",
                "line 2: \"sha256:abc\" is not a sha256 digest",
            ),
            (
                &format!("soci_fs_layer_fetched_size_bytes{{digest=\"{LAYER}\"}} 1\n"),
                "without its mountpoint label",
            ),
            (
                &format!("soci_fs_bytes_served{{layer=\"{LAYER}\",operation_type=\"synchronous_bytes_served\"}} -1\n"),
                "is -1, not a byte count",
            ),
            ("soci_fs_bytes_served{layer=\"x} 1\n", "without its closing quote"),
            ("<html>soci</html>\n", "a series name without a value"),
            ("soci-fs 1\n", "\"soci-fs\" is not a series name"),
            (
                "# TYPE soci_fs_bytes_served counter\n",
                "soci_fs_bytes_served is a counter, where soci-snapshotter v0.16 serves a gauge",
            ),
            ("# TYPE go_goroutines gauge\ngo_goroutines 12\n", "no soci_ series at all"),
            ("", "no soci_ series at all"),
        ];
        for (text, says) in cases {
            let error = read(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[test]
    fn soci_with_no_layer_mounted_is_an_empty_reading() {
        let text = "# TYPE soci_fs_operation_count counter\n\
                    soci_fs_operation_count{layer=\"\",operation_type=\"background_fetch_work_queue_evicted\"} 0\n";
        assert_eq!(read(text), Ok(Reading::new()));
    }
}
