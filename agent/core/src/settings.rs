//! The value types settings are read into, so that a setting that exists is valid: a duration or
//! count within its bounds ([`Within`]), a three-way switch ([`Toggle`]). Each subsystem owns its
//! settings type and declares its bounds beside it ([`bounds!`]); the config module only layers
//! the sources and says where a value came from.
//!
//! A check that needs two fields of one section (an interval no longer than the heartbeat) is
//! made as the section is read, and blames its field with [`invalid_field`]: the config loader
//! adds the field to the key it reports.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The inclusive bounds of a setting, and why they are what they are.
pub trait Bounds: 'static {
    type Value: Bounded;
    const MIN: Self::Value;
    const MAX: Self::Value;
    /// Said after the bounds when a value is refused; empty when they speak for themselves.
    const WHY: &'static str = "";
}

/// A kind of value a setting can be bounded in: how it is read, written and shown.
pub trait Bounded: Copy + PartialOrd + fmt::Debug + Sized {
    fn show(&self) -> String;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
    fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    fn parse(text: &str) -> Result<Self, String>;
}

/// Durations as people write them in YAML: "500ms", "30s", "24h".
impl Bounded for Duration {
    fn show(&self) -> String {
        humantime::format_duration(*self).to_string()
    }

    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }

    fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.show())
    }

    fn parse(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text).map_err(|e| {
            format!("{text:?} is not a duration such as \"500ms\", \"30s\" or \"24h\": {e}")
        })
    }
}

macro_rules! bounded_integer {
    ($($int:ty),*) => {$(
        impl Bounded for $int {
            fn show(&self) -> String {
                self.to_string()
            }

            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                <$int>::deserialize(deserializer)
            }

            fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.serialize(serializer)
            }

            fn parse(text: &str) -> Result<Self, String> {
                text.parse().map_err(|e| format!("{text:?} is not a whole number: {e}"))
            }
        }
    )*};
}
bounded_integer!(u32, usize);

/// A value of `B::Value` between `B::MIN` and `B::MAX`, checked wherever one is made: from YAML,
/// from a flag ([`std::str::FromStr`]) or in code ([`Within::new`]).
pub struct Within<B: Bounds>(B::Value, PhantomData<B>);

impl<B: Bounds> Within<B> {
    pub fn new(value: B::Value) -> Result<Self, String> {
        if value < B::MIN || value > B::MAX {
            let why = match B::WHY {
                "" => String::new(),
                why => format!(": {why}"),
            };
            return Err(format!(
                "{} is out of bounds: must be between {} and {}{why}",
                value.show(),
                B::MIN.show(),
                B::MAX.show()
            ));
        }
        Ok(Within(value, PhantomData))
    }

    /// A built-in default, which a test of each section's `Default` keeps within bounds.
    pub fn default_of(value: B::Value) -> Self {
        Self::new(value).unwrap_or_else(|why| unreachable!("a default setting: {why}"))
    }

    pub fn get(&self) -> B::Value {
        self.0
    }
}

impl<B: Bounds> Deref for Within<B> {
    type Target = B::Value;

    fn deref(&self) -> &B::Value {
        &self.0
    }
}

impl<B: Bounds> Clone for Within<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Bounds> Copy for Within<B> {}

impl<B: Bounds> PartialEq for Within<B> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<B: Bounds> fmt::Debug for Within<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<B: Bounds> fmt::Display for Within<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.show())
    }
}

impl<B: Bounds> std::str::FromStr for Within<B> {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::new(B::Value::parse(text)?)
    }
}

impl<B: Bounds> Serialize for Within<B> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.write(serializer)
    }
}

