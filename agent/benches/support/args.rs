//! A bench's numeric flags (`--agents 300`): a flag given without a number is refused by name.

/// The number after `name` on the command line, else `default`.
pub fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
        })
        .unwrap_or(default)
}
