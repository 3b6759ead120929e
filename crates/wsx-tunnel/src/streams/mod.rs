//! Streams: many ordered byte streams in one connection, each carrying one TCP connection.
//!
//! A stream is opened by either side with [`StreamMeta`] (the original addresses, a scenario id
//! and an application hint), carries bytes both ways with per-stream and per-connection flow
//! control, can be half-closed (finish) and reset (abort both ways). This module holds all
//! stream state; the connection asks it for frames to send and feeds it frames received.
//!
//! Scheduling: streams with something to send wait in a [`Scheduler`], which says whose turn
//! it is; the default, [`RoundRobin`], shares the bytes equally.

mod recv;
mod scheduler;
mod send;

use crate::FastMap;
use crate::wire::frame::{Frame, StreamFrame, StreamHeader};
use crate::wire::{MAX_HINT_LEN, MAX_NAME_LEN, StreamId, StreamMeta, Target, Writer};
use recv::{RecvBuf, RecvError};
pub use scheduler::{RoundRobin, Scheduler, Turn};
use send::SendBuf;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Deref;
use std::time::Instant;

/// How often a connection whose streams hold buffers looks for idle ones: an empty buffer
/// is given back after one to two of these without traffic.
pub(crate) const BUFFER_SWEEP: std::time::Duration = std::time::Duration::from_secs(1);
/// A stream may always buffer this much for sending (and queue it unsent), whatever its share
/// of the connection's buffer and pace.
const MIN_SHARE: u64 = 64 * 1024;

/// Errors of the stream API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// No such stream (never opened, or closed and forgotten).
    #[error("unknown or closed stream")]
    UnknownStream,
    /// Nothing can be done now: no data to read, or no buffer space to write. An event says
    /// when to try again.
    #[error("blocked")]
    Blocked,
    /// The stream was finished; nothing more can be written.
    #[error("stream already finished")]
    Finished,
    /// The stream was reset with this code.
    #[error("stream reset with code {0}")]
    Reset(u64),
    /// The peer allows no more streams now.
    #[error("the peer's stream limit is reached")]
    TooManyStreams,
    /// The hint is longer than [`MAX_HINT_LEN`].
    #[error("hint longer than 255 bytes")]
    HintTooLong,
    /// A destination name is empty or longer than [`MAX_NAME_LEN`].
    #[error("destination name empty or longer than 255 bytes")]
    BadName,
}

/// Stream happenings the connection reports as events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEvent {
    Opened(StreamId),
    Readable(StreamId),
    Writable(StreamId),
    Reset { id: StreamId, code: u64 },
}

/// What a sent packet carried for streams, to act on when it is acknowledged or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFrameSent {
    Data {
        id: StreamId,
        offset: u64,
        len: u32,
        fin: bool,
    },
    Open(StreamId),
    Reset(StreamId),
    MaxStreamData(StreamId),
    MaxData,
    MaxStreams,
}

/// A protocol violation found in the peer's stream frames: closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StreamViolation {
    #[error("stream {0} beyond the stream limit")]
    StreamLimit(StreamId),
    #[error("frame for stream {0} that the peer could not have opened")]
    NotOpenedByPeer(StreamId),
    #[error("stream {0}: {1}")]
    Recv(StreamId, RecvError),
    #[error("connection flow control exceeded")]
    ConnectionFlowControl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenState {
    /// Opened by the peer (no OPEN to send).
    Remote,
    Pending,
    Sent,
    Acked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetState {
    None,
    /// We reset it: RESET waiting to be sent (or re-sent), or in flight.
    LocalPending {
        code: u64,
    },
    LocalSent {
        code: u64,
    },
}

/// The DSCP a burst of packets (one GSO send) is marked with: its first stream frame's
/// stream's. A turn for a stream with another DSCP ends the burst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BurstMark {
    pub(crate) dscp: Option<u8>,
    pub(crate) ended: bool,
}

#[derive(Debug)]
struct Stream {
    meta: Option<StreamMeta>,
    open: OpenState,
    send: SendBuf,
    /// Highest offset the peer lets us send.
    send_max: u64,
    recv: RecvBuf,
    /// Highest offset we let the peer send.
    recv_max: u64,
    max_stream_data_queued: bool,
    reset: ResetState,
    /// The highest offset sent before a local reset: the final size the RESET declares.
    reset_final_size: u64,
    /// Waiting in the scheduler.
    queued: bool,
    readable_notified: bool,
    write_blocked: bool,
    /// ...and by a queue of unsent bytes, rather than for want of acknowledgments.
    blocked_by_queue: bool,
    /// A writer blocked by a queue is woken once its unsent bytes are down to this: half of
    /// what it held when refused, so that it writes (and reads its source) in large steps,
    /// not once per paced burst.
    wake_at_unsent: u64,
    /// In `Streams::queue_blocked` (it stays there when its own sending wakes it).
    queue_listed: bool,
    /// In `Streams::write_blocked` (it stays there when a later write succeeds).
    ack_listed: bool,
    /// The most bytes written and not yet sent once (unacknowledged sent bytes do not
    /// count): a queue bound set by the application, e.g. a shaper's buffer.
    unsent_limit: u64,
    /// The DSCP of the packets that carry this stream's data (0: unmarked).
    dscp: u8,
    /// The application was told the end (`read` returned `Ok(None)`). Until then the stream
    /// is kept, so that the end is reported rather than an unknown stream.
    end_read: bool,
    /// A buffer holds memory: listed in `Streams::holding`.
    listed: bool,
    /// Data was written or received since the last [`Streams::release_idle_buffers`].
    busy: bool,
}

