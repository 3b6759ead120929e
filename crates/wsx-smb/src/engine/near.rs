//! Near: the client's gateway. It relays the client's frames to far, except a READ or a
//! QUERY_INFO that matches an announced prediction field by field (but for a READ's
//! length, which may be shorter than the prediction's: a client that asks for just what is
//! left at a file's end): that one it answers with the server's own answer, a READ's cut to
//! the length asked (at once if it is in, or as soon as it comes), and tells far it was
//! used.
//! Any other request that uses an announced MessageId ends that prediction (far will see
//! the same id and give the request a fresh one), and a request that may change a file
//! (WRITE, SET_INFO, FLUSH, LOCK, IOCTL, CLOSE) or an oplock break ends them all (their
//! data may be stale), except those the client already asked for and waits on; far is
//! told of each (DROPPED: its id is spent). An answer far announced with a validity window
//! is given only within it: near counts from when the answer came, less the time it
//! queued on its way (how much longer it took to cross than the quickest answer of the
//! session, by far's clock in PREFETCHED), and drops it, telling far, once the window is
//! over. A CANCEL
//! consumes no id; one for a request that waits here is not passed on (a cancel is
//! advisory: the request is answered when its answer comes).
//!
//! CLOSE: once far acts on the session (it has announced a prediction), near answers a
//! CLOSE itself when the server's answer cannot be other than success with nothing in it:
//! the file was opened on this connection (near saw its CREATE answered), the client sent
//! nothing that may change it, no request on it is outstanding, and the CLOSE does not ask
//! for the file's attributes. The CLOSE still goes to the server, whose answer near drops
//! but for its credits: near grants what the CLOSE spends, and settles the difference on
//! the next answer the client gets (`owed`), so the client's window never runs ahead of the
//! server's for longer than one answer, and then only if the server granted a CLOSE
//! nothing, which Samba does not.
//!
//! Races with far: a request near passed on because its prediction was not announced yet
//! crosses the announcement on the WAN. Far takes such a request as its prediction's
//! (`Far::claim`), and near, when the announcement comes, as asked: whichever answer far
//! then sends (PREFETCHED, or the server's answer as SMB) goes to the client, once. A
//! prediction far withdraws (a miss spent its id) that the client waits on here has the
//! client's request passed on to far after all.

use super::{Clock, EngineStats, Key, Record, charge_of, single_request};
use crate::wire::header::{Command, HEADER_LEN, Header, Messages, TreeOrAsync, flags, status};
use crate::wire::messages::{CloseRequest, FileId, file_id_of};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Files near keeps track of at most, for answering their CLOSE (past it, a CLOSE goes the
/// whole way).
pub const MAX_OPENS: usize = 4096;
/// `DesiredAccess` bit: the open may delete the file.
const DELETE: u32 = 0x0001_0000;
/// `CreateOptions` bit: the file goes at its last CLOSE.
const FILE_DELETE_ON_CLOSE: u32 = 0x0000_1000;

/// The session of the (first) message in `frame`.
fn key_session(frame: &[u8]) -> u64 {
    Messages::new(frame).next().map_or(0, |(h, _)| h.session_id)
}

/// The tree a message names (0 for an async one, which names none).
fn tree_of(header: &Header) -> u32 {
    match header.tree_or_async {
        TreeOrAsync::Tree { tree_id, .. } => tree_id,
        TreeOrAsync::Async(_) => 0,
    }
}

/// The sooner of two times, either of which may be absent.
fn soonest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        _ => a.or(b),
    }
}

/// A prediction far announced.
#[derive(Debug)]
struct Announced {
    key: Key,
    /// The server's answer, once in.
    answer: Option<Vec<u8>>,
    /// The client asked for it before the answer came.
    asked: Option<Asked>,
    /// How long the answer may be held, ms (0: while the prediction stands).
    valid_ms: u32,
    /// When a held answer stops being good, if `valid_ms` is not 0 (`None`: near had no
    /// clock when it came, and will not give it): its window from when it came, less what
    /// it queued on its way.
    expires: Option<Instant>,
}

impl Announced {
    /// Whether the answer held may still go to the client at `now`.
    fn valid(&self, now: Option<Instant>) -> bool {
        self.valid_ms == 0 || now.zip(self.expires).is_some_and(|(now, end)| now < end)
    }
}

