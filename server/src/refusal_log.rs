//! Refusals in the log: a line each, until a flood of them would flood the log. Each kind (a
//! close code or HTTP status) gets a burst of lines and then one a second; the next line logged
//! of a kind says how many of it were not. The metrics count every refusal whatever the log
//! shows.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::log::log;

/// Lines of one kind logged at once before the log holds back.
pub const BURST: u64 = 10;
/// After the burst, one line of a kind each this long.
pub const EVERY: Duration = Duration::from_secs(1);

/// The server's refusal log.
static REFUSALS: RefusalLog = RefusalLog::new();

/// Logs `line`, a refusal of `kind` (its close code or HTTP status), unless this kind has had its
/// lines for now; made only when it is logged.
pub fn refused(kind: u16, line: impl FnOnce() -> String) {
    if let Some(unlogged) = REFUSALS.take(kind, Instant::now()) {
        let line = line();
        if unlogged == 0 {
            log!("{line}");
        } else {
            log!("{line} ({unlogged} refusals with {kind} before it not logged)");
        }
    }
}

/// Each kind's lines left now, when they were last given back, and the refusals not logged.
struct Kind {
    lines: u64,
    since: Instant,
    unlogged: u64,
}

/// Which refusals get a line (a token bucket a kind).
pub struct RefusalLog {
    /// Kinds are codes of the server's own: a few, whatever clients send.
    kinds: Mutex<BTreeMap<u16, Kind>>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self::new()
    }
}

impl RefusalLog {
    pub const fn new() -> Self {
        Self {
            kinds: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether a refusal of `kind` at `now` gets a line: Some(the refusals of its kind before it
    /// that got none), or None (it is counted for the next line).
    pub fn take(&self, kind: u16, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let kind = kinds.entry(kind).or_insert(Kind {
            lines: BURST,
            since: now,
            unlogged: 0,
        });
        let periods = (now.saturating_duration_since(kind.since).as_nanos() / EVERY.as_nanos()) as u64;
        if periods > 0 {
            kind.lines = kind.lines.saturating_add(periods).min(BURST);
            kind.since = now;
        }
        if kind.lines == 0 {
            kind.unlogged += 1;
            return None;
        }
        kind.lines -= 1;
        Some(std::mem::take(&mut kind.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_gets_a_burst_and_then_a_line_a_second_that_counts_the_rest() {
        let log = RefusalLog::new();
        let start = Instant::now();
        for _ in 0..BURST {
            assert_eq!(log.take(503, start), Some(0));
        }
        for _ in 0..1000 {
            assert_eq!(log.take(503, start + Duration::from_millis(500)), None);
        }
        // Another kind has lines of its own.
        assert_eq!(log.take(4400, start), Some(0));
        // A second on: one line, which says how many were not logged.
        assert_eq!(log.take(503, start + EVERY), Some(1000));
        assert_eq!(log.take(503, start + EVERY), None);
        assert_eq!(log.take(503, start + EVERY + EVERY / 2), None);
        assert_eq!(log.take(503, start + 2 * EVERY), Some(2));
        // Quiet for long, the burst is back, no more.
        let later = start + 60 * EVERY;
        for _ in 0..BURST {
            assert_eq!(log.take(503, later), Some(0));
        }
        assert_eq!(log.take(503, later), None);
    }
}
