//! A stream's send side: the bytes written but not yet acknowledged, what is still unsent and
//! what must be sent again.

use crate::range_set::RangeSet;
use std::collections::VecDeque;
use std::ops::Deref;

#[derive(Debug, Default)]
pub(crate) struct SendBuf {
    /// Bytes from `base` to `written()`.
    data: VecDeque<u8>,
    /// Lowest offset not yet acknowledged.
    base: u64,
    /// Next offset never sent.
    unsent: u64,
    /// Acknowledged ranges above `base` (not touching it: the base moves over those).
    acked: RangeSet,
    /// Ranges declared lost, to send again.
    retransmit: RangeSet,
    fin: Fin,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Fin {
    #[default]
    Open,
    /// `finish` was called; the FIN has not been sent (or was lost).
    Pending,
    Sent,
    Acked,
}

/// A piece of the stream to put in a STREAM frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) fin: bool,
    /// Whether these bytes were sent before.
    pub(crate) retransmit: bool,
}

impl SendBuf {
    pub(crate) fn written(&self) -> u64 {
        self.base + self.data.len() as u64
    }

    /// Bytes held: written and not yet acknowledged.
    pub(crate) fn buffered(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.fin != Fin::Open
    }

    /// Nothing written waits for the peer: every byte was acknowledged, and the FIN too if
    /// the side was finished.
    pub(crate) fn is_delivered(&self) -> bool {
        self.data.is_empty() && matches!(self.fin, Fin::Open | Fin::Acked)
    }

    /// Everything, FIN included, was acknowledged.
    pub(crate) fn is_done(&self) -> bool {
        self.fin == Fin::Acked && self.data.is_empty()
    }

    /// Appends up to `room` bytes of `parts`, one after the other; returns how many were
    /// taken.
    pub(crate) fn write<P: Deref<Target = [u8]>>(&mut self, parts: &[P], room: usize) -> usize {
        let mut left = room;
        for part in parts {
            let n = part.len().min(left);
            self.data.extend(&part[..n]);
            left -= n;
            if left == 0 {
                break;
            }
        }
        room - left
    }

    pub(crate) fn finish(&mut self) {
        if self.fin == Fin::Open {
            self.fin = Fin::Pending;
        }
    }

    /// The highest offset ever sent (new data counts against flow control once).
    pub(crate) fn sent_offset(&self) -> u64 {
        self.unsent
    }

    /// Bytes written and never sent.
    pub(crate) fn unsent_bytes(&self) -> u64 {
        self.written() - self.unsent
    }

    /// Whether a frame is waiting: lost bytes, new bytes within `max_offset` (the flow control
    /// limit), or a FIN.
    pub(crate) fn has_pending(&self, max_offset: u64) -> bool {
        !self.retransmit.is_empty()
            || (self.unsent < self.written() && self.unsent < max_offset)
            || self.fin_pending()
    }

    fn fin_pending(&self) -> bool {
        self.fin == Fin::Pending && self.unsent == self.written()
    }

    /// Takes the next piece to send, at most `max_len` bytes: lost bytes first, then new bytes
    /// below `max_offset`. A FIN rides on the last piece, or alone.
    pub(crate) fn next_chunk(&mut self, max_len: usize, max_offset: u64) -> Option<Chunk> {
        if let Some(range) = self.retransmit.first() {
            let len = (range.end - range.start).min(max_len as u64);
            self.retransmit.remove(range.start..range.start + len);
            let end = range.start + len;
            let fin = end == self.written() && self.fin == Fin::Pending;
            if fin {
                self.fin = Fin::Sent;
            }
            return Some(Chunk {
                offset: range.start,
                len: len as usize,
                fin,
                retransmit: true,
            });
        }
        let end = self
            .written()
            .min(max_offset.max(self.unsent))
            .min(self.unsent + max_len as u64);
        if end == self.unsent && !self.fin_pending() {
            return None;
        }
        let offset = self.unsent;
        self.unsent = end;
        let fin = self.fin_pending();
        if fin {
            self.fin = Fin::Sent;
        }
        Some(Chunk {
            offset,
            len: (end - offset) as usize,
            fin,
            retransmit: false,
        })
    }

    /// Copies the bytes at `offset` into `out`.
    pub(crate) fn copy(&self, offset: u64, out: &mut [u8]) {
        let start = (offset - self.base) as usize;
        let (a, b) = self.data.as_slices();
        let mut at = 0;
        for part in [a, b] {
            let len = part.len();
            let lo = start.saturating_sub(at).min(len);
            let hi = (start + out.len()).saturating_sub(at).min(len);
            if lo < hi {
                out[at + lo - start..at + hi - start].copy_from_slice(&part[lo..hi]);
            }
            at += len;
        }
    }