/// A client request that waits for its prediction's answer.
#[derive(Debug)]
struct Asked {
    key: Key,
    /// The client's frame, if near kept it; `None` if it went on to far.
    frame: Option<Vec<u8>>,
}

/// A file the client has open, as near sees it.
#[derive(Debug, Default)]
struct Open {
    tree_id: u32,
    /// Opened with DELETE access or DELETE_ON_CLOSE: its CLOSE may fail (a directory not
    /// empty) and goes the whole way.
    deletes: bool,
    /// Client requests on it not answered yet.
    busy: u32,
    /// The client sent something that may change it (WRITE, SET_INFO, FLUSH, LOCK, IOCTL).
    changed: bool,
}

/// The client's half of the engine; see the module documentation.
#[derive(Debug, Default)]
pub struct Near {
    announced: HashMap<u64, Announced>,
    /// Single requests far may predict, passed on to far and not answered yet, by id: an
    /// announcement that crosses one on the WAN is its own.
    passed: HashMap<u64, Key>,
    /// Crossed requests near answered from PREFETCHED, and their credit charges: if far
    /// withdraws one, it had not taken the request as the prediction's and sends it to
    /// the server, whose answer the client must not get a second time (`dropped`).
    crossed: BTreeMap<u64, u16>,
    /// One past the highest id the client has used: predictions below it that it did not
    /// ask for are dead.
    client_next: u64,
    /// Files the client opened (their CREATE answered) and has not closed, by session.
    opens: HashMap<(u64, FileId), Open>,
    /// CREATEs sent on, by id: their tree (an async answer names none), and whether the
    /// open may delete the file at its CLOSE.
    creating: HashMap<u64, (u32, bool)>,
    /// Client requests on an open file, passed on and not answered yet, by id.
    on_file: HashMap<u64, (u64, FileId)>,
    /// Requests whose answer from the server the client must not get (near answered them:
    /// a CLOSE, or a crossed request far sent on after all), by id, and what they spent of
    /// the client's credits: only the difference between what the server grants and that
    /// reaches the client (`owed`).
    dropped: HashMap<u64, u16>,
    /// Far has announced a prediction on this connection: it acts on the session (its
    /// gateway's SMB acceleration is on), so near may answer CLOSEs.
    far_acts: bool,
    /// Credits the server granted that the client has not been given (near granted fewer
    /// in a CLOSE it answered), or, below zero, that near granted and the server did not:
    /// settled on the next answer the client gets.
    owed: i64,
    /// The time, as the gateway says ([`Near::set_now`]).
    clock: Clock,
    /// The least, over the PREFETCHED records so far, of near's clock when one came less
    /// far's when it left (ms): the crossing with no queue, plus the clocks' offset.
    base: Option<i128>,
    /// The soonest a held answer's window ends.
    next_expiry: Option<Instant>,
    to_client: VecDeque<Vec<u8>>,
    to_far: VecDeque<Record>,
    stats: EngineStats,
}

impl Near {
    pub fn new() -> Self {
        Self::default()
    }

    /// The time now: answers held with a validity window ([`Record::Announce`]) are given
    /// only before it ends, and never if near has not been told the time. Those whose
    /// window has ended are dropped, far told.
    pub fn set_now(&mut self, now: Instant) {
        self.clock.set(now);
        if self.next_expiry.is_some_and(|end| end <= now) {
            self.expire();
        }
    }

