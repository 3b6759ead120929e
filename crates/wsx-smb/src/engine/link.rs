//! What the two gateways' engines say to each other on a session's stream, between the SMB
//! frames they relay: each record has the Direct TCP frame's shape (a type byte and a 24-bit
//! big-endian length), so one [`Deframer`](crate::wire::framing::Deframer) splits both.
//! Type 0 is an SMB frame relayed as it is; the others are the engine's own:
//!
//! | type | name | from | payload |
//! |---|---|---|---|
//! | 0x00 | SMB | either | the frame's SMB2 message(s) |
//! | 0x01 | ANNOUNCE | far | MessageId (8), the predicted request's [`Key`]: 0 and a READ's [`ReadKey`], or 1 and a QUERY_INFO's [`QueryKey`]; then how long near may hold its answer, ms (4; 0: as long as the prediction stands) |
//! | 0x02 | PREFETCHED | far | MessageId (8), far's clock when the answer came, ms (8; all ones: far has none), the server's answer (an SMB2 message) |
//! | 0x03 | CONSUMED | near | MessageId (8): the client's READ was answered from it |
//! | 0x04 | OPAQUE | either | none: the rest of this direction is its end's bytes as they came ([`OPAQUE`]) |
//! | 0x05 | WITHDRAWN | far | MessageId (8): an announced prediction that will not be answered |
//! | 0x06 | DROPPED | near | MessageId (8): near dropped the announced prediction unused (its answer outlived its validity; an oplock break or a request that may change a file made it moot; the client went past its id); its id is spent at the server |

use super::{Key, QueryKey, ReadKey};
use crate::wire::framing::{FRAME_HEADER_LEN, MAX_FRAME_LEN};
use crate::wire::messages::{FileId, QueryInfoRequest};
use crate::wire::{le16, le32, le64};

const SMB: u8 = 0x00;
const ANNOUNCE: u8 = 0x01;
const PREFETCHED: u8 = 0x02;
const CONSUMED: u8 = 0x03;
/// The record after which a direction of the stream carries its end's bytes as they came,
/// not records: that end sent something that is not a Direct TCP frame (it does not speak
/// SMB2). Handled by [`Splice`](super::Splice), never parsed as a [`Record`].
pub const OPAQUE: u8 = 0x04;
const WITHDRAWN: u8 = 0x05;
const DROPPED: u8 = 0x06;
/// The highest record type there is.
pub(crate) const MAX_RECORD: u8 = DROPPED;
/// A PREFETCHED's `at` when far has no clock.
pub const NO_CLOCK: u64 = u64::MAX;

/// One record on the stream between the engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An SMB frame's payload, relayed.
    Smb(Vec<u8>),
    /// Far will issue this request with this MessageId; its answer follows. Near may give
    /// the client that answer only within `valid_ms` of its arrival (0: for as long as the
    /// prediction stands: the file is protected from other writers).
    Announce {
        message_id: u64,
        key: Key,
        valid_ms: u32,
    },
    /// The server's answer to an announced request, and far's clock when it came (ms from
    /// a time of far's own; [`NO_CLOCK`] if far has none): near measures from it how long
    /// the answer queued on its way.
    Prefetched {
        message_id: u64,
        at: u64,
        answer: Vec<u8>,
    },
    /// The client's READ with this MessageId was answered from the prefetched answer.
    Consumed { message_id: u64 },
    /// Far dropped this announced prediction (a miss spent the ids): no answer follows.
    Withdrawn { message_id: u64 },
    /// Near dropped this announced prediction unused (its answer outlived its validity, or
    /// an oplock break made it moot): a client request with the same id is not the
    /// prediction's (its id is spent at the server).
    Dropped { message_id: u64 },
}

/// A record that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("unknown engine record type {0:#04x}")]
    Type(u8),
    #[error("engine record of type {0:#04x} too short")]
    Truncated(u8),
    #[error("engine record of {0} bytes is longer than a frame may be")]
    TooLong(usize),
}

const KEY_LEN: usize = 8 + 4 + 16 + 8 + 4 + 4 + 1 + 4 + 4 + 2;
const QUERY_KEY_LEN: usize = 8 + 4 + QueryInfoRequest::LEN + 2;

