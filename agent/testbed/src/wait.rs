//! Waiting for an observable condition, shared by the tests and the benchmarks.

/// The one way a test waits: polls `poll` every 50 ms until it gives `Ok`, and fails after
/// `limit` with `what` and the last state `poll` saw. Never a fixed sleep standing for a condition.
pub fn wait_until<T>(
    what: &str,
    limit: std::time::Duration,
    mut poll: impl FnMut() -> Result<T, String>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        match poll() {
            Ok(value) => return value,
            Err(state) if started.elapsed() > limit => {
                panic!("{what}: not within {limit:?}\n{state}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}
