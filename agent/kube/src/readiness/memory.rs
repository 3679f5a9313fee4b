//! What the agent remembers across its own restarts, without a new privilege or a writable host
//! path, in the messages of its own node conditions: each ends with the boot it was written on
//! and what a restarted agent of that boot takes back. `AcceleratorHealthy`'s carries the XIDs that
//! hold each GPU (an agent upgrade, eviction or OOM kill must not forget a GPU that is still bad);
//! `ModelCacheVerified`'s each verified model's record (a rollout must not re-read every model
//! cache of the fleet). A new boot id means the node restarted, which clears both. Pure text in
//! and out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use mlnode_core::health::HeldFaults as HeldXids;
use mlnode_core::state::CacheRecord;

const OPEN: &str = " [mlnode-agent: boot ";
const HELD: &str = "; held ";
const VERIFIED: &str = "; verified ";
/// More records than models any node serves is not a message this agent wrote.
const MAX_RECORDS: usize = 256;

/// The annotation an operator sets to clear every held fault seen before the time it names
/// (RFC 3339): `kubectl annotate node NODE mlnode.dev/accelerator-faults-cleared-at=$(date -u
/// +%Y-%m-%dT%H:%M:%SZ) --overwrite`. A time, not a flag, so the agent needs no write to honour it.
pub const CLEARED_AT_ANNOTATION: &str = "mlnode.dev/accelerator-faults-cleared-at";

/// The suffix that carries `items` of `kind` on boot `boot`; empty when there are none, or the
/// boot is not known (nothing could be tied to it).
fn suffix(boot: &str, kind: &str, items: Vec<String>) -> String {
    if items.is_empty() || boot.is_empty() {
        return String::new();
    }
    format!("{OPEN}{boot}{kind}{}]", items.join(","))
}

/// A suffix of some kind as found in a message: its boot, its list, and the whole of it.
struct Suffix<'a> {
    boot: &'a str,
    list: &'a str,
    whole: &'a str,
}

impl Suffix<'_> {
    /// An error saying what is wrong with it.
    fn bad(&self, why: &str) -> String {
        format!("{why} in {:?}", self.whole)
    }
}

/// The suffix of `kind` in `message`: Ok(None) for a message without a suffix, Err when one is
/// there but not of the form this agent writes.
fn split_suffix<'a>(message: &'a str, kind: &str) -> Result<Option<Suffix<'a>>, String> {
    let Some(start) = message.rfind(OPEN) else {
        return Ok(None);
    };
    let whole = &message[start..];
    let bad = |why: &str| format!("{why} in {whole:?}");
    let body = whole[OPEN.len()..]
        .strip_suffix(']')
        .ok_or_else(|| bad("no closing bracket"))?;
    let (boot, list) = body
        .split_once(kind)
        .ok_or_else(|| bad(&format!("no{}list", kind.trim_start_matches(';'))))?;
    if boot.is_empty() || !boot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(bad("not a boot id"));
    }
    Ok(Some(Suffix { boot, list, whole }))
}

/// The suffix that carries `held` on boot `boot`; empty when nothing is held.
pub fn trailer(boot: &str, held: &HeldXids) -> String {
    let gpus: Vec<String> = held
        .iter()
        .map(|(uuid, xids)| {
            let xids: Vec<String> = xids.iter().map(u64::to_string).collect();
            format!("{uuid}={}", xids.join("+"))
        })
        .collect();
    suffix(boot, HELD, gpus)
}

