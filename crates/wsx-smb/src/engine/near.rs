//! Near: the client's gateway. It relays the client's frames to far, except a READ that
//! matches an announced prediction field by field: that one it answers with the server's
//! own answer (at once if it is in, or as soon as it comes) and tells far it was used.
//! Any other request that uses an announced MessageId ends that prediction (far will see
//! the same id and give the request a fresh one), and a request that may change a file
//! (WRITE, SET_INFO, FLUSH, LOCK, IOCTL, CLOSE) or an oplock break ends them all (their
//! data may be stale), except those the client already asked for and waits on. A CANCEL
//! consumes no id; one for a READ that waits here is not passed on (a cancel is advisory:
//! the READ is answered when its answer comes).

use super::{EngineStats, ReadKey, Record, charge_of};
use crate::wire::header::{Command, Messages};
use crate::wire::messages::ReadRequest;
use std::collections::{HashMap, VecDeque};

/// A prediction far announced.
#[derive(Debug)]
struct Announced {
    key: ReadKey,
    /// The server's answer, once in.
    answer: Option<Vec<u8>>,
    /// The client asked for it before the answer came.
    asked: bool,
}

/// The client's half of the engine; see the module documentation.
#[derive(Debug, Default)]
pub struct Near {
    announced: HashMap<u64, Announced>,
    /// One past the highest id the client has used: predictions below it that it did not
    /// ask for are dead.
    client_next: u64,
    to_client: VecDeque<Vec<u8>>,
    to_far: VecDeque<Record>,
    stats: EngineStats,
}

impl Near {
    pub fn new() -> Self {
        Self::default()
    }

    /// A frame's payload from the client.
    pub fn from_client(&mut self, frame: Vec<u8>) {
        if let Some((message_id, key)) = single_read(&frame)
            && let Some(a) = self.announced.get_mut(&message_id)
            && a.key == key
        {
            match a.answer.take() {
                Some(answer) => {
                    self.announced.remove(&message_id);
                    self.answer(message_id, answer);
                }
                None => a.asked = true,
            }
            return;
        }
        let mut messages = Messages::new(&frame);
        if let Some((header, _)) = messages.next()
            && messages.next().is_none()
            && header.command == Command::CANCEL
            && self
                .announced
                .get(&header.message_id)
                .is_some_and(|a| a.asked)
        {
            return;
        }
        for (header, _) in Messages::new(&frame) {
            if header.is_response() || header.command == Command::CANCEL {
                continue;
            }
            self.client_next = self.client_next.max(
                header
                    .message_id
                    .saturating_add(charge_of(header.credit_charge)),
            );
            if matches!(
                header.command,
                Command::WRITE
                    | Command::SET_INFO
                    | Command::FLUSH
                    | Command::LOCK
                    | Command::IOCTL
                    | Command::CLOSE
            ) {
                self.drop_unasked();
            }
            let first = header.message_id;
            for id in first..first.saturating_add(charge_of(header.credit_charge).min(256)) {
                if self.announced.get(&id).is_some_and(|a| !a.asked) {
                    self.announced.remove(&id);
                }
            }
        }
        let next = self.client_next;
        self.announced.retain(|&id, a| a.asked || id >= next);
        self.to_far.push_back(Record::Smb(frame));
    }

    /// A record from far.
    pub fn from_far(&mut self, record: Record) {
        match record {
            Record::Smb(frame) => {
                if Messages::new(&frame).any(|(h, _)| h.command == Command::OPLOCK_BREAK) {
                    self.drop_unasked();
                }
                self.to_client.push_back(frame);
            }
            // An announcement for an id the client has passed comes too late to serve.
            Record::Announce { message_id, .. } if message_id < self.client_next => {}
            Record::Announce { message_id, key } => {
                self.announced.insert(
                    message_id,
                    Announced {
                        key,
                        answer: None,
                        asked: false,
                    },
                );
            }
            Record::Prefetched { message_id, answer } => {
                if let Some(a) = self.announced.get_mut(&message_id) {
                    if a.asked {
                        self.announced.remove(&message_id);
                        self.answer(message_id, answer);
                    } else {
                        a.answer = Some(answer);
                    }
                }
            }
            // Only far is told.
            Record::Consumed { .. } => {}
        }
    }

    /// Ends every prediction the client has not asked for yet.
    fn drop_unasked(&mut self) {
        self.announced.retain(|_, a| a.asked);
    }

    fn answer(&mut self, message_id: u64, answer: Vec<u8>) {
        self.stats.answered_locally += 1;
        self.to_client.push_back(answer);
        self.to_far.push_back(Record::Consumed { message_id });
    }

    /// The next frame payload for the client.
    pub fn poll_to_client(&mut self) -> Option<Vec<u8>> {
        self.to_client.pop_front()
    }

    /// The next record for far.
    pub fn poll_to_far(&mut self) -> Option<Record> {
        self.to_far.pop_front()
    }

    /// Bytes of answers held for the client.
    pub fn held_bytes(&self) -> usize {
        self.announced
            .values()
            .filter_map(|a| a.answer.as_ref().map(Vec::len))
            .sum()
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }
}

/// The MessageId and key of a frame that is one READ request and nothing else.
fn single_read(frame: &[u8]) -> Option<(u64, ReadKey)> {
    let mut messages = Messages::new(frame);
    let (header, message) = messages.next()?;
    if messages.next().is_some()
        || header.next_command != 0
        || header.is_response()
        || header.command != Command::READ
    {
        return None;
    }
    let read = ReadRequest::parse(&message[crate::wire::header::HEADER_LEN..]).ok()?;
    Some((header.message_id, ReadKey::of(&header, &read)))
}