    /// The peer acknowledged `offset..offset + len` (and the FIN, if `fin`).
    pub(crate) fn ack(&mut self, offset: u64, len: u64, fin: bool) {
        if fin && self.fin == Fin::Sent {
            self.fin = Fin::Acked;
        }
        let start = offset.max(self.base);
        let end = offset + len;
        if start >= end {
            return;
        }
        if !self.retransmit.is_empty() {
            self.retransmit.remove(start..end);
        }
        // Acknowledged in order, the usual case: the base moves and no set is touched.
        if start == self.base {
            self.advance(end);
        } else {
            self.acked.insert(start..end);
        }
        while let Some(first) = self.acked.first() {
            if first.start > self.base {
                break;
            }
            self.acked.pop_first();
            self.advance(first.end);
        }
    }

    /// Frees the bytes below `to`, which were all acknowledged.
    fn advance(&mut self, to: u64) {
        if to > self.base {
            self.data.drain(..(to - self.base) as usize);
            self.base = to;
        }
    }

    /// Bytes of memory the buffer holds.
    pub(crate) fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// Gives the buffer's memory back, if nothing is buffered (see
    /// `RecvBuf::release_if_empty`).
    pub(crate) fn release_if_empty(&mut self) {
        if self.data.is_empty() {
            self.data = VecDeque::new();
        }
    }

    /// A packet carrying `offset..offset + len` (and the FIN, if `fin`) was lost: queue what
    /// was not acknowledged since.
    pub(crate) fn lost(&mut self, offset: u64, len: u64, fin: bool) {
        if fin && self.fin == Fin::Sent {
            self.fin = Fin::Pending;
            if len == 0 && self.unsent == self.written() {
                // A FIN alone: it goes out again with the next chunk (or alone).
                return;
            }
        }
        let start = offset.max(self.base);
        let end = offset + len;
        if start >= end {
            return;
        }
        self.retransmit.insert(start..end);
        for acked in self.acked.intersecting(start..end) {
            self.retransmit.remove(acked);
        }
    }