/// What a message written by [`trailer`] carries: the boot and the held XIDs. Ok(None) for a
/// message without the suffix (nothing held, or not ours); Err when the suffix is there but not of
/// the form this agent writes.
pub fn parse(message: &str) -> Result<Option<(String, HeldXids)>, String> {
    let Some(suffix) = split_suffix(message, HELD)? else {
        return Ok(None);
    };
    let (boot, gpus, bad) = (suffix.boot, suffix.list, |why: &str| suffix.bad(why));
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

/// The boot a records' suffix was written on, and each model's record.
pub type BootRecords = (String, BTreeMap<String, CacheRecord>);

/// Whether a model's name can stand in the records' list (it is read back by its separators).
fn recordable(name: &str) -> bool {
    !name.is_empty() && !name.contains([',', ']', '@', ' '])
}

/// The suffix of `ModelCacheVerified`'s message that carries each verified model's record on boot
/// `boot`: `name=<against, 32 hex>@<hashed at, Unix s>:<bucket>.<bucket>...` (16 hex a bucket).
/// A model whose name holds `,`, `]`, `@` or a space has no record: a restart hashes it.
pub fn records_trailer(boot: &str, records: &BTreeMap<String, CacheRecord>) -> String {
    let items = records
        .iter()
        .filter(|(name, _)| recordable(name))
        .map(|(name, record)| {
            let against = hex::encode(record.against);
            let buckets: Vec<String> = record.buckets.iter().map(|b| format!("{b:016x}")).collect();
            format!(
                "{name}={against}@{}:{}",
                record.hashed_at,
                buckets.join(".")
            )
        })
        .collect();
    suffix(boot, VERIFIED, items)
}

/// What a message written by [`records_trailer`] carries: the boot and each model's record.
/// Ok(None) without the suffix; Err, naming what is wrong, when it is not of the form this agent
/// writes (one bad record refuses them all: the message was not written as a whole by it).
pub fn parse_records(message: &str) -> Result<Option<BootRecords>, String> {
    let Some(suffix) = split_suffix(message, VERIFIED)? else {
        return Ok(None);
    };
    let (boot, list, bad) = (suffix.boot, suffix.list, |why: &str| suffix.bad(why));
    let mut records = BTreeMap::new();
    for item in list.split(',') {
        if records.len() == MAX_RECORDS {
            return Err(bad("more records than a node has models"));
        }
        let (name, record) = item
            .rsplit_once('=')
            .ok_or_else(|| bad("a record without a model"))?;
        let (against, rest) = record
            .split_once('@')
            .ok_or_else(|| bad("a record without its time"))?;
        let (hashed_at, buckets) = rest
            .split_once(':')
            .ok_or_else(|| bad("a record without its fingerprint"))?;
        let against = hex::decode(against)
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or_else(|| bad("not a 32-digit hex digest"))?;
        let hashed_at = hashed_at.parse().map_err(|_| bad("not a Unix time"))?;
        let buckets = buckets
            .split('.')
            .map(|b| match b.len() {
                16 => u64::from_str_radix(b, 16).ok(),
                _ => None,
            })
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("not 16-digit hex buckets"))?;
        if !recordable(name) {
            return Err(bad("not a model name"));
        }
        records.insert(
            name.to_string(),
            CacheRecord {
                against,
                hashed_at,
                buckets,
            },
        );
    }
    Ok(Some((boot.to_string(), records)))
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

    fn record(hashed_at: u64) -> CacheRecord {
        CacheRecord {
            against: *b"0123456789abcdef",
            hashed_at,
            buckets: vec![0x0123_4567_89ab_cdef, 7, u64::MAX],
        }
    }

    #[test]
    fn records_written_are_read_back() {
        let records: BTreeMap<String, CacheRecord> = [
            ("llama-3.1-8b".to_string(), record(1_764_600_000)),
            ("meta-llama/Llama-3.1-8B".to_string(), record(5)),
        ]
        .into();
        let message = format!(
            "2 model cache(s) verified{}",
            records_trailer(BOOT, &records)
        );
        assert!(message.contains("; verified llama-3.1-8b=30313233343536373839616263646566@1764600000:0123456789abcdef.0000000000000007.ffffffffffffffff,meta-llama/"), "{message}");
        assert_eq!(
            parse_records(&message).unwrap(),
            Some((BOOT.to_string(), records))
        );
        assert_eq!(records_trailer(BOOT, &BTreeMap::new()), "");
        assert_eq!(
            records_trailer("", &[("a".to_string(), record(1))].into()),
            "",
            "no boot, no record"
        );
        assert_eq!(parse_records("1 model cache(s) verified").unwrap(), None);
        let unrecordable: BTreeMap<String, CacheRecord> = [("a,b".to_string(), record(1))].into();
        assert_eq!(records_trailer(BOOT, &unrecordable), "");
    }

    #[test]
    fn records_of_another_form_are_refused() {
        let good = "0123456789abcdef0123456789abcdef@5:0000000000000001";
        for message in [
            format!("x [mlnode-agent: boot 3f2b; verified m={good}"),
            format!("x [mlnode-agent: boot 3f2b; m={good}]"),
            "x [mlnode-agent: boot 3f2b; verified m=0123@5:0000000000000001]".to_string(),
            "x [mlnode-agent: boot 3f2b; verified m=0123456789abcdef0123456789abcdef@soon:0000000000000001]".to_string(),
            "x [mlnode-agent: boot 3f2b; verified m=0123456789abcdef0123456789abcdef@5:1]".to_string(),
            "x [mlnode-agent: boot 3f2b; verified m=0123456789abcdef0123456789abcdef@5]".to_string(),
            format!("x [mlnode-agent: boot 3f2b; verified {good}]"),
            format!("x [mlnode-agent: boot 3f2b; verified ={good}]"),
        ] {
            assert!(parse_records(&message).is_err(), "{message}");
        }
        let many: Vec<String> = (0..=MAX_RECORDS).map(|i| format!("m{i}={good}")).collect();
        let message = format!("x [mlnode-agent: boot 3f2b; verified {}]", many.join(","));
        assert!(parse_records(&message).is_err());
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