impl Stream {
    fn new(open: OpenState, meta: Option<StreamMeta>, send_max: u64, recv_max: u64) -> Self {
        Self {
            meta,
            open,
            send: SendBuf::default(),
            send_max,
            recv: RecvBuf::default(),
            recv_max,
            max_stream_data_queued: false,
            reset: ResetState::None,
            reset_final_size: 0,
            queued: false,
            readable_notified: false,
            write_blocked: false,
            blocked_by_queue: false,
            wake_at_unsent: 0,
            queue_listed: false,
            ack_listed: false,
            unsent_limit: u64::MAX,
            dscp: 0,
            end_read: false,
            listed: false,
            busy: false,
        }
    }

    /// Notes traffic on the stream; `true` when it must be listed in `Streams::holding`.
    fn note_traffic(&mut self) -> bool {
        self.busy = true;
        self.list_if_holding()
    }

    /// `true` when a buffer holds memory and the stream is not yet listed in
    /// `Streams::holding` (it must be, now): after data arrived or was written, and after a
    /// read or an acknowledgment that may have emptied a buffer the sweep had to leave.
    fn list_if_holding(&mut self) -> bool {
        let newly = !self.listed && self.holds_buffer();
        self.listed |= newly;
        newly
    }

    fn holds_buffer(&self) -> bool {
        self.send.capacity() > 0 || self.recv.capacity() > 0
    }

    fn wants_to_send(&self, conn_credit: u64) -> bool {
        if self.reset != ResetState::None {
            return false;
        }
        let limit = self.send_max.min(self.send.sent_offset() + conn_credit);
        self.open == OpenState::Pending || self.send.has_pending(limit)
    }

    /// Nothing this side sent on the stream (its OPEN, data, FIN or RESET) is still on its
    /// way to the peer.
    fn is_delivered(&self) -> bool {
        !matches!(self.open, OpenState::Pending | OpenState::Sent)
            && self.send.is_delivered()
            && self.reset == ResetState::None
    }

    /// Both directions are over and nothing more needs to be sent or kept.
    fn is_closed(&self) -> bool {
        let open_done = matches!(self.open, OpenState::Remote | OpenState::Acked);
        open_done && self.send.is_done() && self.end_read && self.reset == ResetState::None
    }
}

/// Below this many slots the stream map keeps its room.
const MAP_SHRINK_FLOOR: usize = 1024;

/// Limits and windows of the stream layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamLimits {
    /// Streams the peer may have open at once.
    pub(crate) max_remote_streams: u64,
    /// Receive window per stream and for the connection.
    pub(crate) stream_window: u64,
    pub(crate) connection_window: u64,
    /// Unacknowledged bytes a stream, and all streams together, may buffer for sending.
    pub(crate) stream_send_buffer: u64,
    pub(crate) connection_send_buffer: u64,
}

/// The peer's limits, from its handshake.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerLimits {
    pub(crate) max_streams: u64,
    pub(crate) stream_window: u64,
    pub(crate) connection_window: u64,
    /// The peer parses STREAM frames marked PUSH (a peer before them would close the
    /// connection on the unknown frame type).
    pub(crate) push: bool,
}

#[derive(Debug)]
pub(crate) struct Streams {
    initiator: bool,
    limits: StreamLimits,
    peer: PeerLimits,
    /// Boxed: a stream's state is a few hundred bytes, and a map's spare slots (up to
    /// half of them after it grows) would otherwise hold that much each.
    map: FastMap<StreamId, Box<Stream>>,
    next_local: u64,
    next_remote: u64,
    /// Total local streams the peer allows (cumulative).
    max_local: u64,
    /// Total remote streams we allow (cumulative), and how many of them closed.
    max_remote: u64,
    remote_closed: u64,
    max_streams_queued: bool,
    /// New bytes sent on all streams, and the peer's limit for them.
    sent_data: u64,
    send_max_data: u64,
    /// Highest offsets received on all streams, what the application consumed, and our limit.
    received_data: u64,
    consumed_data: u64,
    recv_max_data: u64,
    max_data_queued: bool,
    /// Bytes buffered for sending on all streams (unacknowledged), and how many streams hold
    /// some.
    buffered: u64,
    /// Bytes written on all streams and never sent yet, and the most the path's pace lets
    /// them queue (the last `pace` [`Streams::write`] was given).
    unsent: u64,
    pace: u64,
    /// Streams whose sending direction is still open: the connection's send buffer is shared
    /// among them.
    senders: u64,
    scheduler: Box<dyn Scheduler>,
    resets: VecDeque<StreamId>,
    max_stream_data: VecDeque<StreamId>,
    /// Streams whose writes were refused: for want of acknowledgments, and while the
    /// connection's queue of unsent bytes (its pace) was full. Those refused by their own
    /// queue (`unsent_limit`, their share of the pace) are woken by their own sending.
    write_blocked: Vec<StreamId>,
    queue_blocked: Vec<StreamId>,
    /// Streams whose buffers hold memory, to be given back once idle.
    holding: Vec<StreamId>,
    events: VecDeque<StreamEvent>,
}

impl Streams {
    pub(crate) fn new(initiator: bool, limits: StreamLimits, peer: PeerLimits) -> Self {
        Self {
            initiator,
            limits,
            peer,
            map: FastMap::default(),
            next_local: 0,
            next_remote: 0,
            max_local: peer.max_streams,
            max_remote: limits.max_remote_streams,
            remote_closed: 0,
            max_streams_queued: false,
            sent_data: 0,
            send_max_data: peer.connection_window,
            received_data: 0,
            consumed_data: 0,
            recv_max_data: limits.connection_window,
            max_data_queued: false,
            buffered: 0,
            unsent: 0,
            pace: u64::MAX,
            senders: 0,
            scheduler: Box::new(RoundRobin::default()),
            resets: VecDeque::new(),
            max_stream_data: VecDeque::new(),
            write_blocked: Vec::new(),
            queue_blocked: Vec::new(),
            holding: Vec::new(),
            events: VecDeque::new(),
        }
    }

