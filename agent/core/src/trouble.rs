//! What a retrying loop says of its trouble: a failure when it is news (the first, or a reason other
//! than the one last said), and its recovery once. A watch that fails every second for an hour, or
//! a socket that stays absent, is one line in the log, not thousands; its recovery is one more.
//! The loops keep their own back-off and their own words: this is only what was said.

/// The trouble a loop last said, if it is failing.
#[derive(Debug, Default)]
pub struct Trouble(Option<String>);

impl Trouble {
    /// The loop failed for `reason`: it, to be said, when it is news; None when it is the trouble
    /// already said.
    pub fn failed(&mut self, reason: impl Into<String>) -> Option<&str> {
        let reason = reason.into();
        if self.0.as_deref() == Some(reason.as_str()) {
            return None;
        }
        self.0 = Some(reason);
        self.0.as_deref()
    }

    /// The loop worked: true, to be said, when it had been failing.
    pub fn recovered(&mut self) -> bool {
        self.0.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_said_when_new_and_its_recovery_once() {
        let mut trouble = Trouble::default();
        assert!(!trouble.recovered(), "nothing to recover from");
        assert_eq!(
            trouble.failed("connection refused"),
            Some("connection refused")
        );
        assert_eq!(
            trouble.failed("connection refused"),
            None,
            "the same, again: quiet"
        );
        assert_eq!(
            trouble.failed("403 Forbidden"),
            Some("403 Forbidden"),
            "another reason is news"
        );
        assert!(trouble.recovered());
        assert!(!trouble.recovered(), "said once");
        assert_eq!(
            trouble.failed("403 Forbidden"),
            Some("403 Forbidden"),
            "failing again after a recovery is news"
        );
    }
}
