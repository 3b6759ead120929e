//! The control channel: small reliable, ordered messages between the two gateways beside the
//! streams (PROTOCOL.md §4, CONTROL), for the SMB engine and the bypass logic.
//!
//! Each message has a sequence number. The sender keeps it until a packet carrying it is
//! acknowledged and queues it again when such a packet is lost; the receiver delivers in
//! order and holds messages that arrive early, up to [`MAX_CONTROL_MESSAGES`] ahead.

use super::error::TransportError;
use crate::wire::frame::CONTROL;
use crate::wire::{Frame, Writer};
use std::collections::{BTreeMap, VecDeque};

/// The most control messages outstanding (sent, not yet acknowledged) or buffered out of order.
pub const MAX_CONTROL_MESSAGES: usize = 64;
/// The largest control message.
pub const MAX_CONTROL_LEN: usize = 1024;

/// Errors of [`Connection::send_control`](super::Connection::send_control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("control message longer than {MAX_CONTROL_LEN} bytes")]
    TooLong,
    #[error("too many control messages outstanding")]
    Blocked,
    #[error("the connection is not established")]
    NotConnected,
}

/// Both directions of the control channel.
#[derive(Debug, Default)]
pub(super) struct ControlChannel {
    next_seq: u64,
    /// Sent or to send, by sequence number, until acknowledged.
    outgoing: BTreeMap<u64, Vec<u8>>,
    queued: VecDeque<u64>,
    /// Next sequence number to deliver, and messages that arrived ahead of it.
    expected: u64,
    early: BTreeMap<u64, Vec<u8>>,
}