    /// When the next held answer's window ends, if one is held with a window: the gateway
    /// calls [`Self::set_now`] then, so that a session no one reads from gives back what
    /// it holds.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.next_expiry
    }

    /// Drops the held answers whose window has ended, telling far.
    fn expire(&mut self) {
        let now = self.clock.now;
        let mut ended = Vec::new();
        self.next_expiry = None;
        for (&id, a) in &self.announced {
            if a.answer.is_some() && !a.valid(now) {
                ended.push(id);
            } else if a.answer.is_some() && a.valid_ms != 0 {
                self.next_expiry = soonest(self.next_expiry, a.expires);
            }
        }
        for message_id in ended {
            self.end_expired(message_id);
        }
    }

    /// Ends the prediction `message_id`, its answer past its window: far is told (its id
    /// is spent at the server).
    fn end_expired(&mut self, message_id: u64) {
        self.announced.remove(&message_id);
        self.stats.expired += 1;
        self.to_far.push_back(Record::Dropped { message_id });
    }

    /// How long an answer far stamped `at` (its clock) queued on its way, ms: how much
    /// longer it took to cross than the quickest answer of the session.
    fn queued_ms(&mut self, at: u64) -> u64 {
        let (Some(here), false) = (self.clock.ms(), at == super::link::NO_CLOCK) else {
            return 0;
        };
        let crossing = i128::from(here) - i128::from(at);
        let base = self.base.map_or(crossing, |base| base.min(crossing));
        self.base = Some(base);
        u64::try_from(crossing - base).unwrap_or(u64::MAX)
    }

    /// A frame's payload from the client.
    pub fn from_client(&mut self, frame: Vec<u8>) {
        let single = single_request(&frame);
        if let Some((message_id, key)) = single
            && let Some(a) = self.announced.get(&message_id)
            && a.key.covers(&key)
            && a.answer.is_some()
            && !a.valid(self.clock.now)
        {
            // Held too long: the client's request goes to the server, which far is told
            // first (the prediction spent its id there).
            self.end_expired(message_id);
        }
        if let Some((message_id, key)) = single
            && let Some(a) = self.announced.get_mut(&message_id)
            && a.key.covers(&key)
        {
            match a.answer.take() {
                Some(answer) => {
                    self.announced.remove(&message_id);
                    self.answer(message_id, answer, &key);
                }
                None => {
                    a.asked = Some(Asked {
                        key,
                        frame: Some(frame),
                    });
                }
            }
            return;
        }
        let mut messages = Messages::new(&frame);
        let first = messages.next();
        let alone = messages.next().is_none();
        if let Some((header, _)) = first
            && alone
            && header.command == Command::CANCEL
            && self
                .announced
                .get(&header.message_id)
                .is_some_and(|a| a.asked.is_some())
        {
            return;
        }
        for (header, message) in Messages::new(&frame) {
            if header.is_response() || header.command == Command::CANCEL {
                continue;
            }
            if let Some(open_key) = self.note(&header, &message[HEADER_LEN..]) {
                // A CLOSE: the handle is the client's no more, whoever answers.
                let here = alone && self.close_here(&header, &frame);
                self.opens.remove(&open_key);
                if here {
                    self.to_far.push_back(Record::Smb(frame));
                    return;
                }
            }
        }
        self.drop_passed();
        if let Some((message_id, key)) = single {
            self.passed.insert(message_id, key);
        }
        self.to_far.push_back(Record::Smb(frame));
    }

    /// What near notes of a client request it passes on (not a CANCEL; `body` may be only
    /// the start of the body, enough to name a file): the ids it takes, the predictions it
    /// makes moot, the handles it opens or closes with their tree or session, and whether
    /// it may change an open file. A CLOSE of a handle near knows: that handle, which the
    /// caller forgets once it has judged the CLOSE.
    fn note(&mut self, header: &Header, body: &[u8]) -> Option<(u64, FileId)> {
        self.client_next = self.client_next.max(
            header
                .message_id
                .saturating_add(charge_of(header.credit_charge)),
        );
        let changes = matches!(
            header.command,
            Command::WRITE | Command::SET_INFO | Command::FLUSH | Command::LOCK | Command::IOCTL
        );
        if changes || header.command == Command::CLOSE {
            self.drop_unasked();
        }
        let first = header.message_id;
        for id in first..first.saturating_add(charge_of(header.credit_charge).min(256)) {
            if self.announced.get(&id).is_some_and(|a| a.asked.is_none()) {
                self.announced.remove(&id);
            }
        }
        match header.command {
            Command::CREATE if self.creating.len() < MAX_OPENS => {
                // DesiredAccess (4 at 24), CreateOptions (4 at 40).
                let le32 = |at: usize| body.get(at..at + 4).map_or(0, |b| crate::wire::le32(b, 0));
                let deletes = le32(24) & DELETE != 0 || le32(40) & FILE_DELETE_ON_CLOSE != 0;
                self.creating
                    .insert(header.message_id, (tree_of(header), deletes));
            }
            // Handles the session or the tree had are closed with it.
            Command::LOGOFF => self.opens.retain(|(s, _), _| *s != header.session_id),
            Command::TREE_DISCONNECT => {
                let tree = tree_of(header);
                self.opens
                    .retain(|(s, _), o| *s != header.session_id || o.tree_id != tree);
            }
            _ => {}
        }
        let open_key = file_id_of(header.command, body)
            .map(|id| (header.session_id, id))
            .filter(|k| self.opens.contains_key(k))?;
        if header.command == Command::CLOSE {
            return Some(open_key);
        }
        if let Some(open) = self.opens.get_mut(&open_key) {
            open.changed |= changes;
            open.busy += 1;
            self.on_file.insert(header.message_id, open_key);
        }
        None
    }

    /// Whether a client frame that starts with `start` (its first SMB header and at least
    /// the first 32 bytes of its body) may go to far as its bytes come, unchanged: one
    /// WRITE request (large, and nothing near answers). Near notes it here as
    /// [`Self::from_client`] would.
    pub fn passes_request(&mut self, start: &[u8]) -> bool {
        let Ok(header) = Header::parse(start) else {
            return false;
        };
        if header.is_response() || header.next_command != 0 || header.command != Command::WRITE {
            return false;
        }
        self.note(&header, &start[HEADER_LEN..]);
        self.drop_passed();
        true
    }

    /// Answers the client's CLOSE (`header`, the whole of `frame`) here if far acts on the
    /// session and that is safe: the file was opened in this connection, nothing the client sent may have changed it, no
    /// request on it is outstanding, and the client did not ask for its attributes. The
    /// server then answers a CLOSE of an open handle with success and nothing more, which
    /// is what near gives. The CLOSE still goes to the server.
    fn close_here(&mut self, header: &Header, frame: &[u8]) -> bool {
        let Some(close) = frame
            .get(HEADER_LEN..)
            .and_then(|b| CloseRequest::parse(b).ok())
        else {
            return false;
        };
        let Some(open) = self.opens.get(&(header.session_id, close.file_id)) else {
            return false;
        };
        // A request on the file that waits here for its prediction's answer is busy too.
        let waiting = self
            .announced
            .values()
            .any(|a| a.asked.is_some() && a.key.file_id() == close.file_id);
        if !self.far_acts
            || open.busy != 0
            || waiting
            || open.changed
            || open.deletes
            || close.flags & CloseRequest::POSTQUERY_ATTRIB != 0
            || header.is_async()
            || header.flags & flags::SIGNED != 0
            || self.dropped.len() >= MAX_OPENS
        {
            return false;
        }
        // The credits the CLOSE spends: the client's window stays as it was until the
        // server's own answer settles what it granted (`owed`).
        let granted = u16::try_from(charge_of(header.credit_charge)).unwrap_or(u16::MAX);
        let answer = Header {
            status: status::SUCCESS,
            flags: flags::SERVER_TO_REDIR,
            credits: granted,
            next_command: 0,
            signature: [0; 16],
            ..*header
        };
        let mut message = vec![0; HEADER_LEN];
        if answer.emit(&mut message).is_none() {
            return false;
        }
        message.extend_from_slice(&CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES);
        self.dropped.insert(header.message_id, granted);
        self.stats.answered_locally += 1;
        self.give(message);
        true
    }

    /// A record from far.
    pub fn from_far(&mut self, record: Record) {
        match record {
            Record::Smb(frame) => {
                let mut messages = Messages::new(&frame);
                if let (Some((h, _)), None) = (messages.next(), messages.next())
                    && h.is_response()
                {
                    let interim = h.status == status::PENDING && h.is_async();
                    if let Some(&spent) = self.dropped.get(&h.message_id) {
                        // The server's answer to a request near answered: only its credits
                        // reach the client, less what the request spent (which near's
                        // answer gave back).
                        self.owed += i64::from(h.credits);
                        if !interim {
                            self.owed -= i64::from(spent);
                            self.dropped.remove(&h.message_id);
                            self.passed.remove(&h.message_id);
                            self.finished(h.message_id);
                        }
                        return;
                    }
                }
                let closes = Messages::new(&frame)
                    .any(|(h, _)| h.is_response() && h.command == Command::CLOSE);
                for (h, message) in Messages::new(&frame) {
                    if h.command == Command::OPLOCK_BREAK {
                        self.drop_unasked();
                    }
                    if h.is_response() && !(h.status == status::PENDING && h.is_async()) {
                        // The final answer to a request near passed on: what waited for it
                        // here is done.
                        self.passed.remove(&h.message_id);
                        self.announced.remove(&h.message_id);
                        self.finished(h.message_id);
                        let deletes = self.creating.remove(&h.message_id);
                        if h.command == Command::CREATE && h.status == status::SUCCESS && !closes {
                            // FileId (16 at 64 of the body). A compound that closes what
                            // it creates leaves nothing open.
                            if let Some(id) = message.get(HEADER_LEN + 64..HEADER_LEN + 80)
                                && let Some((tree_id, deletes)) = deletes
                                && self.opens.len() < MAX_OPENS
                            {
                                self.opens.insert(
                                    (h.session_id, FileId::parse(id)),
                                    Open {
                                        tree_id,
                                        deletes,
                                        ..Open::default()
                                    },
                                );
                            }
                        }
                    }
                }
                self.give(frame);
            }
            Record::Announce {
                message_id,
                key,
                valid_ms,
            } => {
                self.far_acts = true;
                let asked = match self.passed.remove(&message_id) {
                    // It crossed the client's request, which far takes as its own.
                    Some(asked) if key.covers(&asked) => Some(Asked {
                        key: asked,
                        frame: None,
                    }),
                    // The client used the id otherwise: too late to serve.
                    Some(_) => return,
                    None if message_id < self.client_next => {
                        // Far will see the client's request on that id, or, if the client
                        // went past it, must not take one that comes later as its own.
                        self.to_far.push_back(Record::Dropped { message_id });
                        return;
                    }
                    None => None,
                };
                self.announced.insert(
                    message_id,
                    Announced {
                        key,
                        answer: None,
                        asked,
                        valid_ms,
                        expires: None,
                    },
                );
            }
            Record::Prefetched {
                message_id,
                at,
                answer,
            } => {
                let queued = self.queued_ms(at);
                if let Some(a) = self.announced.get_mut(&message_id) {
                    match a.asked.take() {
                        Some(Asked {
                            frame: Some(frame), ..
                        }) if a.valid_ms != 0 && queued >= u64::from(a.valid_ms) => {
                            // It queued past its window on its way: the waiting request
                            // goes to the server after all, far told first.
                            self.end_expired(message_id);
                            self.pass_held(frame);
                        }
                        Some(asked) => {
                            let crossed = asked.frame.is_none();
                            self.announced.remove(&message_id);
                            self.answer(message_id, answer, &asked.key);
                            if crossed {
                                let charge = u16::try_from(asked.key.charge()).unwrap_or(u16::MAX);
                                self.crossed.insert(message_id, charge);
                                // Bounded: far withdraws a prediction within a round
                                // trip of its answer, while ids move on.
                                if self.crossed.len() > 4 * super::far::MAX_PREDICTIONS {
                                    self.crossed.pop_first();
                                }
                            }
                        }
                        None => {
                            a.answer = Some(answer);
                            if a.valid_ms != 0 {
                                let left = u64::from(a.valid_ms).saturating_sub(queued);
                                a.expires =
                                    self.clock.now.map(|now| now + Duration::from_millis(left));
                                self.next_expiry = soonest(self.next_expiry, a.expires);
                            }
                        }
                    }
                }
            }
            Record::Withdrawn { message_id } => {
                if let Some(charge) = self.crossed.remove(&message_id) {
                    self.dropped.insert(message_id, charge);
                }
                if let Some(Announced {
                    asked:
                        Some(Asked {
                            frame: Some(frame), ..
                        }),
                    ..
                }) = self.announced.remove(&message_id)
                {
                    self.pass_held(frame);
                }
            }
            // Only far is told these.
            Record::Consumed { .. } | Record::Dropped { .. } => {}
        }
    }

    /// Whether an SMB frame from far that starts with `header` may go to the client as its
    /// bytes come, the engine having seen all it needs: one response message, not an
    /// oplock break, not a CREATE's (near reads its body), not one whose header near
    /// changes. Its bookkeeping is done here, as [`Self::from_far`] would.
    pub fn passes(&mut self, header: &Header) -> bool {
        if !header.is_response()
            || header.next_command != 0
            || matches!(header.command, Command::OPLOCK_BREAK | Command::CREATE)
            || self.owed != 0
            // Dropped whole by from_far.
            || self.dropped.contains_key(&header.message_id)
        {
            return false;
        }
        if !(header.status == status::PENDING && header.is_async()) {
            self.passed.remove(&header.message_id);
            self.announced.remove(&header.message_id);
            self.finished(header.message_id);
        }
        true
    }

    /// A client request that waited here for its prediction's answer goes to the server
    /// after all, and is outstanding on its file until answered.
    fn pass_held(&mut self, frame: Vec<u8>) {
        if let Some((id, key)) = single_request(&frame) {
            self.passed.insert(id, key);
            let open = (key_session(&frame), key.file_id());
            if let Some(o) = self.opens.get_mut(&open) {
                o.busy += 1;
                self.on_file.insert(id, open);
            }
        }
        self.to_far.push_back(Record::Smb(frame));
    }

    /// The final answer to the client's request `id` came.
    fn finished(&mut self, id: u64) {
        if let Some(key) = self.on_file.remove(&id)
            && let Some(open) = self.opens.get_mut(&key)
        {
            open.busy = open.busy.saturating_sub(1);
        }
    }

    /// Ends every prediction the client has not asked for yet, telling far: a client
    /// request with one's id is not the prediction's.
    fn drop_unasked(&mut self) {
        self.drop_where(|_| true);
    }

    /// Ends the predictions the client went past without asking (ids below the highest it
    /// has used), telling far.
    fn drop_passed(&mut self) {
        let next = self.client_next;
        self.drop_where(|id| id < next);
    }

    /// Ends the unasked predictions whose id `ends`, telling far of each (DROPPED).
    fn drop_where(&mut self, ends: impl Fn(u64) -> bool) {
        let to_far = &mut self.to_far;
        self.announced.retain(|&message_id, a| {
            let end = a.asked.is_none() && ends(message_id);
            if end {
                to_far.push_back(Record::Dropped { message_id });
            }
            !end
        });
    }

    /// Answers the client's request `message_id`, which asked `asked`, with `answer`, the
    /// answer to the prediction (a READ's data cut to the length asked: what the server
    /// gives a READ shorter than the file's rest).
    fn answer(&mut self, message_id: u64, mut answer: Vec<u8>, asked: &Key) {
        asked.cut_for(&mut answer);
        self.stats.answered_locally += 1;
        // A crossed request went on to far (and counts as outstanding on its file): far
        // takes it as the prediction's and sends no other answer.
        self.finished(message_id);
        self.give(answer);
        self.to_far.push_back(Record::Consumed { message_id });
    }

    /// Hands the client `frame`, first settling what near owes it in credits (or it owes)
    /// on the frame's first response.
    /// Not on a signed answer (the credits are signed) or an oplock break (not an answer to
    /// a request, whose credits a client may not count): the next one settles.
    fn give(&mut self, mut frame: Vec<u8>) {
        if self.owed != 0
            && let Some((h, _)) = Messages::new(&frame).next()
            && h.is_response()
            && h.flags & flags::SIGNED == 0
            && h.message_id != u64::MAX
        {
            let credits = (i64::from(h.credits) + self.owed).clamp(0, i64::from(u16::MAX));
            self.owed -= credits - i64::from(h.credits);
            // CreditResponse: 2 bytes at 14 of the header.
            frame[14..16].copy_from_slice(&(credits as u16).to_le_bytes());
        }
        self.to_client.push_back(frame);
    }

    /// The next frame payload for the client.
    pub fn poll_to_client(&mut self) -> Option<Vec<u8>> {
        self.to_client.pop_front()
    }

    /// The next record for far.
    pub fn poll_to_far(&mut self) -> Option<Record> {
        self.to_far.pop_front()
    }

    /// Bytes of client requests held for answers still to come (they go to far if their
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