    /// Memory the streams' send and receive buffers hold.
    #[cfg(test)]
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.map
            .values()
            .map(|s| s.send.capacity() + s.recv.capacity())
            .sum()
    }

    /// Whether some stream's buffers hold memory: the connection then calls
    /// [`Streams::release_idle_buffers`] every [`BUFFER_SWEEP`].
    pub(crate) fn holds_buffers(&self) -> bool {
        !self.holding.is_empty()
    }

    /// Gives back all the memory of buffers that are empty and saw no traffic since the
    /// previous call. A buffer is not freed the moment it empties: a stream at full rate
    /// empties its buffers many times a second, and shrinking and regrowing them cost the
    /// receiving gateway a third of its CPU in fresh zeroed pages and their unmapping. A
    /// quiet one keeps nothing, however large it was: ten thousand SMB sessions open and
    /// idle, each of which once read a file, held 64 KiB each when a floor was kept.
    /// A quiet stream leaves the list either way: one whose buffer still holds data (its
    /// reader or the peer's acknowledgments stalled) is listed again by the read or
    /// acknowledgment that empties it, so a stalled connection is not swept every second.
    pub(crate) fn release_idle_buffers(&mut self) {
        let map = &mut self.map;
        self.holding.retain(|id| {
            let Some(stream) = map.get_mut(id) else {
                return false;
            };
            if std::mem::take(&mut stream.busy) {
                return true;
            }
            stream.send.release_if_empty();
            stream.recv.release_if_empty();
            stream.listed = false;
            false
        });
    }

    /// The peer's limits arrived with its handshake message.
    pub(crate) fn set_peer_limits(&mut self, peer: PeerLimits) {
        self.peer = peer;
        self.max_local = self.max_local.max(peer.max_streams);
        self.send_max_data = self.send_max_data.max(peer.connection_window);
    }

    pub(crate) fn poll_event(&mut self) -> Option<StreamEvent> {
        self.events.pop_front()
    }

    /// Bytes held for sending on all streams: written and not yet acknowledged.
    pub(crate) fn send_buffered(&self) -> u64 {
        self.buffered
    }

    /// Bytes written on all streams and never sent.
    pub(crate) fn send_unsent(&self) -> u64 {
        self.unsent
    }

    /// Bytes received on all streams (up to the highest offset, holes included) and not yet
    /// read.
    pub(crate) fn receive_buffered(&self) -> u64 {
        self.received_data - self.consumed_data
    }

    /// Whether everything sent on every stream has been acknowledged (O(streams); for a
    /// shutdown).
    pub(crate) fn all_delivered(&self) -> bool {
        self.map.values().all(|s| s.is_delivered())
    }

    /// Streams currently open (including ones closing).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn open(&mut self, meta: StreamMeta) -> Result<StreamId, StreamError> {
        if meta.hint.len() > MAX_HINT_LEN {
            return Err(StreamError::HintTooLong);
        }
        if let Some(Target::Name { host, .. }) = &meta.destination {
            if host.is_empty() || host.len() > MAX_NAME_LEN {
                return Err(StreamError::BadName);
            }
        }
        if self.next_local >= self.max_local {
            return Err(StreamError::TooManyStreams);
        }
        let id = StreamId::new(self.initiator, self.next_local);
        self.next_local += 1;
        let stream = Stream::new(
            OpenState::Pending,
            Some(meta),
            self.peer.stream_window,
            self.limits.stream_window,
        );
        self.map.insert(id, Box::new(stream));
        self.senders += 1;
        self.enqueue(id);
        Ok(id)
    }

    pub(crate) fn meta(&self, id: StreamId) -> Option<&StreamMeta> {
        self.map.get(&id)?.meta.as_ref()
    }

    /// Hands the order of sending to `scheduler`; the streams queued now move to it.
    pub(crate) fn set_scheduler(&mut self, mut scheduler: Box<dyn Scheduler>) {
        let mut queued: Vec<StreamId> = self
            .map
            .iter()
            .filter(|(_, s)| s.queued)
            .map(|(&id, _)| id)
            .collect();
        queued.sort_unstable();
        for id in queued {
            self.scheduler.remove(id);
            scheduler.push(id);
        }
        self.scheduler = scheduler;
    }

    /// When the scheduler lets a queued stream send, if it holds them all back now.
    pub(crate) fn held_until(&self, now: Instant) -> Option<Instant> {
        if self.scheduler.is_empty() {
            return None;
        }
        self.scheduler.poll_timeout(now).filter(|&at| at > now)
    }

    /// Whether anything but stream data the scheduler holds back is waiting: credit,
    /// resets.
    pub(crate) fn has_control_pending(&self) -> bool {
        self.max_data_queued
            || self.max_streams_queued
            || !self.resets.is_empty()
            || !self.max_stream_data.is_empty()
    }

    /// Buffers `data` for sending, as much as fits under the stream's and the connection's
    /// limits: unacknowledged bytes within the configured send buffers, and bytes never sent
    /// within `pace` (what the path carries now, `Recovery::send_budget`), so that the
    /// application is read only as fast as the path drains what it wrote. What is in
    /// flight is the congestion window's to bound, so a scheduler's favourite stream refills
    /// as fast as it sends, whatever the others hold.
    pub(crate) fn write(
        &mut self,
        id: StreamId,
        data: &[u8],
        pace: u64,
    ) -> Result<usize, StreamError> {
        self.write_parts(id, &[data], pace)
    }

    /// As [`Self::write`], for the bytes of `parts` one after the other.
    pub(crate) fn write_parts<P: Deref<Target = [u8]>>(
        &mut self,
        id: StreamId,
        parts: &[P],
        pace: u64,
    ) -> Result<usize, StreamError> {
        let stream = self.map.get_mut(&id).ok_or(StreamError::UnknownStream)?;
        if let ResetState::LocalPending { code } | ResetState::LocalSent { code } = stream.reset {
            return Err(StreamError::Reset(code));
        }
        if stream.send.is_finished() {
            return Err(StreamError::Finished);
        }
        // When the connection's buffer is the limit, each stream holding data may fill only its
        // share of it; otherwise the first streams to write would keep it full and later
        // ones would never get a byte into it.
        let held = stream.send.buffered() as u64;
        let senders = self.senders.max(1);
        let share = (self.limits.connection_send_buffer / senders).max(MIN_SHARE);
        let stream_room = self
            .limits
            .stream_send_buffer
            .min(share)
            .saturating_sub(held);
        let conn_room = self
            .limits
            .connection_send_buffer
            .saturating_sub(self.buffered);
        self.pace = pace;
        let unsent = stream.send.unsent_bytes();
        // A stream may always queue its minimum share, however full the connection's queue:
        // a new stream does not wait behind what an older one queued.
        let own_room = (pace / senders).max(MIN_SHARE).saturating_sub(unsent);
        let shared_room = pace
            .saturating_sub(self.unsent)
            .max(MIN_SHARE.saturating_sub(unsent));
        let pace_room = shared_room.min(own_room);
        let queue_room = stream.unsent_limit.saturating_sub(unsent);
        let buffer_room = stream_room.min(conn_room);
        let room = buffer_room.min(pace_room).min(queue_room) as usize;
        let n = stream.send.write(parts, room);
        if n == 0 && parts.iter().any(|part| !part.is_empty()) {
            if !stream.write_blocked {
                stream.write_blocked = true;
                // Held back by a queue (sending makes room) or by unacknowledged bytes
                // (an acknowledgment does): woken by what will free it, and only by that.
                // By a queue: once its own sending drained it to half, or, if the
                // connection's queue was full, once that one drained to half.
                stream.blocked_by_queue = buffer_room > 0;
                stream.wake_at_unsent = unsent / 2;
                if stream.blocked_by_queue {
                    if shared_room == 0 && !stream.queue_listed {
                        stream.queue_listed = true;
                        self.queue_blocked.push(id);
                    }
                } else if !stream.ack_listed {
                    stream.ack_listed = true;
                    self.write_blocked.push(id);
                }
            }
            return Err(StreamError::Blocked);
        }
        // Room again (more acknowledged, a larger pace): a later refusal is judged afresh.
        stream.write_blocked = false;
        if stream.note_traffic() {
            self.holding.push(id);
        }
        self.buffered += n as u64;
        self.unsent += n as u64;
        self.enqueue(id);
        Ok(n)
    }

    /// Lets stream `id` hold at most `limit` bytes written and not yet sent. A writer held
    /// back by its queue is told to try again when the new limit leaves room (with nothing
    /// unsent, its own sending would never wake it).
    pub(crate) fn set_unsent_limit(&mut self, id: StreamId, limit: u64) {
        if let Some(stream) = self.map.get_mut(&id) {
            stream.unsent_limit = limit;
            let unsent = stream.send.unsent_bytes();
            if stream.write_blocked && stream.blocked_by_queue && limit > unsent {
                stream.write_blocked = false;
                self.events.push_back(StreamEvent::Writable(id));
            }
        }
    }

    pub(crate) fn set_dscp(&mut self, id: StreamId, dscp: u8) {
        if let Some(stream) = self.map.get_mut(&id) {
            stream.dscp = dscp & 0x3f;
        }
    }

    pub(crate) fn finish(&mut self, id: StreamId) -> Result<(), StreamError> {
        let stream = self.map.get_mut(&id).ok_or(StreamError::UnknownStream)?;
        if let ResetState::LocalPending { code } | ResetState::LocalSent { code } = stream.reset {
            return Err(StreamError::Reset(code));
        }
        self.senders -= u64::from(!stream.send.is_finished());
        stream.send.finish();
        self.enqueue(id);
        Ok(())
    }

    /// Reads into `buf`: `Ok(Some(n))` bytes, `Ok(None)` at the end of the stream.
    pub(crate) fn read(
        &mut self,
        id: StreamId,
        buf: &mut [u8],
    ) -> Result<Option<usize>, StreamError> {
        let stream = self.map.get_mut(&id).ok_or(StreamError::UnknownStream)?;
        if let ResetState::LocalPending { code } | ResetState::LocalSent { code } = stream.reset {
            return Err(StreamError::Reset(code));
        }
        let n = stream.recv.read(buf);
        if stream.list_if_holding() {
            self.holding.push(id);
        }
        if n == 0 {
            stream.readable_notified = false;
            if stream.recv.is_finished() {
                stream.end_read = true;
                self.maybe_close(id);
                return Ok(None);
            }
            return Err(StreamError::Blocked);
        }
        if stream.recv.readable() == 0 {
            stream.readable_notified = false;
        }
        // Credit: move the stream's window when an eighth of it was consumed. The sender
        // learns of it half a round trip later, so what it may have outstanding stays
        // between 7/8 of the window and all of it (moved at half, it fell to half: on a long
        // path that, not the path, set a stream's rate).
        let consumed = stream.recv.read_offset();
        if stream.recv.final_size().is_none()
            && stream.recv_max - consumed
                < self.limits.stream_window - self.limits.stream_window / 8
        {
            stream.recv_max = consumed + self.limits.stream_window;
            if !stream.max_stream_data_queued {
                stream.max_stream_data_queued = true;
                self.max_stream_data.push_back(id);
            }
        }
        self.consume(n as u64);
        Ok(Some(n))
    }

    fn consume(&mut self, n: u64) {
        self.consumed_data += n;
        if self.recv_max_data - self.consumed_data < self.limits.connection_window / 2 {
            self.recv_max_data = self.consumed_data + self.limits.connection_window;
            self.max_data_queued = true;
        }
    }

    /// Aborts the stream both ways: buffered data is dropped and the peer is told.
    pub(crate) fn reset(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        let stream = self.map.get_mut(&id).ok_or(StreamError::UnknownStream)?;
        if stream.reset != ResetState::None {
            return Ok(());
        }
        self.buffered -= stream.send.buffered() as u64;
        self.unsent -= stream.send.unsent_bytes();
        self.senders -= u64::from(!stream.send.is_finished());
        stream.reset_final_size = stream.send.sent_offset();
        stream.send.clear();
        let unread = stream.recv.highest() - stream.recv.read_offset();
        stream.recv.clear();
        stream.reset = ResetState::LocalPending { code };
        self.resets.push_back(id);
        self.consume(unread);
        Ok(())
    }

    /// Flow-control credit (window updates, stream slots) waits to be sent.
    pub(crate) fn credit_queued(&self) -> bool {
        self.max_data_queued || self.max_streams_queued || !self.max_stream_data.is_empty()
    }

    pub(crate) fn readable(&self, id: StreamId) -> bool {
        self.map
            .get(&id)
            .is_some_and(|s| s.recv.readable() > 0 || s.recv.is_finished())
    }

    /// Whether stream `id` holds, contiguous from the read position, everything up to the
    /// end of a frame its sender marked PUSH (or FIN): the end of what the peer had to send
    /// for now, which its reader should get without delay.
    pub(crate) fn pushed(&self, id: StreamId) -> bool {
        self.map.get(&id).is_some_and(|s| s.recv.pushed())
    }

    pub(crate) fn readable_bytes(&self, id: StreamId) -> usize {
        self.map.get(&id).map_or(0, |s| s.recv.readable())
    }

    fn enqueue(&mut self, id: StreamId) {
        let conn_credit = self.send_max_data - self.sent_data;
        let Some(stream) = self.map.get_mut(&id) else {
            return;
        };
        if !stream.queued && stream.wants_to_send(conn_credit) {
            stream.queued = true;
            self.scheduler.push(id);
        }
    }

    fn maybe_close(&mut self, id: StreamId) {
        let Some(stream) = self.map.get(&id) else {
            return;
        };
        if !stream.is_closed() {
            return;
        }
        self.remove(id);
    }

    fn remove(&mut self, id: StreamId) {
        let Some(stream) = self.map.remove(&id) else {
            return;
        };
        // After a burst, give the memory back: shrunk to twice what is left whenever a
        // quarter or less of the room is used (amortised O(1) a stream).
        if self.map.capacity() > MAP_SHRINK_FLOOR && self.map.len() * 4 <= self.map.capacity() {
            self.map.shrink_to(self.map.len() * 2);
        }
        self.buffered -= stream.send.buffered() as u64;
        self.unsent -= stream.send.unsent_bytes();
        self.senders -= u64::from(!stream.send.is_finished() && stream.reset == ResetState::None);
        if stream.queued {
            self.scheduler.remove(id);
        }
        if id.opened_by_initiator() != self.initiator {
            self.remote_closed += 1;
            let max = self.remote_closed + self.limits.max_remote_streams;
            if max > self.max_remote {
                self.max_remote = max;
                self.max_streams_queued = true;
            }
        }
    }

    /// Whether any stream frame or credit is waiting to be sent.
    pub(crate) fn has_pending(&self) -> bool {
        self.has_control_pending() || !self.scheduler.is_empty()
    }

    /// Writes control frames (credit, resets) that fit in `w`, recording them in `sent`.
    pub(crate) fn write_control_frames(
        &mut self,
        w: &mut Writer<'_>,
        sent: &mut Vec<StreamFrameSent>,
    ) {
        if self.max_data_queued && Frame::MaxData(self.recv_max_data).encode_if_fits(w) {
            sent.push(StreamFrameSent::MaxData);
            self.max_data_queued = false;
        }
        if self.max_streams_queued && Frame::MaxStreams(self.max_remote).encode_if_fits(w) {
            sent.push(StreamFrameSent::MaxStreams);
            self.max_streams_queued = false;
        }
        while let Some(&id) = self.max_stream_data.front() {
            let Some(stream) = self.map.get_mut(&id) else {
                self.max_stream_data.pop_front();
                continue;
            };
            let max = stream.recv_max;
            if !(Frame::MaxStreamData { id, max }).encode_if_fits(w) {
                break;
            }
            stream.max_stream_data_queued = false;
            sent.push(StreamFrameSent::MaxStreamData(id));
            self.max_stream_data.pop_front();
        }
        while let Some(&id) = self.resets.front() {
            let Some(stream) = self.map.get_mut(&id) else {
                self.resets.pop_front();
                continue;
            };
            let ResetState::LocalPending { code } = stream.reset else {
                self.resets.pop_front();
                continue;
            };
            let final_size = stream.reset_final_size;
            let reset = Frame::Reset {
                id,
                code,
                final_size,
            };
            if !reset.encode_if_fits(w) {
                break;
            }
            stream.reset = ResetState::LocalSent { code };
            sent.push(StreamFrameSent::Reset(id));
            self.resets.pop_front();
        }
    }

    /// Writes OPEN and STREAM frames into `w` as the scheduler picks them, until `w` is full or
    /// nothing is left; records them in `sent`. Returns the stream bytes written.
    pub(crate) fn write_stream_frames(
        &mut self,
        now: Instant,
        w: &mut Writer<'_>,
        sent: &mut Vec<StreamFrameSent>,
        mark: &mut BurstMark,
    ) -> usize {
        let mut total = 0;
        // The smallest useful frame: a header and a few bytes.
        while w.remaining() >= 24 {
            let Some(turn) = self.scheduler.next(now) else {
                break;
            };
            let id = turn.id;
            let conn_credit = self.send_max_data - self.sent_data;
            let Some(stream) = self
                .map
                .get_mut(&id)
                .filter(|s| s.wants_to_send(conn_credit))
            else {
                if let Some(stream) = self.map.get_mut(&id) {
                    stream.queued = false;
                }
                self.scheduler.remove(id);
                continue;
            };
            match mark.dscp {
                None => mark.dscp = Some(stream.dscp),
                Some(d) if d != stream.dscp => {
                    // One DSCP per burst: this stream keeps its place for the next one.
                    mark.ended = true;
                    self.scheduler.sent(id, 0, true, now);
                    break;
                }
                Some(_) => {}
            }
            if stream.open == OpenState::Pending {
                let meta = stream
                    .meta
                    .as_ref()
                    .expect("local streams carry their metadata");
                let open = Frame::Open {
                    id,
                    meta: Cow::Borrowed(meta),
                };
                if !open.encode_if_fits(w) {
                    break;
                }
                stream.open = OpenState::Sent;
                sent.push(StreamFrameSent::Open(id));
            }
            let limit = stream.send_max.min(stream.send.sent_offset() + conn_credit);
            let before = stream.send.sent_offset();
            let longest = StreamHeader {
                id,
                offset: stream.send.written(),
                len: w.remaining(),
                fin: false,
                push: false,
            };
            let room = (w.remaining().saturating_sub(longest.encoded_len())).min(turn.max_bytes);
            let mut bytes = 0;
            if let Some(chunk) = stream.send.next_chunk(room, limit) {
                let header = StreamHeader {
                    id,
                    offset: chunk.offset,
                    len: chunk.len,
                    fin: chunk.fin,
                    // It carries the last byte written so far: the peer should not wait for
                    // more before handing it over.
                    push: self.peer.push
                        && chunk.offset + chunk.len as u64 == stream.send.written(),
                };
                header.encode(w);
                stream.send.copy(chunk.offset, w.reserve(chunk.len));
                sent.push(StreamFrameSent::Data {
                    id,
                    offset: chunk.offset,
                    len: chunk.len as u32,
                    fin: chunk.fin,
                });
                bytes = chunk.len;
                total += chunk.len;
                let new = stream.send.sent_offset() - before;
                self.sent_data += new;
                self.unsent -= new;
            }
            let more = stream.wants_to_send(self.send_max_data - self.sent_data);
            stream.queued = more;
            let unsent = stream.send.unsent_bytes();
            if bytes > 0
                && stream.write_blocked
                && stream.blocked_by_queue
                && unsent <= stream.wake_at_unsent
            {
                // Sending drained its own queue to half. (Its entry in the list stays; waking
                // skips a stream no longer blocked.)
                stream.write_blocked = false;
                self.events.push_back(StreamEvent::Writable(id));
            }
            self.scheduler.sent(id, bytes, more, now);
        }
        if self.unsent <= self.pace / 2 && !self.queue_blocked.is_empty() {
            // The connection's queue drained to half: the streams it held back may write.
            Self::wake(
                &mut self.map,
                &mut self.queue_blocked,
                &mut self.events,
                true,
            );
        }
        total
    }

    /// A packet carrying `frame` was acknowledged.
    pub(crate) fn on_acked(&mut self, frame: StreamFrameSent) {
        match frame {
            StreamFrameSent::Data {
                id,
                offset,
                len,
                fin,
            } => {
                let Some(stream) = self.map.get_mut(&id) else {
                    return;
                };
                let before = stream.send.buffered();
                stream.send.ack(offset, u64::from(len), fin);
                if stream.list_if_holding() {
                    self.holding.push(id);
                }
                let freed = before - stream.send.buffered();
                self.buffered -= freed as u64;
                if freed > 0 {
                    self.wake_writers();
                }
                self.maybe_close(id);
            }
            StreamFrameSent::Open(id) => {
                if let Some(stream) = self.map.get_mut(&id) {
                    stream.open = OpenState::Acked;
                }
                self.maybe_close(id);
            }
            StreamFrameSent::Reset(id) => {
                if let Some(stream) = self.map.get(&id) {
                    if matches!(stream.reset, ResetState::LocalSent { .. }) {
                        self.remove(id);
                    }
                }
            }
            StreamFrameSent::MaxStreamData(_)
            | StreamFrameSent::MaxData
            | StreamFrameSent::MaxStreams => {}
        }
    }

    fn wake_writers(&mut self) {
        Self::wake(
            &mut self.map,
            &mut self.write_blocked,
            &mut self.events,
            false,
        );
    }

    /// Streams the map has room for (a test's check that a burst's memory is given back).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.map.capacity()
    }

    /// Entries in the lists of blocked writers (a test's check that they stay bounded).
    #[cfg(test)]
    pub(crate) fn blocked_listed(&self) -> usize {
        self.write_blocked.len() + self.queue_blocked.len()
    }

    /// Tells the streams of `list` (`queue`: `queue_blocked`) that are still blocked that
    /// they may write.
    fn wake(
        map: &mut FastMap<StreamId, Box<Stream>>,
        list: &mut Vec<StreamId>,
        events: &mut VecDeque<StreamEvent>,
        queue: bool,
    ) {
        for id in list.drain(..) {
            let Some(stream) = map.get_mut(&id) else {
                continue;
            };
            if queue {
                stream.queue_listed = false;
            } else {
                stream.ack_listed = false;
            }
            if stream.write_blocked {
                stream.write_blocked = false;
                events.push_back(StreamEvent::Writable(id));
            }
        }
    }

    /// A packet carrying `frame` was declared lost.
    pub(crate) fn on_lost(&mut self, frame: StreamFrameSent) {
        match frame {
            StreamFrameSent::Data {
                id,
                offset,
                len,
                fin,
            } => {
                if let Some(stream) = self.map.get_mut(&id) {
                    if stream.reset == ResetState::None {
                        stream.send.lost(offset, u64::from(len), fin);
                    }
                }
                self.enqueue(id);
            }
            StreamFrameSent::Open(id) => {
                if let Some(stream) = self.map.get_mut(&id) {
                    if stream.open == OpenState::Sent {
                        stream.open = OpenState::Pending;
                    }
                }
                self.enqueue(id);
            }
            StreamFrameSent::Reset(id) => {
                if let Some(stream) = self.map.get_mut(&id) {
                    if let ResetState::LocalSent { code } = stream.reset {
                        stream.reset = ResetState::LocalPending { code };
                        self.resets.push_back(id);
                    }
                }
            }
            StreamFrameSent::MaxStreamData(id) => {
                if let Some(stream) = self.map.get_mut(&id) {
                    if !stream.max_stream_data_queued && stream.recv.final_size().is_none() {
                        stream.max_stream_data_queued = true;
                        self.max_stream_data.push_back(id);
                    }
                }
            }
            StreamFrameSent::MaxData => self.max_data_queued = true,
            StreamFrameSent::MaxStreams => self.max_streams_queued = true,
        }
    }

    /// Finds or creates the state of a stream the peer refers to. `Ok(None)`: a closed stream;
    /// the frame is stale and ignored.
    fn remote_or_existing(&mut self, id: StreamId) -> Result<Option<&mut Stream>, StreamViolation> {
        if id.opened_by_initiator() == self.initiator {
            // One of ours.
            if id.index() >= self.next_local {
                return Err(StreamViolation::NotOpenedByPeer(id));
            }
            return Ok(self.map.get_mut(&id).map(|s| &mut **s));
        }
        if id.index() >= self.max_remote {
            return Err(StreamViolation::StreamLimit(id));
        }
        // Streams are opened in order: a frame for stream n opens all below it too.
        while self.next_remote <= id.index() {
            let new = StreamId::new(!self.initiator, self.next_remote);
            self.next_remote += 1;
            let stream = Stream::new(
                OpenState::Remote,
                None,
                self.peer.stream_window,
                self.limits.stream_window,
            );
            self.map.insert(new, Box::new(stream));
            self.senders += 1;
        }
        Ok(self.map.get_mut(&id).map(|s| &mut **s))
    }

    pub(crate) fn on_open(
        &mut self,
        id: StreamId,
        meta: StreamMeta,
    ) -> Result<(), StreamViolation> {
        if id.opened_by_initiator() == self.initiator {
            return Err(StreamViolation::NotOpenedByPeer(id));
        }
        let Some(stream) = self.remote_or_existing(id)? else {
            return Ok(());
        };
        if stream.meta.is_some() {
            return Ok(());
        }
        stream.meta = Some(meta);
        let readable = stream.recv.readable() > 0 || stream.recv.is_finished();
        stream.readable_notified = readable;
        self.events.push_back(StreamEvent::Opened(id));
        if readable {
            self.events.push_back(StreamEvent::Readable(id));
        }
        Ok(())
    }

    pub(crate) fn on_stream(&mut self, f: &StreamFrame<'_>) -> Result<(), StreamViolation> {
        let id = f.id;
        let Some(stream) = self.remote_or_existing(id)? else {
            return Ok(());
        };
        if stream.reset != ResetState::None {
            return Ok(());
        }
        let grown = stream
            .recv
            .insert(f.offset, f.data, f.fin, stream.recv_max)
            .map_err(|e| StreamViolation::Recv(id, e))?;
        if f.push || f.fin {
            stream.recv.push_to(f.offset + f.data.len() as u64);
        }
        let newly_listed = stream.note_traffic();
        let announce = stream.meta.is_some()
            && !stream.readable_notified
            && (stream.recv.readable() > 0 || stream.recv.is_finished());
        if announce {
            stream.readable_notified = true;
        }
        if newly_listed {
            self.holding.push(id);
        }
        self.received_data += grown;
        if self.received_data > self.recv_max_data {
            return Err(StreamViolation::ConnectionFlowControl);
        }
        if announce {
            self.events.push_back(StreamEvent::Readable(id));
        }
        Ok(())
    }

    pub(crate) fn on_reset(
        &mut self,
        id: StreamId,
        code: u64,
        final_size: u64,
    ) -> Result<(), StreamViolation> {
        let Some(stream) = self.remote_or_existing(id)? else {
            return Ok(());
        };
        let highest = stream.recv.highest();
        if final_size < highest || final_size > stream.recv_max {
            return Err(StreamViolation::Recv(id, RecvError::FinalSize));
        }
        let unread = final_size - stream.recv.read_offset();
        let announced = stream.meta.is_some();
        self.received_data += final_size - highest;
        if self.received_data > self.recv_max_data {
            return Err(StreamViolation::ConnectionFlowControl);
        }
        self.consume(unread);
        if announced {
            self.events.push_back(StreamEvent::Reset { id, code });
        }
        self.remove(id);
        Ok(())
    }

    pub(crate) fn on_max_data(&mut self, max: u64) {
        if max > self.send_max_data {
            let was_blocked = self.send_max_data == self.sent_data;
            self.send_max_data = max;
            if was_blocked {
                let ids: Vec<StreamId> = self.map.keys().copied().collect();
                for id in ids {
                    self.enqueue(id);
                }
            }
        }
    }

    pub(crate) fn on_max_stream_data(
        &mut self,
        id: StreamId,
        max: u64,
    ) -> Result<(), StreamViolation> {
        let Some(stream) = self.remote_or_existing(id)? else {
            return Ok(());
        };
        if max > stream.send_max {
            stream.send_max = max;
            self.enqueue(id);
        }
        Ok(())
    }

    pub(crate) fn on_max_streams(&mut self, max: u64) {
        self.max_local = self.max_local.max(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{Frame, Frames};

    /// Streams with 1 MiB windows and 8 MiB send buffers, toward a peer that parses PUSH or
    /// not.
    fn streams(peer_push: bool) -> Streams {
        let limits = StreamLimits {
            max_remote_streams: 16,
            stream_window: 1 << 20,
            connection_window: 1 << 20,
            stream_send_buffer: 8 << 20,
            connection_send_buffer: 8 << 20,
        };
        let peer = PeerLimits {
            max_streams: 16,
            stream_window: 1 << 20,
            connection_window: 1 << 20,
            push: peer_push,
        };
        Streams::new(true, limits, peer)
    }

    /// Builds one packet of `packet` bytes; the PUSH bits of its STREAM frames, none when
    /// nothing was sent.
    fn send_packet(streams: &mut Streams, packet: usize) -> Vec<bool> {
        let now = crate::test_epoch();
        let mut buf = vec![0u8; packet];
        let mut w = Writer::new(&mut buf);
        let (mut sent, mut mark) = (Vec::new(), BurstMark::default());
        if streams.write_stream_frames(now, &mut w, &mut sent, &mut mark) == 0 {
            return Vec::new();
        }
        let n = w.len();
        Frames::new(&buf[..n])
            .filter_map(|frame| match frame {
                Ok(Frame::Stream(f)) => Some(f.push),
                _ => None,
            })
            .collect()
    }

    /// The PUSH bits of the STREAM frames a side sends for `writes` (written before the frames
    /// are built), to a peer that parses PUSH or not, `packet` bytes per packet.
    fn push_bits(peer_push: bool, writes: &[usize], packet: usize) -> Vec<bool> {
        let mut streams = streams(peer_push);
        let id = streams.open(StreamMeta::default()).expect("room");
        for &n in writes {
            assert_eq!(streams.write(id, &vec![1; n], u64::MAX), Ok(n));
        }
        let mut bits = Vec::new();
        loop {
            let frames = send_packet(&mut streams, packet);
            if frames.is_empty() {
                return bits;
            }
            bits.extend(frames);
        }
    }

    /// Sends 1,200-byte packets until nothing is left to send (events before are dropped);
    /// the bytes unsent each time `id` was reported writable.
    fn send_all(streams: &mut Streams, id: StreamId) -> Vec<u64> {
        while streams.poll_event().is_some() {}
        let mut woken = Vec::new();
        while !send_packet(streams, 1_200).is_empty() {
            while let Some(event) = streams.poll_event() {
                if event == StreamEvent::Writable(id) {
                    woken.push(streams.send_unsent());
                }
            }
        }
        woken
    }

    /// A writer refused for want of queue room is woken once, when its stream's sending has
    /// drained the queue to half of what it held: not by every packet that takes some.
    #[test]
    fn a_writer_held_back_by_its_queue_is_woken_once_it_drained_to_half() {
        let mut streams = streams(true);
        let id = streams.open(StreamMeta::default()).expect("room");
        streams.set_unsent_limit(id, 10_000);
        assert_eq!(streams.write(id, &[1; 12_000], u64::MAX), Ok(10_000));
        assert_eq!(
            streams.write(id, &[1; 2_000], u64::MAX),
            Err(StreamError::Blocked)
        );
        let woken = send_all(&mut streams, id);
        assert_eq!(woken.len(), 1, "woken with {woken:?} unsent");
        // The first packet that took the queue to 5,000 bytes or below.
        assert!((5_000 - 1_200..=5_000).contains(&woken[0]), "{woken:?}");
    }

    /// A write that succeeds between two refusals ends the first: the second refusal's
    /// queue (here its share of a larger pace) sets when the writer is woken.
    #[test]
    fn a_writer_is_woken_at_half_of_its_latest_refusal() {
        const PACE: u64 = 1 << 18;
        let mut streams = streams(true);
        let id = streams.open(StreamMeta::default()).expect("room");
        // A second sender: each may queue half the pace, and a stream refused for its own
        // share is not waiting for the connection's queue.
        streams.open(StreamMeta::default()).expect("room");
        let data = vec![1u8; 4 * PACE as usize];
        assert_eq!(streams.write(id, &data, PACE), Ok(PACE as usize / 2));
        assert_eq!(streams.write(id, &data, PACE), Err(StreamError::Blocked));
        assert!(!send_packet(&mut streams, 1_200).is_empty());
        // The pace quadrupled: room again, then refused at the new share.
        streams
            .write(id, &data, 4 * PACE)
            .expect("room under the larger pace");
        assert_eq!(streams.send_unsent(), 2 * PACE);
        assert_eq!(
            streams.write(id, &data, 4 * PACE),
            Err(StreamError::Blocked)
        );
        let woken = send_all(&mut streams, id);
        let first = *woken.first().expect("woken");
        assert!((PACE - 1_200..=PACE).contains(&first), "{woken:?}");
    }

    /// A writer held back by an unsent limit of zero has nothing to send that would wake
    /// it: raising the limit does.
    #[test]
    fn raising_the_unsent_limit_wakes_a_writer_it_held_back() {
        let mut streams = streams(true);
        let id = streams.open(StreamMeta::default()).expect("room");
        streams.set_unsent_limit(id, 0);
        assert_eq!(
            streams.write(id, &[1; 100], u64::MAX),
            Err(StreamError::Blocked)
        );
        while streams.poll_event().is_some() {}
        streams.set_unsent_limit(id, 0);
        assert_eq!(streams.poll_event(), None, "no room yet");
        streams.set_unsent_limit(id, 50);
        assert_eq!(streams.poll_event(), Some(StreamEvent::Writable(id)));
        assert_eq!(streams.write(id, &[1; 100], u64::MAX), Ok(50));
    }

    #[test]
    fn push_marks_the_frame_with_the_last_byte_written_and_only_for_a_peer_that_parses_it() {
        // 5,000 bytes in 1,200-byte packets: five frames, the last one ends what was written.
        assert_eq!(
            push_bits(true, &[3_000, 2_000], 1_200),
            [false, false, false, false, true]
        );
        assert_eq!(push_bits(false, &[3_000, 2_000], 1_200), [false; 5]);
    }
}
