//! Sizes as the bench's messages print them. A leaf: the modules that
//! check a job (`limits`, `target`) and the report share it without
//! naming one another.

/// `n` bytes in GiB or MiB with one decimal.
pub fn human(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}
