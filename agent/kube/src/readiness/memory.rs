//! What the agent remembers of a failing `AcceleratorHealthy` across its own restarts, without a
//! new privilege or a writable host path: the condition's message ends with the boot it was
//! written on and the XIDs that hold each GPU, and an agent that starts on the same boot reads
//! them back (an agent upgrade, eviction or OOM kill must not forget a GPU that is still bad). A new
//! boot id means the node restarted, which clears them. Pure text in and out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use mlnode_core::health::HeldFaults as HeldXids;

const OPEN: &str = " [mlnode-agent: boot ";
const HELD: &str = "; held ";

/// The annotation an operator sets to clear every held fault seen before the time it names
/// (RFC 3339): `kubectl annotate node NODE mlnode.dev/accelerator-faults-cleared-at=$(date -u
/// +%Y-%m-%dT%H:%M:%SZ) --overwrite`. A time, not a flag, so the agent needs no write to honour it.
pub const CLEARED_AT_ANNOTATION: &str = "mlnode.dev/accelerator-faults-cleared-at";

/// The suffix that carries `held` on boot `boot`; empty when nothing is held.
pub fn trailer(boot: &str, held: &HeldXids) -> String {
    if held.is_empty() {
        return String::new();
    }
    let gpus: Vec<String> = held
        .iter()
        .map(|(uuid, xids)| {
            let xids: Vec<String> = xids.iter().map(u64::to_string).collect();
            format!("{uuid}={}", xids.join("+"))
        })
        .collect();
    format!("{OPEN}{boot}{HELD}{}]", gpus.join(","))
}

/// What a message written by [`trailer`] carries: the boot and the held XIDs. Ok(None) for a
/// message without the suffix (nothing held, or not ours); Err when the suffix is there but not of
/// the form this agent writes.
pub fn parse(message: &str) -> Result<Option<(String, HeldXids)>, String> {
    let Some(start) = message.rfind(OPEN) else {
        return Ok(None);
    };
    let bad = |why: &str| format!("{why} in {:?}", &message[start..]);
    let body = message[start + OPEN.len()..]
        .strip_suffix(']')
        .ok_or_else(|| bad("no closing bracket"))?;
    let (boot, gpus) = body.split_once(HELD).ok_or_else(|| bad("no held list"))?;
    if boot.is_empty() || !boot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(bad("not a boot id"));
    }
    let mut held = HeldXids::new();
    for gpu in gpus.split(',') {
        let (uuid, xids) = gpu
            .split_once('=')
            .ok_or_else(|| bad("a GPU without XIDs"))?;
        if !uuid.starts_with("GPU-") && !uuid.starts_with("MIG-") {
            return Err(bad("not a GPU UUID"));
        }
        let xids = xids
            .split('+')
            .map(|x| x.parse::<u64>().map_err(|_| bad("not an XID")))
            .collect::<Result<BTreeSet<u64>, String>>()?;
        held.insert(uuid.to_string(), xids);
    }
    Ok(Some((boot.to_string(), held)))
}

/// The operator's clearing time from the node's annotations, if set; Err when it is not RFC 3339.
pub fn cleared_at(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<SystemTime>, String> {
    let Some(value) = annotations.and_then(|a| a.get(CLEARED_AT_ANNOTATION)) else {
        return Ok(None);
    };
    humantime::parse_rfc3339_weak(value.trim())
        .map(Some)
        .map_err(|e| format!("{CLEARED_AT_ANNOTATION}={value:?} is not an RFC 3339 time ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "3f2b1c9e-8d7a-4c1b-9e2f-0a1b2c3d4e5f";

    #[test]
    fn what_is_written_is_read_back() {
        let held: HeldXids = [
            ("GPU-aaaa".to_string(), [48, 79].into()),
            ("GPU-bbbb".to_string(), [46].into()),
        ]
        .into();
        let message = format!("GPU 3 (GPU-aaaa) reported XID 48{}", trailer(BOOT, &held));
        assert!(message.ends_with("[mlnode-agent: boot 3f2b1c9e-8d7a-4c1b-9e2f-0a1b2c3d4e5f; held GPU-aaaa=48+79,GPU-bbbb=46]"), "{message}");
        assert_eq!(parse(&message).unwrap(), Some((BOOT.to_string(), held)));
        assert_eq!(trailer(BOOT, &HeldXids::new()), "");
        assert_eq!(parse("4 GPU(s), 0 Neuron device(s) healthy").unwrap(), None);
    }

    /// A message the agent did not write, or one cut or edited, is said to be so, never read as
    /// some other fault: the live facts then decide.
    #[test]
    fn a_message_of_another_form_is_refused() {
        for message in [
            "x [mlnode-agent: boot 3f2b; held GPU-a=48",
            "x [mlnode-agent: boot 3f2b; GPU-a=48]",
            "x [mlnode-agent: boot <script>; held GPU-a=48]",
            "x [mlnode-agent: boot 3f2b; held /etc/passwd=48]",
            "x [mlnode-agent: boot 3f2b; held GPU-a=forty-eight]",
            "x [mlnode-agent: boot 3f2b; held GPU-a]",
        ] {
            assert!(parse(message).is_err(), "{message}");
        }
    }

    #[test]
    fn the_operators_clearing_time_is_rfc_3339() {
        let at = |value: &str| {
            cleared_at(Some(
                &[(CLEARED_AT_ANNOTATION.to_string(), value.to_string())].into(),
            ))
        };
        assert!(at("2026-12-01T10:00:00Z").unwrap().is_some());
        assert!(at("yesterday").unwrap_err().contains(CLEARED_AT_ANNOTATION));
        assert_eq!(cleared_at(None).unwrap(), None);
    }
}
