//! Near: the client's gateway. It relays the client's frames to far, except a READ that
//! matches an announced prediction field by field (but for a length no longer than the
//! prediction's: a client that asks for just what is left at a file's end): that one it
//! answers with the server's own answer, cut to the length asked (at once if it is in, or
//! as soon as it comes), and tells far it was used.
//! Any other request that uses an announced MessageId ends that prediction (far will see
//! the same id and give the request a fresh one), and a request that may change a file
//! (WRITE, SET_INFO, FLUSH, LOCK, IOCTL, CLOSE) or an oplock break ends them all (their
//! data may be stale), except those the client already asked for and waits on. A CANCEL
//! consumes no id; one for a READ that waits here is not passed on (a cancel is advisory:
//! the READ is answered when its answer comes).
//!
//! Races with far: a READ near passed on because its prediction was not announced yet
//! crosses the announcement on the WAN. Far takes such a READ as its prediction's
//! (`Far::claim`), and near, when the announcement comes, as asked: whichever answer far
//! then sends (PREFETCHED, or the server's answer as SMB) goes to the client, once. A
//! prediction far withdraws (a miss spent its id) that the client waits on here has the
//! client's READ passed on to far after all.

use super::{EngineStats, ReadKey, Record, charge_of, cut, single_read};
use crate::wire::header::{Command, Header, Messages, status};
use std::collections::{BTreeSet, HashMap, VecDeque};

/// A prediction far announced.
#[derive(Debug)]
struct Announced {
    key: ReadKey,
    /// The server's answer, once in.
    answer: Option<Vec<u8>>,
    /// The client asked for it before the answer came.
    asked: Option<Asked>,
}

/// A client READ that waits for its prediction's answer.
#[derive(Debug)]
struct Asked {
    length: u32,
    /// The client's frame, if near kept it; `None` if it went on to far.
    frame: Option<Vec<u8>>,
}

/// The client's half of the engine; see the module documentation.
#[derive(Debug, Default)]
pub struct Near {
    announced: HashMap<u64, Announced>,
    /// Single READs passed on to far and not answered yet, by id: an announcement that
    /// crosses one on the WAN is its own.
    passed: HashMap<u64, ReadKey>,
    /// Crossed READs near answered from PREFETCHED: if far withdraws one, it had not taken
    /// the READ as the prediction's and sends it to the server, whose answer...
    crossed: BTreeSet<u64>,
    /// ...the client must not get a second time.
    drop_answer: BTreeSet<u64>,
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
        let read = single_read(&frame);
        if let Some((message_id, key)) = read
            && let Some(a) = self.announced.get_mut(&message_id)
            && a.key.covers(&key)
        {
            match a.answer.take() {
                Some(answer) => {
                    self.announced.remove(&message_id);
                    self.answer(message_id, answer, key.length);
                }
                None => {
                    a.asked = Some(Asked {
                        length: key.length,
                        frame: Some(frame),
                    });
                }
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
                .is_some_and(|a| a.asked.is_some())
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
                if self.announced.get(&id).is_some_and(|a| a.asked.is_none()) {
                    self.announced.remove(&id);
                }
            }
        }
        let next = self.client_next;
        self.announced
            .retain(|&id, a| a.asked.is_some() || id >= next);
        if let Some((message_id, key)) = read {
            self.passed.insert(message_id, key);
        }
        self.to_far.push_back(Record::Smb(frame));
    }

    /// A record from far.
    pub fn from_far(&mut self, record: Record) {
        match record {
            Record::Smb(frame) => {
                let mut messages = Messages::new(&frame);
                if let (Some((h, _)), None) = (messages.next(), messages.next())
                    && h.is_response()
                    && !(h.status == status::PENDING && h.is_async())
                    && self.drop_answer.remove(&h.message_id)
                {
                    // The second answer to a READ the client has had its answer to.
                    self.passed.remove(&h.message_id);
                    return;
                }
                for (h, _) in Messages::new(&frame) {
                    if h.command == Command::OPLOCK_BREAK {
                        self.drop_unasked();
                    }
                    if h.is_response() && !(h.status == status::PENDING && h.is_async()) {
                        // The final answer to a request near passed on: what waited for it
                        // here is done.
                        self.passed.remove(&h.message_id);
                        self.announced.remove(&h.message_id);
                    }
                }
                self.to_client.push_back(frame);
            }
            Record::Announce { message_id, key } => {
                let asked = match self.passed.remove(&message_id) {
                    // It crossed the client's READ, which far takes as its own.
                    Some(read) if key.covers(&read) => Some(Asked {
                        length: read.length,
                        frame: None,
                    }),
                    // The client used the id otherwise: too late to serve.
                    Some(_) => return,
                    None if message_id < self.client_next => return,
                    None => None,
                };
                self.announced.insert(
                    message_id,
                    Announced {
                        key,
                        answer: None,
                        asked,
                    },
                );
            }
            Record::Prefetched { message_id, answer } => {
                if let Some(a) = self.announced.get_mut(&message_id) {
                    match &a.asked {
                        Some(asked) => {
                            let (length, crossed) = (asked.length, asked.frame.is_none());
                            self.announced.remove(&message_id);
                            self.answer(message_id, answer, length);
                            if crossed {
                                self.crossed.insert(message_id);
                                // Bounded: far withdraws a prediction within a round
                                // trip of its answer, while ids move on.
                                if self.crossed.len() > 4 * super::far::MAX_PREDICTIONS {
                                    self.crossed.pop_first();
                                }
                            }
                        }
                        None => a.answer = Some(answer),
                    }
                }
            }
            Record::Withdrawn { message_id } => {
                if self.crossed.remove(&message_id) {
                    self.drop_answer.insert(message_id);
                }
                if let Some(Announced {
                    asked:
                        Some(Asked {
                            frame: Some(frame), ..
                        }),
                    ..
                }) = self.announced.remove(&message_id)
                {
                    // The client waits here: its READ goes to the server after all.
                    if let Some((id, key)) = single_read(&frame) {
                        self.passed.insert(id, key);
                    }
                    self.to_far.push_back(Record::Smb(frame));
                }
            }
            // Only far is told.
            Record::Consumed { .. } => {}
        }
    }

    /// Whether an SMB frame from far that starts with `header` may go to the client as its
    /// bytes come, the engine having seen all it needs: one response message, not an
    /// oplock break. Its bookkeeping is done here, as [`Self::from_far`] would.
    pub fn passes(&mut self, header: &Header) -> bool {
        if !header.is_response()
            || header.next_command != 0
            || header.command == Command::OPLOCK_BREAK
        {
            return false;
        }
        if self.drop_answer.contains(&header.message_id) {
            // Dropped whole by from_far.
            return false;
        }
        if !(header.status == status::PENDING && header.is_async()) {
            self.passed.remove(&header.message_id);
            self.announced.remove(&header.message_id);
        }
        true
    }

    /// Ends every prediction the client has not asked for yet.
    fn drop_unasked(&mut self) {
        self.announced.retain(|_, a| a.asked.is_some());
    }

    /// Answers the client's READ `message_id` of `length` bytes with `answer`, the answer
    /// to the prediction, cut to `length` bytes of data (what the server gives a READ
    /// shorter than the file's rest).
    fn answer(&mut self, message_id: u64, mut answer: Vec<u8>, length: u32) {
        cut(&mut answer, length);
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

    /// Bytes of client READs held for answers still to come (they go to far if their
    /// predictions are withdrawn).
    pub fn held_requests(&self) -> usize {
        self.announced
            .values()
            .filter_map(|a| a.asked.as_ref()?.frame.as_ref().map(Vec::len))
            .sum()
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
