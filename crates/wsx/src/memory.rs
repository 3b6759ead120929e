//! Memory the allocator keeps after a wave of sessions ends, handed back to the kernel.
//!
//! glibc's `malloc` gives freed memory back to the kernel on its own only from the top of
//! its main heap. What a wave of sessions allocated elsewhere (in the middle of a heap, and
//! in the other arenas the runtime's threads use) stays resident once the sessions end:
//! 10,000 SMB sessions held through both gateways left them at 230-260 MB of RSS after
//! closing, against 21 MB idle. Every [`CHECK`] the daemon asks the allocator how many
//! bytes it holds free (`mallinfo2`), and when that has grown by [`RELEASE_ABOVE`] since
//! the last release, `malloc_trim` gives the free pages back. The allocator keeps its free
//! chunks (only their pages go), so its count of free bytes stays where it was: the next
//! release waits for as much again to be freed, and a wave that reuses the chunks lowers
//! the mark it is counted from.
//!
//! A trim walks every arena under its lock, so a thread that allocates meanwhile waits:
//! the gateway's data path does not allocate per packet, and the trim runs only after a
//! wave (measured: BENCHMARKS.md, "Ten thousand SMB sessions").
//!
//! Other C libraries and allocators do without: on them this does nothing.

use std::time::Duration;

/// How often the allocator's free bytes are looked at.
pub(crate) const CHECK: Duration = Duration::from_secs(5);

/// Free bytes, beyond those after the last release, that are worth a trim.
pub(crate) const RELEASE_ABOVE: u64 = 32 << 20;

/// Hands freed memory back to the kernel after each wave of sessions, until dropped; ends
/// at once where the allocator cannot say what it holds free.
pub(crate) async fn release_after_waves() {
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut mark = None;
    loop {
        tick.tick().await;
        let checked = tokio::task::spawn_blocking(move || {
            let outcome = release_if_grown(&mut mark);
            (outcome, mark)
        })
        .await;
        let Ok((outcome, moved)) = checked else {
            continue;
        };
        mark = moved;
        match outcome {
            None => return,
            Some(Some(release)) => tracing::info!(
                free_mib = release.free >> 20,
                rss_before_mib = release.rss_before >> 20,
                rss_after_mib = release.rss_after >> 20,
                took_ms = u64::try_from(release.took.as_millis()).unwrap_or(u64::MAX),
                "memory freed by ended sessions given back to the kernel"
            ),
            Some(None) => {}
        }
    }
}

/// What one release did.
#[derive(Debug)]
pub(crate) struct Release {
    /// The allocator's free bytes when it began.
    pub(crate) free: u64,
    pub(crate) rss_before: u64,
    pub(crate) rss_after: u64,
    pub(crate) took: Duration,
}

/// Whether `free` bytes held free by the allocator are worth a trim: [`RELEASE_ABOVE`]
/// more than at `mark` (the free bytes after the last trim, or the fewest seen since, or
/// at the first look). Fewer than at the mark (the freed memory was used again) lower it.
fn worth_a_trim(mark: &mut Option<u64>, free: u64) -> bool {
    let base = *mark.get_or_insert(free);
    if free < base {
        *mark = Some(free);
    }
    free.saturating_sub(base) >= RELEASE_ABOVE
}

/// Trims the allocator if [`worth_a_trim`]; `None` where the allocator cannot say what it
/// holds free (not glibc), else what was done.
fn release_if_grown(mark: &mut Option<u64>) -> Option<Option<Release>> {
    let free = allocator::free_bytes()?;
    if !worth_a_trim(mark, free) {
        return Some(None);
    }
    let rss_before = resident_bytes().unwrap_or(0);
    let started = std::time::Instant::now();
    allocator::trim();
    let took = started.elapsed();
    *mark = allocator::free_bytes();
    Some(Some(Release {
        free,
        rss_before,
        rss_after: resident_bytes().unwrap_or(0),
        took,
    }))
}

/// The process's resident bytes (`/proc/self/statm`).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator {
    /// Bytes the allocator holds free, in all its arenas.
    pub(super) fn free_bytes() -> Option<u64> {
        // SAFETY: mallinfo2 takes no arguments and only reads the allocator's state under
        // its locks; glibc has it since 2.33 (Debian 12 ships 2.36).
        let info = unsafe { libc::mallinfo2() };
        u64::try_from(info.fordblks).ok()
    }

    /// Gives the free pages of every arena back to the kernel.
    pub(super) fn trim() {
        // SAFETY: malloc_trim takes a byte count and touches only the allocator's own
        // free memory, under its locks.
        unsafe { libc::malloc_trim(0) };
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod allocator {
    pub(super) fn free_bytes() -> Option<u64> {
        None
    }

    pub(super) fn trim() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_worth_it_once_a_wave_more_is_free_than_at_the_mark() {
        let mib = |n: u64| n << 20;
        let mut mark = None;
        assert!(
            !worth_a_trim(&mut mark, mib(10)),
            "the first look sets the mark"
        );
        assert!(!worth_a_trim(&mut mark, mib(41)));
        assert!(worth_a_trim(&mut mark, mib(42)));
        // After the trim the mark is what is free then (the chunks stay): nothing new.
        mark = Some(mib(42));
        assert!(!worth_a_trim(&mut mark, mib(60)));
        // A wave that used the free memory again lowers the mark; what it frees counts
        // from there.
        assert!(!worth_a_trim(&mut mark, mib(5)));
        assert_eq!(mark, Some(mib(5)));
        assert!(!worth_a_trim(&mut mark, mib(36)));
        assert!(worth_a_trim(&mut mark, mib(37)));
    }

    /// Memory a wave of small blocks freed in the middle of a heap goes back to the kernel.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_freed_wave_leaves_the_resident_set() {
        let mut mark = allocator::free_bytes();
        assert!(mark.is_some(), "glibc says how much it holds free");
        // Sessions' state is many small blocks; keeping every 64th holds the heap's top,
        // so that glibc's own trim of the top cannot give the rest back.
        let blocks: Vec<Vec<u8>> = (0..40_000u32)
            .map(|i| vec![u8::try_from(i % 251).unwrap_or(0); 2048])
            .collect();
        let kept: Vec<Vec<u8>> = blocks
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| (i % 64 == 63).then_some(b))
            .collect();
        let release = release_if_grown(&mut mark)
            .expect("glibc says how much it holds free")
            .expect("80 MB freed is worth a trim");
        assert!(release.free >= RELEASE_ABOVE, "{release:?}");
        assert!(
            release.rss_after + (32 << 20) < release.rss_before,
            "the free pages left the resident set: {release:?}"
        );
        assert_eq!(kept.len(), 625);
    }
}
