//! Memory the allocator keeps after a wave of sessions ends, handed back to the kernel.
//!
//! glibc's `malloc` gives freed memory back to the kernel on its own only at the top of a
//! heap (and for large blocks, which it maps by themselves). What a wave of sessions
//! allocated below the top of a heap, in the main arena and in the others the runtime's
//! threads use, stays resident once the sessions end: 10,000 SMB sessions held through
//! both gateways left them at 230-260 MB of RSS after closing, against 21 MB idle. Every
//! [`CHECK`] the daemon asks the allocator how many bytes it holds free (`mallinfo2`) and
//! reads its own resident size, and calls `malloc_trim`, which gives the free pages back,
//! when either has grown by [`RELEASE_ABOVE`] since the last trim, or the free bytes by
//! [`RELEASE_SETTLED`] and then held still for a look (the tail of a wave, freed after its
//! last trim: see [`worth_a_trim`]).
//!
//! Both calls walk the allocator's arenas, each under its lock, so a thread that allocates
//! meanwhile waits: the look takes little (it counts the free chunks), a trim 10-55 ms
//! after 10,000 sessions (BENCHMARKS.md, "Ten thousand SMB sessions"); the gateway's data
//! path does not allocate per packet.
//!
//! Other C libraries and allocators, and glibc before 2.33 (no `mallinfo2`), do without:
//! there this does nothing.

use std::time::Duration;

/// How often the allocator's free bytes are looked at.
pub(crate) const CHECK: Duration = Duration::from_secs(5);

/// Growth, of the free bytes or of the resident size since the last trim, worth a trim.
pub(crate) const RELEASE_ABOVE: u64 = 32 << 20;

/// Growth of the free bytes since the last trim worth a trim once they hold still: the
/// sessions of a wave that end after its last trim free less than [`RELEASE_ABOVE`]
/// (10,000 SMB sessions: 20-40 MiB), and a wave is over when nothing more is freed.
pub(crate) const RELEASE_SETTLED: u64 = 4 << 20;

/// Free bytes that moved by less than this between two looks held still.
const STILL: u64 = 1 << 20;

/// Hands freed memory back to the kernel after each wave of sessions, until dropped; ends
/// at once where the allocator cannot say what it holds free.
pub(crate) async fn release_after_waves() {
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut mark = Mark::default();
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
                in_use_mib = release.in_use >> 20,
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
    /// The bytes it had given out then (live blocks, the large ones it mapped included).
    pub(crate) in_use: u64,
    pub(crate) rss_before: u64,
    pub(crate) rss_after: u64,
    pub(crate) took: Duration,
}

/// Where the last trim left the allocator's free bytes (or the fewest seen since) and the
/// resident size, and the free bytes at the last look; unset before the first look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Mark {
    free: Option<u64>,
    rss: Option<u64>,
    seen: Option<u64>,
}

impl Mark {
    /// Where a trim that left `free` bytes free and `rss` resident sets the mark.
    fn after_trim(free: Option<u64>, rss: u64) -> Self {
        Self {
            free,
            rss: Some(rss),
            seen: free,
        }
    }
}

/// Whether a trim is worth it with `free` bytes held free by the allocator and `rss`
/// resident: the free bytes have grown by [`RELEASE_ABOVE`] since the mark (a wave ended),
/// or by [`RELEASE_SETTLED`] and moved by less than [`STILL`] since the last look (the
/// rest of a wave ended), or the resident size has grown by [`RELEASE_ABOVE`], with at
/// least that much free (a wave reused the trimmed chunks, faulting their pages in again,
/// and ended between two looks: the free bytes are back where they were). Fewer free
/// bytes than at the mark lower it.
fn worth_a_trim(mark: &mut Mark, free: u64, rss: u64) -> bool {
    let base = *mark.free.get_or_insert(free);
    if free < base {
        mark.free = Some(free);
    }
    let still = mark
        .seen
        .replace(free)
        .is_some_and(|seen| seen.abs_diff(free) < STILL);
    let grown = free.saturating_sub(base);
    let freed = grown >= RELEASE_ABOVE;
    let settled = still && grown >= RELEASE_SETTLED;
    let regrown = free >= RELEASE_ABOVE
        && mark
            .rss
            .is_some_and(|r| rss.saturating_sub(r) >= RELEASE_ABOVE);
    freed || settled || regrown
}

/// Trims the allocator if [`worth_a_trim`]; `None` where the allocator cannot say what it
/// holds free, else what was done.
fn release_if_grown(mark: &mut Mark) -> Option<Option<Release>> {
    let (free, in_use) = allocator::usage()?;
    let rss_before = resident_bytes().unwrap_or(0);
    if !worth_a_trim(mark, free, rss_before) {
        return Some(None);
    }
    let started = std::time::Instant::now();
    allocator::trim();
    let took = started.elapsed();
    let rss_after = resident_bytes().unwrap_or(0);
    let free_after = allocator::usage().map(|(free, _)| free);
    *mark = Mark::after_trim(free_after, rss_after);
    Some(Some(Release {
        free,
        in_use,
        rss_before,
        rss_after,
        took,
    }))
}