impl Record {
    /// Parses a record of `kind` (the frame's first byte) and `payload`.
    pub fn parse(kind: u8, payload: &[u8]) -> Result<Self, RecordError> {
        let id = |p: &[u8]| -> Result<u64, RecordError> {
            let b: [u8; 8] = p
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or(RecordError::Truncated(kind))?;
            Ok(u64::from_le_bytes(b))
        };
        match kind {
            SMB => Ok(Self::Smb(payload.to_vec())),
            ANNOUNCE => {
                let message_id = id(payload)?;
                let truncated = RecordError::Truncated(kind);
                let (key, end) = match payload.get(8) {
                    Some(0) => (
                        Key::Read(ReadKey::parse(
                            payload.get(9..9 + KEY_LEN).ok_or(truncated)?,
                        )),
                        9 + KEY_LEN,
                    ),
                    Some(1) => {
                        let b = payload.get(9..9 + QUERY_KEY_LEN).ok_or(truncated)?;
                        let query = QueryInfoRequest::parse(&b[12..12 + QueryInfoRequest::LEN])
                            .map_err(|_| truncated)?;
                        let key = Key::Query(QueryKey {
                            session_id: le64(b, 0),
                            tree_id: le32(b, 8),
                            query,
                            credit_charge: le16(b, 12 + QueryInfoRequest::LEN),
                        });
                        (key, 9 + QUERY_KEY_LEN)
                    }
                    _ => return Err(truncated),
                };
                let valid_ms = le32(payload.get(end..end + 4).ok_or(truncated)?, 0);
                Ok(Self::Announce {
                    message_id,
                    key,
                    valid_ms,
                })
            }
            PREFETCHED => Ok(Self::Prefetched {
                message_id: id(payload)?,
                at: id(payload.get(8..).ok_or(RecordError::Truncated(kind))?)?,
                answer: payload[16..].to_vec(),
            }),
            CONSUMED => Ok(Self::Consumed {
                message_id: id(payload)?,
            }),
            WITHDRAWN => Ok(Self::Withdrawn {
                message_id: id(payload)?,
            }),
            DROPPED => Ok(Self::Dropped {
                message_id: id(payload)?,
            }),
            other => Err(RecordError::Type(other)),
        }
    }

    /// Appends the record, framed, to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let (kind, len) = match self {
            Self::Smb(p) => (SMB, p.len()),
            Self::Announce {
                key: Key::Read(_), ..
            } => (ANNOUNCE, 9 + KEY_LEN + 4),
            Self::Announce {
                key: Key::Query(_), ..
            } => (ANNOUNCE, 9 + QUERY_KEY_LEN + 4),
            Self::Prefetched { answer, .. } => (PREFETCHED, 16 + answer.len()),
            Self::Consumed { .. } => (CONSUMED, 8),
            Self::Withdrawn { .. } => (WITHDRAWN, 8),
            Self::Dropped { .. } => (DROPPED, 8),
        };
        if len > MAX_FRAME_LEN {
            return Err(RecordError::TooLong(len));
        }
        out.reserve(FRAME_HEADER_LEN + len);
        out.extend_from_slice(&[kind, (len >> 16) as u8, (len >> 8) as u8, len as u8]);
        match self {
            Self::Smb(p) => out.extend_from_slice(p),
            Self::Announce {
                message_id,
                key,
                valid_ms,
            } => {
                out.extend_from_slice(&message_id.to_le_bytes());
                match key {
                    Key::Read(key) => {
                        out.push(0);
                        key.emit(out);
                    }
                    Key::Query(key) => {
                        out.push(1);
                        out.extend_from_slice(&key.session_id.to_le_bytes());
                        out.extend_from_slice(&key.tree_id.to_le_bytes());
                        let at = out.len();
                        out.resize(at + QueryInfoRequest::LEN, 0);
                        key.query.emit(&mut out[at..]);
                        out.extend_from_slice(&key.credit_charge.to_le_bytes());
                    }
                }
                out.extend_from_slice(&valid_ms.to_le_bytes());
            }
            Self::Prefetched {
                message_id,
                at,
                answer,
            } => {
                out.extend_from_slice(&message_id.to_le_bytes());
                out.extend_from_slice(&at.to_le_bytes());
                out.extend_from_slice(answer);
            }
            Self::Consumed { message_id }
            | Self::Withdrawn { message_id }
            | Self::Dropped { message_id } => {
                out.extend_from_slice(&message_id.to_le_bytes());
            }
        }
        Ok(())
    }
}

