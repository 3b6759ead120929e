//! Which stream sends next: the [`Scheduler`] trait and its default, [`RoundRobin`].
//!
//! The stream layer keeps the streams and their buffers; a scheduler keeps only the order of
//! the streams that have something to send. Filling a packet, the stream layer asks
//! [`Scheduler::next`] for a turn, writes one frame for that stream (no more than the turn's
//! `max_bytes` and the packet's room), and reports it with [`Scheduler::sent`]. The shaper
//! (`wsx-shaper`) implements the trait for priorities, rates and per-flow fairness; the
//! tunnel's own default shares the bytes equally among streams.

use crate::wire::StreamId;
use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

/// One stream's turn: it may send one frame of at most `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    pub id: StreamId,
    /// The most this turn may carry; the packet's room limits it too.
    pub max_bytes: usize,
}

/// Orders the streams that have something to send.
///
/// The stream layer calls [`push`](Scheduler::push) once when a stream starts to want to
/// send (never twice without a `sent(.., false)` or [`remove`](Scheduler::remove) between),
/// and `remove` when it is reset or closed while queued.
///
/// A scheduler may hold queued streams back (a rate): [`next`](Scheduler::next) then returns
/// `None` although streams are queued, and [`poll_timeout`](Scheduler::poll_timeout) says
/// when to ask again. The connection wakes up then (not before, so a held stream costs no
/// spinning), and counts the time held like time without data to send, so that the
/// congestion controller does not read a held sender as a slow path.
pub trait Scheduler: fmt::Debug + Send {
    /// The stream has something to send.
    fn push(&mut self, id: StreamId);
    /// The stream to serve at `now`, if any is queued and may send.
    fn next(&mut self, now: Instant) -> Option<Turn>;
    /// The stream of the last turn sent `bytes` at `now`; `more` says whether it still has
    /// something to send (if not, it leaves the queue).
    fn sent(&mut self, id: StreamId, bytes: usize, more: bool, now: Instant);
    /// The stream no longer has anything to send (reset, closed, out of credit).
    fn remove(&mut self, id: StreamId);
    fn is_empty(&self) -> bool;
    /// When a queued stream may get a turn, if the scheduler holds them all back now;
    /// `None` if a queued stream may send whenever the connection can (the default).
    fn poll_timeout(&self, _now: Instant) -> Option<Instant> {
        None
    }
}

/// Bytes of credit a stream gets per round-robin round: about one packet.
const QUANTUM: i64 = 1200;

/// Deficit round robin (Shreedhar and Varghese, 1995) with equal quanta: every queued stream
/// gets the same bytes per round whatever the size of its frames, so a stream that sends
/// less than its share keeps what it uses and the rest goes to the others.
#[derive(Debug, Default)]
pub struct RoundRobin {
    /// Queued streams with their deficit, the one being served at the front.
    queue: VecDeque<(StreamId, i64)>,
}

impl RoundRobin {
    /// Whether `id` is queued.
    pub fn contains(&self, id: StreamId) -> bool {
        self.queue.iter().any(|&(s, _)| s == id)
    }
}

impl Scheduler for RoundRobin {
    fn push(&mut self, id: StreamId) {
        self.queue.push_back((id, 0));
    }

    fn next(&mut self, _now: Instant) -> Option<Turn> {
        loop {
            let (id, deficit) = self.queue.front_mut()?;
            if *deficit > 0 {
                // A turn is one frame; what it takes beyond the deficit is owed next round.
                return Some(Turn {
                    id: *id,
                    max_bytes: usize::MAX,
                });
            }
            *deficit += QUANTUM;
            self.queue.rotate_left(1);
        }
    }

    fn sent(&mut self, id: StreamId, bytes: usize, more: bool, _now: Instant) {
        let Some(front) = self.queue.front_mut().filter(|(f, _)| *f == id) else {
            return;
        };
        front.1 -= bytes as i64;
        if !more {
            self.queue.pop_front();
        }
    }

    fn remove(&mut self, id: StreamId) {
        if self.queue.front().is_some_and(|(f, _)| *f == id) {
            self.queue.pop_front();
        } else {
            self.queue.retain(|(s, _)| *s != id);
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn now() -> Instant {
        crate::test_epoch()
    }

    /// Serves `streams` (id, bytes to send) with frames of `frame` bytes until all are done;
    /// returns the order of turns.
    fn serve(scheduler: &mut dyn Scheduler, streams: &[(u64, usize)], frame: usize) -> Vec<u64> {
        let mut left: HashMap<u64, usize> = streams.iter().copied().collect();
        for &(id, _) in streams {
            scheduler.push(StreamId(id));
        }
        let mut turns = Vec::new();
        let now = now();
        while let Some(turn) = scheduler.next(now) {
            let rest = left.get_mut(&turn.id.0).expect("a queued stream");
            let n = frame.min(*rest).min(turn.max_bytes);
            *rest -= n;
            turns.push(turn.id.0);
            scheduler.sent(turn.id, n, *rest > 0, now);
        }
        assert!(scheduler.is_empty());
        turns
    }

    #[test]
    fn equal_streams_take_turns() {
        let turns = serve(
            &mut RoundRobin::default(),
            &[(0, 3000), (4, 3000), (8, 3000)],
            1200,
        );
        assert_eq!(turns, [0, 4, 8, 0, 4, 8, 0, 4, 8]);
    }

    #[test]
    fn larger_frames_are_paid_for_in_later_rounds() {
        // Stream 0 sends 2,400-byte frames, stream 4 1,200-byte ones: over a long run each
        // gets the same bytes, so 0 takes a turn every other round.
        let mut rr = RoundRobin::default();
        rr.push(StreamId(0));
        rr.push(StreamId(4));
        let mut bytes = [0usize; 2];
        let now = now();
        for _ in 0..300 {
            let turn = rr.next(now).unwrap();
            let (slot, n) = if turn.id.0 == 0 { (0, 2400) } else { (1, 1200) };
            bytes[slot] += n;
            rr.sent(turn.id, n, true, now);
        }
        let (a, b) = (bytes[0] as i64, bytes[1] as i64);
        assert!((a - b).abs() <= 2400, "{a} against {b}");
    }

    #[test]
    fn a_stream_with_little_to_send_leaves_the_rest_to_the_others() {
        let turns = serve(&mut RoundRobin::default(), &[(0, 100), (4, 5000)], 1200);
        assert_eq!(turns, [0, 4, 4, 4, 4, 4]);
    }

    #[test]
    fn removed_streams_are_not_served_and_can_come_back() {
        let mut rr = RoundRobin::default();
        for id in [0, 4, 8] {
            rr.push(StreamId(id));
        }
        let now = now();
        rr.remove(StreamId(4));
        rr.remove(StreamId(0));
        assert_eq!(rr.next(now).map(|t| t.id), Some(StreamId(8)));
        rr.remove(StreamId(8));
        assert!(rr.is_empty() && rr.next(now).is_none());
        rr.push(StreamId(4));
        assert_eq!(rr.next(now).map(|t| t.id), Some(StreamId(4)));
        // A report for a stream that is not being served changes nothing.
        rr.sent(StreamId(0), 5000, false, now);
        assert_eq!(rr.next(now).map(|t| t.id), Some(StreamId(4)));
    }
}