impl ControlChannel {
    /// Queues `message` for the peer; `connected` says whether the connection can carry it.
    pub(super) fn send(&mut self, message: &[u8], connected: bool) -> Result<(), ControlError> {
        if message.len() > MAX_CONTROL_LEN {
            return Err(ControlError::TooLong);
        }
        if self.outgoing.len() >= MAX_CONTROL_MESSAGES {
            return Err(ControlError::Blocked);
        }
        if !connected {
            return Err(ControlError::NotConnected);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outgoing.insert(seq, message.to_vec());
        self.queued.push_back(seq);
        Ok(())
    }

    /// Whether a message waits to be sent.
    pub(super) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Writes the queued messages that fit in `w`; calls `sent` with the sequence number of
    /// each. Returns whether any was written.
    pub(super) fn write_frames(&mut self, w: &mut Writer<'_>, mut sent: impl FnMut(u64)) -> bool {
        let mut wrote = false;
        while let Some(&seq) = self.queued.front() {
            let Some(data) = self.outgoing.get(&seq) else {
                // Acknowledged after it was queued again.
                self.queued.pop_front();
                continue;
            };
            if !(Frame::Control { seq, data }).encode_if_fits(w) {
                break;
            }
            sent(seq);
            self.queued.pop_front();
            wrote = true;
        }
        wrote
    }

    /// A packet carrying message `seq` was acknowledged.
    pub(super) fn on_acked(&mut self, seq: u64) {
        self.outgoing.remove(&seq);
    }

    /// A packet carrying message `seq` was lost: send it again unless it was acknowledged by
    /// another packet meanwhile.
    pub(super) fn on_lost(&mut self, seq: u64) {
        if self.outgoing.contains_key(&seq) {
            self.queued.push_back(seq);
        }
    }

    /// A CONTROL frame arrived; `deliver` gets every message now in order.
    pub(super) fn on_frame(
        &mut self,
        seq: u64,
        data: &[u8],
        mut deliver: impl FnMut(Vec<u8>),
    ) -> Result<(), TransportError> {
        if seq < self.expected || self.early.contains_key(&seq) {
            return Ok(());
        }
        if data.len() > MAX_CONTROL_LEN || seq >= self.expected + MAX_CONTROL_MESSAGES as u64 {
            return Err(TransportError::violation(
                Some(CONTROL),
                "control message beyond the allowed window",
            ));
        }
        self.early.insert(seq, data.to_vec());
        while let Some(message) = self.early.remove(&self.expected) {
            self.expected += 1;
            deliver(message);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Frames;

    /// The CONTROL frames `channel` writes into a packet of `room` bytes: (seq, data).
    fn written(channel: &mut ControlChannel, room: usize) -> Vec<(u64, Vec<u8>)> {
        let mut buf = vec![0u8; room];
        let mut w = Writer::new(&mut buf);
        let mut seqs = Vec::new();
        channel.write_frames(&mut w, |seq| seqs.push(seq));
        let n = w.len();
        let frames: Vec<_> = Frames::new(&buf[..n])
            .map(|f| match f.unwrap() {
                Frame::Control { seq, data } => (seq, data.to_vec()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(frames.iter().map(|f| f.0).collect::<Vec<_>>(), seqs);
        frames
    }

    #[test]
    fn messages_go_out_in_order_as_many_as_fit() {
        let mut c = ControlChannel::default();
        for m in [b"one".as_slice(), b"two", b"three"] {
            c.send(m, true).unwrap();
        }
        // A CONTROL frame is type, seq, length, data: 3 + 3 bytes, then 3 + 3 more.
        assert_eq!(
            written(&mut c, 12),
            [(0, b"one".to_vec()), (1, b"two".to_vec())]
        );
        assert!(c.has_queued());
        assert_eq!(written(&mut c, 100), [(2, b"three".to_vec())]);
        assert!(!c.has_queued());
    }

    #[test]
    fn a_lost_message_is_sent_again_unless_acknowledged_meanwhile() {
        let mut c = ControlChannel::default();
        c.send(b"a", true).unwrap();
        c.send(b"b", true).unwrap();
        assert_eq!(written(&mut c, 100).len(), 2);
        c.on_acked(0);
        c.on_lost(0);
        c.on_lost(1);
        assert_eq!(written(&mut c, 100), [(1, b"b".to_vec())]);
        // Lost twice, acknowledged in between: the second queue entry is skipped.
        c.on_lost(1);
        c.on_acked(1);
        assert!(written(&mut c, 100).is_empty());
    }

    #[test]
    fn limits_on_size_and_outstanding_messages() {
        let mut c = ControlChannel::default();
        assert_eq!(
            c.send(&[0; MAX_CONTROL_LEN + 1], true),
            Err(ControlError::TooLong)
        );
        assert_eq!(c.send(b"x", false), Err(ControlError::NotConnected));
        for _ in 0..MAX_CONTROL_MESSAGES {
            c.send(b"x", true).unwrap();
        }
        assert_eq!(c.send(b"x", true), Err(ControlError::Blocked));
        c.on_acked(0);
        assert_eq!(c.send(b"x", true), Ok(()));
    }

    #[test]
    fn received_messages_are_delivered_in_order_once() {
        let mut c = ControlChannel::default();
        let mut got = Vec::new();
        c.on_frame(1, b"b", |m| got.push(m)).unwrap();
        assert!(got.is_empty());
        c.on_frame(0, b"a", |m| got.push(m)).unwrap();
        c.on_frame(0, b"a", |m| got.push(m)).unwrap();
        c.on_frame(1, b"b", |m| got.push(m)).unwrap();
        assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn a_message_beyond_the_window_is_a_violation() {
        let mut c = ControlChannel::default();
        let far = MAX_CONTROL_MESSAGES as u64;
        let e = c.on_frame(far, b"x", |_| {}).unwrap_err();
        assert_eq!(e.frame, Some(CONTROL));
        let e = c
            .on_frame(0, &[0; MAX_CONTROL_LEN + 1], |_| {})
            .unwrap_err();
        assert_eq!(e.code, super::super::CLOSE_PROTOCOL_VIOLATION);
    }
}
