//! Latency summaries and process measurements from `/proc`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch (the writers' timestamps are wall
/// clock, so that a watcher in another process could read them too).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Percentiles of a set of latencies (microseconds).
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub count: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

impl Summary {
    /// Summarizes `micros` (sorted in place).
    pub fn of(micros: &mut [u32]) -> Summary {
        if micros.is_empty() {
            return Summary::default();
        }
        micros.sort_unstable();
        let at = |q: f64| {
            let i = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
            u64::from(micros[i])
        };
        let sum: u64 = micros.iter().map(|&m| u64::from(m)).sum();
        Summary {
            count: micros.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: u64::from(micros[micros.len() - 1]),
            mean: sum as f64 / micros.len() as f64,
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={} p90={} p99={} max={} mean={}",
            self.count,
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max),
            ms(self.mean as u64)
        )
    }
}

/// Microseconds as `1.234ms`.
pub fn ms(micros: u64) -> String {
    format!("{:.3}ms", micros as f64 / 1000.0)
}

/// A duration in microseconds, saturating at `u32::MAX` (71 minutes).
pub fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Resident set size of `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size of `pid` in bytes (`VmHWM`).
pub fn peak_rss_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident set size of this process in bytes (`/proc/self/statm`,
/// resident pages × 4 KiB).
pub fn rss_self() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// CPU time (user + system) of `pid` so far, from `/proc/<pid>/stat`,
/// assuming the usual 100 clock ticks per second.
pub fn cpu_of(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may
    // contain spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, so 11 and
    // 12 after the state field (index 0 here).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<u32> = (1..=100).collect();
        let s = Summary::of(&mut v);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50, 90, 99, 100));
        assert!(rss_self().is_some_and(|r| r > 0));
        assert!(cpu_of(std::process::id()).is_some());
    }
}