impl ReadKey {
    /// The key in the first `KEY_LEN` bytes of `b`; the caller has checked the length.
    fn parse(b: &[u8]) -> Self {
        Self {
            session_id: le64(b, 0),
            tree_id: le32(b, 8),
            file_id: FileId::parse(&b[12..28]),
            offset: le64(b, 28),
            length: le32(b, 36),
            minimum_count: le32(b, 40),
            flags: b[44],
            channel: le32(b, 45),
            remaining_bytes: le32(b, 49),
            credit_charge: le16(b, 53),
        }
    }

    fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.session_id.to_le_bytes());
        out.extend_from_slice(&self.tree_id.to_le_bytes());
        out.extend_from_slice(&self.file_id.persistent.to_le_bytes());
        out.extend_from_slice(&self.file_id.volatile.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        out.extend_from_slice(&self.minimum_count.to_le_bytes());
        out.push(self.flags);
        out.extend_from_slice(&self.channel.to_le_bytes());
        out.extend_from_slice(&self.remaining_bytes.to_le_bytes());
        out.extend_from_slice(&self.credit_charge.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = ReadKey> {
        (
            any::<(u64, u32, u64, u64, u64, u32)>(),
            any::<(u32, u8, u32, u32, u16)>(),
        )
            .prop_map(
                |(
                    (session_id, tree_id, persistent, volatile, offset, length),
                    (minimum_count, flags, channel, remaining_bytes, credit_charge),
                )| ReadKey {
                    session_id,
                    tree_id,
                    file_id: FileId {
                        persistent,
                        volatile,
                    },
                    offset,
                    length,
                    minimum_count,
                    flags,
                    channel,
                    remaining_bytes,
                    credit_charge,
                },
            )
    }

    fn query_key() -> impl Strategy<Value = QueryKey> {
        (
            any::<(u64, u32, u16)>(),
            any::<(u8, u8, u32, u16, u32)>(),
            any::<(u32, u32, u64, u64)>(),
        )
            .prop_map(
                |(
                    (session_id, tree_id, credit_charge),
                    (
                        info_type,
                        file_info_class,
                        output_buffer_length,
                        input_buffer_offset,
                        input_buffer_length,
                    ),
                    (additional_information, flags, persistent, volatile),
                )| QueryKey {
                    session_id,
                    tree_id,
                    query: QueryInfoRequest {
                        info_type,
                        file_info_class,
                        output_buffer_length,
                        input_buffer_offset,
                        input_buffer_length,
                        additional_information,
                        flags,
                        file_id: FileId {
                            persistent,
                            volatile,
                        },
                    },
                    credit_charge,
                },
            )
    }

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..100).prop_map(Record::Smb),
            (any::<u64>(), key(), any::<u32>()).prop_map(|(message_id, key, valid_ms)| {
                Record::Announce {
                    message_id,
                    key: Key::Read(key),
                    valid_ms,
                }
            }),
            (any::<u64>(), query_key(), any::<u32>()).prop_map(|(message_id, key, valid_ms)| {
                Record::Announce {
                    message_id,
                    key: Key::Query(key),
                    valid_ms,
                }
            }),
            (
                any::<u64>(),
                any::<u64>(),
                prop::collection::vec(any::<u8>(), 0..100)
            )
                .prop_map(|(message_id, at, answer)| Record::Prefetched {
                    message_id,
                    at,
                    answer
                }),
            any::<u64>().prop_map(|message_id| Record::Consumed { message_id }),
            any::<u64>().prop_map(|message_id| Record::Withdrawn { message_id }),
            any::<u64>().prop_map(|message_id| Record::Dropped { message_id }),
        ]
    }

    proptest! {
        /// Records written one after another come back the same through a deframer.
        #[test]
        fn records_round_trip(records in prop::collection::vec(record(), 0..10)) {
            let mut stream = Vec::new();
            for r in &records {
                r.emit(&mut stream).unwrap();
            }
            let mut back = Vec::new();
            let mut d = crate::wire::framing::Deframer::typed(usize::MAX);
            d.feed(&stream, |f| back.push(Record::parse(f.kind, f.prefix).unwrap()))
                .unwrap();
            prop_assert_eq!(back, records);
        }

        #[test]
        fn any_payload_parses_or_fails_cleanly(kind in 0u8..8, p in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = Record::parse(kind, &p);
        }
    }
}
