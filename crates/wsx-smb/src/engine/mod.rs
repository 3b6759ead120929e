//! The read-ahead engine: the two halves that act on an unsigned SMB session, far (the
//! server's gateway, [`Far`]) and near (the client's, [`Near`]), and what they say to each
//! other on the session's stream ([`link`]). ARCHITECTURE.md states the design: exact-id
//! prediction.
//!
//! ```text
//!  client ─READ m─> Near ──SMB──────────> Far ─READ m─────────> server
//!                                           ├─ANNOUNCE m+c──┐   (Far issues READ m+c itself)
//!                        <──SMB answer m──  │               └─> Near
//!                        <──PREFETCHED m+c─ ┘ <─answer m+c───── server
//!  client ─READ m+c─> Near: matches ANNOUNCE m+c ─> the answer, at once; CONSUMED m+c ─> Far
//! ```
//!
//! The same for a file just opened: with the CREATE's answer far announces the QUERY_INFO
//! and the READ the client sent after its last CREATE, with the ids that follow, so near
//! answers both; near answers the CLOSE itself. A file then takes one round trip.
//!
//! Both are pure state machines over whole frames ([`Near::from_client`],
//! [`Near::from_far`], [`Far::from_near`], [`Far::from_server`], and `poll_*` for what they
//! hand out). The gateway runs one in a [`Splice`], which takes and gives the session's
//! byte streams.

pub mod far;
pub mod link;
pub mod near;
pub mod splice;

pub use far::Far;
pub use link::{Record, RecordError};
pub use near::Near;
pub use splice::{Splice, SpliceError};

use crate::wire::header::{Command, HEADER_LEN, Header, Messages, TreeOrAsync, status};
use crate::wire::messages::{FileId, QueryInfoRequest, ReadRequest, ReadResponse};

/// What makes a READ the one predicted: the answer the server gives depends on nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadKey {
    pub session_id: u64,
    pub tree_id: u32,
    pub file_id: FileId,
    pub offset: u64,
    pub length: u32,
    pub minimum_count: u32,
    pub flags: u8,
    pub channel: u32,
    pub remaining_bytes: u32,
    pub credit_charge: u16,
}

impl ReadKey {
    /// The key of a READ request with `header`.
    pub fn of(header: &Header, read: &ReadRequest) -> Self {
        let tree_id = match header.tree_or_async {
            TreeOrAsync::Tree { tree_id, .. } => tree_id,
            TreeOrAsync::Async(_) => 0,
        };
        Self {
            session_id: header.session_id,
            tree_id,
            file_id: read.file_id,
            offset: read.offset,
            length: read.length,
            minimum_count: read.minimum_count,
            flags: read.flags,
            channel: read.channel,
            remaining_bytes: read.remaining_bytes,
            credit_charge: header.credit_charge,
        }
    }
}

impl ReadKey {
    /// Whether a prediction with this key answers a READ with `asked`: the same in every
    /// field but the length, which may be shorter (the answer is then cut to it).
    pub fn covers(&self, asked: &ReadKey) -> bool {
        asked.length <= self.length
            && ReadKey {
                length: self.length,
                ..*asked
            } == *self
    }
}

/// What makes a QUERY_INFO the one predicted (one without an input buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueryKey {
    pub session_id: u64,
    pub tree_id: u32,
    pub query: QueryInfoRequest,
    pub credit_charge: u16,
}

/// A request far may predict, by what its answer depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    Read(ReadKey),
    Query(QueryKey),
}

impl Key {
    /// The key of one request message (header and body), if it is of a kind far predicts.
    pub fn of(header: &Header, body: &[u8]) -> Option<Self> {
        if header.is_response() {
            return None;
        }
        let tree_id = match header.tree_or_async {
            TreeOrAsync::Tree { tree_id, .. } => tree_id,
            TreeOrAsync::Async(_) => 0,
        };
        match header.command {
            Command::READ => Some(Self::Read(ReadKey::of(
                header,
                &ReadRequest::parse(body).ok()?,
            ))),
            Command::QUERY_INFO => {
                let query = QueryInfoRequest::parse(body).ok()?;
                (query.input_buffer_length == 0).then_some(Self::Query(QueryKey {
                    session_id: header.session_id,
                    tree_id,
                    query,
                    credit_charge: header.credit_charge,
                }))
            }
            _ => None,
        }
    }