    /// Drops everything (the stream was reset).
    pub(crate) fn clear(&mut self) {
        self.base = self.written();
        self.unsent = self.base;
        self.data = VecDeque::new();
        self.acked.clear();
        self.retransmit.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(buf: &SendBuf, chunk: Chunk) -> Vec<u8> {
        let mut out = vec![0; chunk.len];
        buf.copy(chunk.offset, &mut out);
        out
    }

    #[test]
    fn lost_bytes_go_out_again_and_acked_bytes_are_freed() {
        let mut buf = SendBuf::default();
        assert_eq!(buf.write(&[b"hello world".as_slice()], 100), 11);
        buf.finish();
        let a = buf.next_chunk(5, u64::MAX).unwrap();
        let b = buf.next_chunk(100, u64::MAX).unwrap();
        assert_eq!((a.offset, a.len, a.fin), (0, 5, false));
        assert_eq!((b.offset, b.len, b.fin), (5, 6, true));
        assert_eq!(sent(&buf, b), b" world");
        assert_eq!(buf.next_chunk(100, u64::MAX), None);
        buf.ack(5, 6, true);
        assert_eq!(buf.buffered(), 11, "bytes 0..5 still unacknowledged");
        buf.lost(0, 5, false);
        let again = buf.next_chunk(100, u64::MAX).unwrap();
        assert_eq!((again.offset, again.len, again.retransmit), (0, 5, true));
        assert_eq!(sent(&buf, again), b"hello");
        buf.ack(0, 5, false);
        assert_eq!(buf.buffered(), 0);
        assert!(buf.is_done());
    }

    #[test]
    fn parts_are_taken_in_order_up_to_the_room() {
        let mut buf = SendBuf::default();
        assert_eq!(buf.write(&[b"head".as_slice(), b"payload"], 6), 6);
        assert_eq!(buf.write(&[b"yload".as_slice(), b"", b"!"], 100), 6);
        assert_eq!(buf.write(&[b"more".as_slice()], 0), 0);
        let c = buf.next_chunk(100, u64::MAX).unwrap();
        assert_eq!(sent(&buf, c), b"headpayload!");
    }

    #[test]
    fn flow_control_limits_new_bytes_only() {
        let mut buf = SendBuf::default();
        buf.write(&[[7; 100].as_slice()], 100);
        let c = buf.next_chunk(1000, 40).unwrap();
        assert_eq!((c.offset, c.len), (0, 40));
        assert!(!buf.has_pending(40));
        assert_eq!(buf.next_chunk(1000, 40), None);
        buf.lost(0, 40, false);
        assert!(
            buf.has_pending(40),
            "retransmissions are within the limit already"
        );
    }

    #[test]
    fn a_lost_fin_is_sent_again() {
        let mut buf = SendBuf::default();
        assert!(buf.is_delivered(), "nothing written");
        buf.write(&[b"x".as_slice()], 10);
        assert!(!buf.is_delivered());
        let c = buf.next_chunk(10, u64::MAX).unwrap();
        buf.ack(c.offset, c.len as u64, false);
        assert!(buf.is_delivered(), "all acknowledged, not finished");
        buf.finish();
        assert!(!buf.is_delivered(), "the FIN is to send");
        let fin = buf.next_chunk(10, u64::MAX).unwrap();
        assert_eq!((fin.offset, fin.len, fin.fin), (1, 0, true));
        buf.lost(1, 0, true);
        let again = buf.next_chunk(10, u64::MAX).unwrap();
        assert_eq!((again.offset, again.len, again.fin), (1, 0, true));
        assert!(!buf.is_delivered(), "the FIN is in flight");
        buf.ack(1, 0, true);
        assert!(buf.is_done());
        assert!(buf.is_delivered());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(usize),
        Send(usize),
        /// Acknowledge the piece picked by the index among those sent (in flight, or
        /// declared lost and acknowledged late); with `again`, it may be acknowledged again.
        Ack(prop::sample::Index, bool),
        /// Declare the in-flight piece picked by the index lost.
        Lose(prop::sample::Index),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..300).prop_map(Op::Write),
            (1usize..200).prop_map(Op::Send),
            (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, a)| Op::Ack(i, a)),
            any::<prop::sample::Index>().prop_map(Op::Lose),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        /// Whatever order pieces are sent, acknowledged (out of order, twice, after being
        /// declared lost) and lost in, every piece carries the bytes written at its offset,
        /// nothing acknowledged is sent again, and once all is acknowledged the buffer is
        /// empty.
        #[test]
        fn pieces_carry_the_written_bytes_until_all_are_acknowledged(
            ops in proptest::collection::vec(op(), 0..120),
        ) {
            let source: Vec<u8> = (0..40_000u32).map(|i| (i * 31 + i / 251) as u8).collect();
            let mut buf = SendBuf::default();
            let mut written = 0usize;
            let mut acked = vec![false; source.len()];
            let mut flight: Vec<Chunk> = Vec::new();
            // Declared lost, still to be acknowledged late (a spurious loss), or not.
            let mut late: Vec<Chunk> = Vec::new();
            let check = |buf: &SendBuf, c: Chunk, acked: &[bool]| {
                let (from, to) = (c.offset as usize, c.offset as usize + c.len);
                prop_assert_eq!(sent(buf, c), &source[from..to]);
                if c.retransmit {
                    prop_assert!(acked[from..to].iter().all(|a| !a), "resent acked bytes");
                }
                Ok::<(), TestCaseError>(())
            };
            for op in ops {
                match op {
                    Op::Write(n) => {
                        let n = n.min(source.len() - written);
                        written += buf.write(&[&source[written..written + n]], n);
                    }
                    Op::Send(max) => {
                        if let Some(c) = buf.next_chunk(max, u64::MAX) {
                            check(&buf, c, &acked)?;
                            flight.push(c);
                        }
                    }
                    Op::Ack(i, again) if !flight.is_empty() || !late.is_empty() => {
                        let k = i.index(flight.len() + late.len());
                        let c = match k.checked_sub(flight.len()) {
                            None if again => flight[k],
                            None => flight.remove(k),
                            Some(k) => late.remove(k),
                        };
                        buf.ack(c.offset, c.len as u64, false);
                        acked[c.offset as usize..c.offset as usize + c.len].fill(true);
                    }
                    Op::Lose(i) if !flight.is_empty() => {
                        let c = flight.remove(i.index(flight.len()));
                        buf.lost(c.offset, c.len as u64, false);
                        late.push(c);
                    }
                    Op::Ack(..) | Op::Lose(_) => {}
                }
                let base = acked.iter().position(|a| !a).unwrap_or(acked.len()).min(written);
                prop_assert_eq!(buf.buffered(), written - base);
            }
            // Everything in flight is lost; all that is left goes out and is acknowledged.
            for c in flight.drain(..) {
                buf.lost(c.offset, c.len as u64, false);
            }
            while let Some(c) = buf.next_chunk(1000, u64::MAX) {
                check(&buf, c, &acked)?;
                buf.ack(c.offset, c.len as u64, false);
                acked[c.offset as usize..c.offset as usize + c.len].fill(true);
            }
            prop_assert_eq!(buf.buffered(), 0);
            prop_assert!(acked[..written].iter().all(|&a| a));
        }
    }
}