/// The process's resident bytes (`/proc/self/statm`, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0)?)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator {
    use std::sync::OnceLock;

    type Mallinfo2 = unsafe extern "C" fn() -> libc::mallinfo2;

    /// glibc's `mallinfo2`, looked up when first wanted: glibc has it from 2.33 on, and a
    /// gateway built against an older one still links and runs, without this.
    fn mallinfo2() -> Option<Mallinfo2> {
        static FOUND: OnceLock<Option<Mallinfo2>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only searches the
            // loaded objects; a non-null result is glibc's `mallinfo2`, whose signature is
            // `struct mallinfo2 mallinfo2(void)`, so it may be called as a `Mallinfo2`.
            unsafe {
                let symbol = libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr());
                (!symbol.is_null())
                    .then(|| std::mem::transmute::<*mut libc::c_void, Mallinfo2>(symbol))
            }
        })
    }

    /// Bytes the allocator holds free in all its arenas, and bytes it has given out
    /// (in its arenas and in blocks it mapped by themselves).
    pub(super) fn usage() -> Option<(u64, u64)> {
        let mallinfo2 = mallinfo2()?;
        // SAFETY: mallinfo2 takes no arguments and only reads the allocator's state under
        // its locks.
        let info = unsafe { mallinfo2() };
        let in_use = info.uordblks.saturating_add(info.hblkhd);
        Some((
            u64::try_from(info.fordblks).ok()?,
            u64::try_from(in_use).ok()?,
        ))
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
    pub(super) fn usage() -> Option<(u64, u64)> {
        None
    }

    pub(super) fn trim() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_worth_it_once_a_wave_more_is_free_or_resident_than_at_the_mark() {
        let mib = |n: u64| n << 20;
        let mut mark = Mark::default();
        assert!(
            !worth_a_trim(&mut mark, mib(10), mib(50)),
            "the first look sets it"
        );
        assert!(!worth_a_trim(&mut mark, mib(41), mib(50)));
        assert!(worth_a_trim(&mut mark, mib(42), mib(50)));
        // After the trim the mark is what is free and resident then (the chunks stay).
        mark = Mark::after_trim(Some(mib(42)), mib(30));
        assert!(!worth_a_trim(&mut mark, mib(60), mib(40)));
        // A wave that used the free memory again lowers the mark; what it frees counts
        // from there.
        assert!(!worth_a_trim(&mut mark, mib(5), mib(61)));
        assert_eq!(mark.free, Some(mib(5)));
        assert!(worth_a_trim(&mut mark, mib(37), mib(40)));
        // A wave that came and went between two looks: as much free as at the mark, but
        // its pages resident again.
        mark = Mark::after_trim(Some(mib(42)), mib(30));
        assert!(!worth_a_trim(&mut mark, mib(42), mib(61)));
        assert!(worth_a_trim(&mut mark, mib(42), mib(62)));
        // Not with too little free to give back, however large the process grew.
        assert!(!worth_a_trim(&mut mark, mib(20), mib(500)));
    }

    #[test]
    fn the_tail_of_a_wave_is_trimmed_once_nothing_more_is_freed() {
        let mib = |n: u64| n << 20;
        let mut mark = Mark::after_trim(Some(mib(100)), mib(80));
        // The last sessions of a wave end after its last trim: less than a trim's worth.
        assert!(!worth_a_trim(&mut mark, mib(110), mib(80)));
        assert!(!worth_a_trim(&mut mark, mib(120), mib(80)));
        // Nothing more freed since the last look: the wave is over.
        assert!(worth_a_trim(&mut mark, mib(120) + mib(1) / 2, mib(80)));
        // Still, but too little grown to be worth a trim.
        let mut mark = Mark::after_trim(Some(mib(100)), mib(80));
        assert!(!worth_a_trim(&mut mark, mib(103), mib(80)));
        assert!(!worth_a_trim(&mut mark, mib(103), mib(80)));
    }

    /// Memory a wave of small blocks freed below the top of a heap goes back to the
    /// kernel.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_freed_wave_leaves_the_resident_set() {
        // Sessions' state is many small blocks; keeping every 64th holds the heap's top,
        // so that glibc's own trim of the top cannot give the rest back.
        let blocks: Vec<Vec<u8>> = (0..40_000u32)
            .map(|i| vec![u8::try_from(i % 251).unwrap_or(0); 2048])
            .collect();
        // The mark once the wave is in (whatever this thread's arena held free before).
        let mut mark = Mark {
            free: allocator::usage().map(|(free, _)| free),
            ..Mark::default()
        };
        assert!(mark.free.is_some(), "glibc says how much it holds free");
        let kept: Vec<Vec<u8>> = blocks
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| (i % 64 == 63).then_some(b))
            .collect();
        let release = release_if_grown(&mut mark)
            .expect("glibc says how much it holds free")
            .expect("80 MB freed is worth a trim");
        assert!(
            release.rss_after + (32 << 20) < release.rss_before,
            "the free pages left the resident set: {release:?}"
        );
        assert_eq!(kept.len(), 625);
    }
}