    /// Whether a prediction with this key answers a request with `asked`: the same, but
    /// that a READ may ask for less (its answer is then cut to it).
    pub fn covers(&self, asked: &Key) -> bool {
        match (self, asked) {
            (Self::Read(p), Self::Read(a)) => p.covers(a),
            (p, a) => p == a,
        }
    }

    pub fn file_id(&self) -> FileId {
        match self {
            Self::Read(r) => r.file_id,
            Self::Query(q) => q.query.file_id,
        }
    }

    /// The bytes of file data the request asks for: a READ's length, 0 for the rest.
    pub fn read_length(&self) -> u32 {
        match self {
            Self::Read(r) => r.length,
            Self::Query(_) => 0,
        }
    }

    /// The most bytes of data its answer may carry: a READ's length, a QUERY_INFO's
    /// output buffer.
    pub fn answer_bound(&self) -> u32 {
        match self {
            Self::Read(r) => r.length,
            Self::Query(q) => q.query.output_buffer_length,
        }
    }

    /// The ids the request spends.
    pub fn charge(&self) -> u64 {
        charge_of(match self {
            Self::Read(r) => r.credit_charge,
            Self::Query(q) => q.credit_charge,
        })
    }

    /// Cuts `answer`, the answer to a prediction that covers this key, to what this key
    /// asks: a READ's data to its length.
    fn cut_for(&self, answer: &mut Vec<u8>) {
        if let Self::Read(asked) = self {
            cut(answer, asked.length);
        }
    }
}

/// The MessageId and key of a frame that is one request far may predict and nothing else.
fn single_request(frame: &[u8]) -> Option<(u64, Key)> {
    let mut messages = Messages::new(frame);
    let (header, message) = messages.next()?;
    if messages.next().is_some() || header.next_command != 0 {
        return None;
    }
    Some((header.message_id, Key::of(&header, &message[HEADER_LEN..])?))
}

/// Cuts a successful READ answer's data to `length` bytes: the answer the server gives a
/// READ that asks for no more.
fn cut(answer: &mut Vec<u8>, length: u32) {
    let Some((header, _)) = Messages::new(answer).next() else {
        return;
    };
    if header.status != status::SUCCESS {
        return;
    }
    let body = HEADER_LEN..HEADER_LEN + ReadResponse::LEN;
    let Some(mut read) = answer
        .get(body.clone())
        .and_then(|b| ReadResponse::parse(b).ok())
    else {
        return;
    };
    if read.data_length <= length {
        return;
    }
    read.data_length = length;
    let end = usize::from(read.data_offset) + length as usize;
    if end <= answer.len() && read.emit(&mut answer[body]).is_some() {
        answer.truncate(end);
    }
}

/// A half's clock: the time the gateway last gave it, and the first time it gave.
#[derive(Debug, Default, Clone, Copy)]
struct Clock {
    now: Option<std::time::Instant>,
    epoch: Option<std::time::Instant>,
}

impl Clock {
    fn set(&mut self, now: std::time::Instant) {
        self.epoch.get_or_insert(now);
        self.now = Some(now);
    }

    /// Milliseconds from the first time given to the last, if any was.
    fn ms(&self) -> Option<u64> {
        let (now, epoch) = (self.now?, self.epoch?);
        u64::try_from(now.saturating_duration_since(epoch).as_millis()).ok()
    }
}

/// Credits a request of `charge` consumes: a CreditCharge of 0 (SMB 2.0.2) counts one.
fn charge_of(credit_charge: u16) -> u64 {
    u64::from(credit_charge.max(1))
}

/// Engine counters: what read-ahead did on one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// READs far issued ahead of the client, and the bytes they asked for.
    pub prefetched: u64,
    pub prefetched_bytes: u64,
    /// READs near answered from them.
    pub answered_locally: u64,
    /// Predictions the client did not use (their ids were burned at the server), and the
    /// bytes they asked for: read from the server for nothing.
    pub missed: u64,
    pub missed_bytes: u64,
    /// Client requests far gave a fresh MessageId because a prediction had used theirs.
    pub remapped: u64,
    /// Client READs that crossed their own prediction on the WAN (near had not had its
    /// announcement yet): answered by the prediction, not a miss.
    pub crossed: u64,
    /// Of the misses, predictions whose answer near held past its validity window (the
    /// client asked too late): the client's request went to the server after all.
    pub expired: u64,
    /// Files whose read-ahead a miss had stopped and the client's sequential READs
    /// started again.
    pub resumed: u64,
}

#[cfg(test)]
mod tests;
