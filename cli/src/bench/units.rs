//! Sizes as the bench's messages print them. A leaf: the modules that
//! check a job (`limits`, `target`) and the report share them without
//! naming one another.

/// `n` bytes in GiB or MiB with one decimal.
pub fn human(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// `n` bytes in the largest binary unit that divides it (`4KiB`,
/// `1024MiB`), else bytes.
pub fn fmt_bytes(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}B")
}
