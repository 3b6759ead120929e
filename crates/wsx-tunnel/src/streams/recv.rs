//! A stream's receive side: reassembly of out-of-order data into a contiguous buffer.
//!
//! Data is written at its offset into one buffer that starts at the application's read
//! position, with holes left where packets are missing. What is real is the prefix up to
//! `ready_to` (every byte there arrived) and a set of the ranges received beyond it: data
//! arriving in order, the usual case, moves one offset and touches no set. Out-of-order
//! data costs no allocation per segment, and the buffer never exceeds the flow-control
//! window.

use crate::range_set::RangeSet;
use std::collections::VecDeque;

#[derive(Debug, Default)]
pub(crate) struct RecvBuf {
    /// Bytes from `read` to the highest received offset; holes are zero until filled.
    data: VecDeque<u8>,
    /// Next offset the application reads.
    read: u64,
    /// Every byte from `read` to here was received.
    ready_to: u64,
    /// Ranges received beyond `ready_to`, none touching it.
    ahead: RangeSet,
    /// The final size, once a FIN arrived.
    end: Option<u64>,
    /// Highest offset received.
    highest: u64,
    /// The end of the furthest frame marked PUSH or FIN.
    push_to: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecvError {
    #[error("data beyond the flow-control limit")]
    FlowControl,
    #[error("data or FIN contradicts the stream's final size")]
    FinalSize,
}

impl RecvBuf {
    pub(crate) fn highest(&self) -> u64 {
        self.highest
    }

    pub(crate) fn read_offset(&self) -> u64 {
        self.read
    }

    /// Stores a STREAM frame's data. `limit` is the highest offset flow control allows.
    /// Returns how far the highest received offset moved (to charge the connection's flow
    /// control).
    pub(crate) fn insert(
        &mut self,
        offset: u64,
        data: &[u8],
        fin: bool,
        limit: u64,
    ) -> Result<u64, RecvError> {
        let end = offset + data.len() as u64;
        if end > limit {
            return Err(RecvError::FlowControl);
        }
        if let Some(size) = self.end {
            if end > size || (fin && end != size) {
                return Err(RecvError::FinalSize);
            }
        }
        if fin {
            if end < self.highest {
                return Err(RecvError::FinalSize);
            }
            self.end = Some(end);
        }
        let grown = end.saturating_sub(self.highest);
        self.highest = self.highest.max(end);
        // Only the part not yet read or received is new.
        let start = offset.max(self.read);
        if start >= end {
            return Ok(grown);
        }
        let at = (start - self.read) as usize;
        let new = &data[(start - offset) as usize..];
        // Over what the buffer holds (a hole), then after it: in-order data, the usual case,
        // is appended without being zeroed first. Only a gap before it is.
        let inside = self.data.len().saturating_sub(at).min(new.len());
        let (over, after) = new.split_at(inside);
        if !over.is_empty() {
            write_at(&mut self.data, at, over);
        }
        if !after.is_empty() {
            self.data.resize(at.max(self.data.len()), 0);
            self.data.extend(after);
        }
        if start <= self.ready_to {
            self.ready_to = self.ready_to.max(end);
            while let Some(next) = self.ahead.first() {
                if next.start > self.ready_to {
                    break;
                }
                self.ahead.pop_first();
                self.ready_to = self.ready_to.max(next.end);
            }
        } else {
            self.ahead.insert(start..end);
        }
        Ok(grown)
    }

    /// Notes that the sender marked offset `end` as the end of what it had to send.
    pub(crate) fn push_to(&mut self, end: u64) {
        self.push_to = self.push_to.max(end);
    }

    /// Whether the bytes up to the furthest PUSH are all here and not all read.
    pub(crate) fn pushed(&self) -> bool {
        self.push_to > self.read && self.read + self.readable() as u64 >= self.push_to
    }

    /// Contiguous bytes ready for the application.
    pub(crate) fn readable(&self) -> usize {
        (self.ready_to - self.read) as usize
    }

    /// Whether the application has read everything up to the FIN.
    pub(crate) fn is_finished(&self) -> bool {
        self.end == Some(self.read)
    }

    /// Whether the FIN arrived (the final size is known).
    pub(crate) fn final_size(&self) -> Option<u64> {
        self.end
    }

    /// Copies contiguous bytes into `out`; returns how many.
    pub(crate) fn read(&mut self, out: &mut [u8]) -> usize {
        let n = self.readable().min(out.len());
        if n == 0 {
            return 0;
        }
        let (a, b) = self.data.as_slices();
        let from_a = n.min(a.len());
        out[..from_a].copy_from_slice(&a[..from_a]);
        out[from_a..n].copy_from_slice(&b[..n - from_a]);
        self.data.drain(..n);
        self.read += n as u64;
        n
    }