impl<'de, B: Bounds> Deserialize<'de> for Within<B> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::new(B::Value::read(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Declares the bounds of settings: `Name: Type = MIN ..= MAX`, optionally `, "why"`.
#[macro_export]
macro_rules! bounds {
    ($($(#[$doc:meta])* $vis:vis $name:ident: $value:ty = $min:expr, $max:expr $(, $why:literal)?;)*) => {$(
        $(#[$doc])*
        $vis struct $name;

        impl $crate::settings::Bounds for $name {
            type Value = $value;
            const MIN: $value = $min;
            const MAX: $value = $max;
            $(const WHY: &'static str = $why;)?
        }
    )*};
}
pub use crate::bounds;

/// Durations for bounds and defaults, which must be constants.
pub const fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub const fn seconds(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A delay drawn up to `limit` (a configured jitter), different in each process: std's hasher is
/// keyed randomly per process, so the agents a rollout starts together draw different delays.
pub fn jitter(limit: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let draw = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    limit.mul_f64((draw >> 11) as f64 / (1u64 << 53) as f64)
}

pub const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

pub const fn hours(n: u64) -> Duration {
    Duration::from_secs(n * 3600)
}

pub const fn days(n: u64) -> Duration {
    Duration::from_secs(n * 24 * 3600)
}

/// Set between the field and the reason of an error that blames one field of a section.
const FIELD_MARK: char = '\u{1f}';

/// An error raised while a section is read that blames `field` of it (`interval`, or `[1].name`
/// in a list); the config loader reports it at that field's key.
pub fn invalid_field<E: serde::de::Error>(field: &str, reason: impl fmt::Display) -> E {
    E::custom(format!("{FIELD_MARK}{field}{FIELD_MARK}{reason}"))
}

/// The field an error from [`invalid_field`] blames, and its reason; `None` for other errors.
pub fn blamed_field(message: &str) -> Option<(&str, &str)> {
    message.strip_prefix(FIELD_MARK)?.split_once(FIELD_MARK)
}

/// `auto` (use it where it is present), `true` (use it; its absence is logged as an error), `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toggle {
    Auto,
    On,
    Off,
}

impl Serialize for Toggle {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Toggle::Auto => serializer.serialize_str("auto"),
            Toggle::On => serializer.serialize_bool(true),
            Toggle::Off => serializer.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Toggle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bool(true) => Ok(Toggle::On),
            Raw::Bool(false) => Ok(Toggle::Off),
            Raw::Text(t) if t == "auto" => Ok(Toggle::Auto),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "{t:?}: expected auto, true or false"
            ))),
        }
    }
}

/// A setting written as a number or as text (`100MiB`, `auto`).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum NumberOrText {
    Number(u64),
    Text(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    bounds! {
        Debounce: Duration = Duration::ZERO, seconds(30), "a longer debounce hides a fault";
        Threads: usize = 0, 256;
    }

    #[test]
    fn a_bounded_value_is_refused_outside_its_bounds_saying_them_and_why() {
        assert_eq!(*Within::<Threads>::new(256).unwrap(), 256);
        assert_eq!(
            Within::<Threads>::new(257).unwrap_err(),
            "257 is out of bounds: must be between 0 and 256"
        );
        assert_eq!(
            "1m".parse::<Within<Debounce>>().unwrap_err(),
            "1m is out of bounds: must be between 0s and 30s: a longer debounce hides a fault"
        );
        assert!("soon"
            .parse::<Within<Debounce>>()
            .unwrap_err()
            .contains("not a duration"));
        let read: Within<Debounce> = serde_json::from_str("\"250ms\"").unwrap();
        assert_eq!(read.get(), Duration::from_millis(250));
        assert_eq!(serde_json::to_string(&read).unwrap(), "\"250ms\"");
        let refused = serde_json::from_str::<Within<Threads>>("1000").unwrap_err();
        assert!(refused.to_string().contains("must be between 0 and 256"));
    }

    #[test]
    fn a_field_error_carries_its_field_and_nothing_else_does() {
        let e: serde_json::Error = invalid_field("interval", "longer than the heartbeat");
        assert_eq!(
            blamed_field(&e.to_string()),
            Some(("interval", "longer than the heartbeat"))
        );
        assert_eq!(blamed_field("invalid type: string"), None);
    }
}
