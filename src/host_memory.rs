//! Host memory for functional runs: a functional run holds every tensor's values on the host, so
//! one whose data would not fit is refused up front (naming the flags and `--cost-only`) instead
//! of being killed by the OOM killer halfway.

/// Environment variable that overrides the available host memory, in bytes (tests, and machines
/// where `/proc/meminfo` does not tell the truth, e.g. inside a memory-limited container).
pub const HOST_MEMORY_ENV: &str = "DAY0_HOST_MEMORY_BYTES";

/// Host memory available to a new run: [`HOST_MEMORY_ENV`] if set, else Linux's `MemAvailable`;
/// `None` where neither is known (then nothing is refused).
pub fn available_bytes() -> Option<u64> {
    if let Some(v) = std::env::var(HOST_MEMORY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Some(v);
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

/// Refuses a functional run of `what` that needs about `need` bytes of host memory when fewer are
/// available; the error says how much, and what to do instead (`fix`).
pub fn check(need: u64, what: &str, fix: &str) -> Result<(), String> {
    match available_bytes() {
        Some(have) if need > have => Err(format!(
            "{what} needs about {:.1} GB of host memory for its values, but {:.1} GB are \
             available: {fix}",
            need as f64 / 1e9,
            have as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// Bytes a functional kernel run holds for tensors of `elements` values in all: each value as
/// f32 on the device, an f64 copy for the reference, the reference's own output, with slack
/// (16 bytes a value), saturating rather than overflowing for absurd shapes.
pub fn functional_bytes(elements: &[u128]) -> u64 {
    let total = elements
        .iter()
        .fold(0u128, |a, e| a.saturating_add(*e))
        .saturating_mul(16);
    u64::try_from(total).unwrap_or(u64::MAX)
}