    /// Bytes of memory the buffer holds.
    pub(crate) fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// Gives the buffer's memory back, if nothing is buffered. Not done on every read that
    /// empties it (the caller waits for a quiet stream): a stream flowing fast empties it
    /// many times a second, and each free and regrowth costs fresh pages, zeroed, and their
    /// unmapping.
    pub(crate) fn release_if_empty(&mut self) {
        if self.data.is_empty() {
            self.data = VecDeque::new();
        }
    }

    /// Drops everything buffered (the stream was reset).
    pub(crate) fn clear(&mut self) {
        self.data = VecDeque::new();
        self.ready_to = self.read;
        self.ahead.clear();
    }
}

fn write_at(deque: &mut VecDeque<u8>, at: usize, data: &[u8]) {
    let (a, b) = deque.as_mut_slices();
    let a_len = a.len();
    if at < a_len {
        let n = data.len().min(a_len - at);
        a[at..at + n].copy_from_slice(&data[..n]);
        b[..data.len() - n].copy_from_slice(&data[n..]);
    } else {
        let at = at - a_len;
        b[at..at + data.len()].copy_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_data_is_delivered_in_order() {
        let mut buf = RecvBuf::default();
        assert_eq!(buf.insert(5, b"world", true, 100), Ok(10));
        assert_eq!(buf.readable(), 0);
        assert_eq!(buf.insert(0, b"hello", false, 100), Ok(0));
        let mut out = [0u8; 16];
        assert_eq!(buf.read(&mut out), 10);
        assert_eq!(&out[..10], b"helloworld");
        assert!(buf.is_finished());
    }

    #[test]
    fn a_push_counts_once_everything_before_it_is_in_and_until_it_is_read() {
        let mut buf = RecvBuf::default();
        assert!(!buf.pushed());
        buf.insert(10, b"tail", false, 100).unwrap();
        buf.push_to(14);
        assert!(!buf.pushed(), "a hole before the push");
        buf.insert(0, b"0123456789", false, 100).unwrap();
        assert!(buf.pushed());
        let mut out = [0u8; 8];
        buf.read(&mut out);
        assert!(buf.pushed(), "part of it is still unread");
        buf.read(&mut out);
        assert!(!buf.pushed(), "all read");
    }

    #[test]
    fn flow_control_and_final_size_violations_are_errors() {
        let mut buf = RecvBuf::default();
        assert_eq!(
            buf.insert(90, &[0; 20], false, 100),
            Err(RecvError::FlowControl)
        );
        assert_eq!(buf.insert(0, &[0; 10], true, 100), Ok(10));
        assert_eq!(
            buf.insert(10, &[0; 1], false, 100),
            Err(RecvError::FinalSize)
        );
        assert_eq!(buf.insert(0, &[0; 5], true, 100), Err(RecvError::FinalSize));
        // A duplicate of what was received is harmless.
        assert_eq!(buf.insert(0, &[0; 10], true, 100), Ok(0));
    }

    proptest! {
        /// Whatever order, duplication and overlap the pieces arrive in, the reader gets the
        /// original bytes exactly once.
        #[test]
        fn any_arrival_order_reassembles(
            len in 1usize..3000,
            cuts in proptest::collection::vec(0usize..3000, 0..20),
            order in proptest::collection::vec(any::<prop::sample::Index>(), 1..80),
            reads in proptest::collection::vec(1usize..700, 1..20),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 256) as u8).collect();
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % len).collect();
            bounds.extend([0, len]);
            bounds.sort_unstable();
            bounds.dedup();
            let pieces: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
            let mut buf = RecvBuf::default();
            let mut out = Vec::new();
            let deliver = |buf: &mut RecvBuf, (s, e): (usize, usize)| {
                buf.insert(s as u64, &data[s..e], e == len, len as u64).unwrap();
            };
            // A random selection with repeats, then everything, so all bytes arrive.
            for (i, pick) in order.iter().enumerate() {
                deliver(&mut buf, pieces[pick.index(pieces.len())]);
                let mut chunk = vec![0; reads[i % reads.len()]];
                let n = buf.read(&mut chunk);
                out.extend_from_slice(&chunk[..n]);
            }
            for &piece in &pieces {
                deliver(&mut buf, piece);
            }
            let mut rest = vec![0; len];
            let n = buf.read(&mut rest);
            out.extend_from_slice(&rest[..n]);
            prop_assert_eq!(out, data);
            prop_assert!(buf.is_finished());
        }
    }
}
