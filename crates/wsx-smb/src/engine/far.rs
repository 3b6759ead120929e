//! Far: the server's gateway. It relays the client's frames to the server and the server's
//! to near, and for an unsigned session acts ahead of the client: it issues the requests
//! the client will send next with the MessageIds the client will use, inside the server's
//! credit window, and ships each answer to near after announcing it. Two kinds:
//!
//! - **Read-ahead.** A client reading a file: the READs that follow (the last READ's id
//!   plus its credit charge, and so on), each of the client's block, or of the file's rest
//!   at its end if the client asks only that; after a miss, only once the client reads on
//!   by itself (it asks for the block right after its last READ of a file, or takes one
//!   far predicted beyond a file's first), so that a client that reads the start of each
//!   file and closes it costs one miss, not one a file.
//! - **Open-ahead.** A file just opened (its CREATE answered): what the client did after
//!   opening the last file it opened (its QUERY_INFOs, then its first READ and those that
//!   followed it in a row, at most [`MAX_SCRIPT_READS`]; a `Script` learnt from the
//!   requests that reached far and the answers near gave), with the ids that follow the
//!   CREATE's, played only if the client has sent nothing since its CREATE and nothing
//!   else is predicted. Beyond that, read-ahead goes on once the client has taken the
//!   first READ (after a miss, a later one).
//!   A miss forgets the script; far learns it again from the next file opened.
//!
//! - **Ids.** While predictions hold, the server sees exactly the client's ids. A client
//!   request whose id a prediction already used (the client sent something else) is a
//!   miss: every outstanding prediction is dropped (their ids are spent at the server) and
//!   from then on every request far sends, the client's or a prediction, gets the next
//!   server id (`top`, `fresh`), its answers given the client's id back. Ids are handed
//!   out as requests are sent, so none is used twice and none is skipped (a client id
//!   that never reaches far, its request answered by near, takes no server id; the server
//!   cannot slide its window past an id never used). A signed message sent with a fresh
//!   id fails its signature: only a session judged unsigned is read ahead, but one that
//!   starts signing after a miss (a second, signed logon on the same connection) breaks.
//!   Until a miss, no id is changed and signed messages pass intact. A prediction near
//!   drops unused (DROPPED: its answer outlived its window, an oplock break or a request
//!   that may change a file made it moot, or the client went past its id) is a miss too:
//!   its id is spent at the server.
//! - **Credits.** `window_end` is one past the last id the server has granted (1 + every
//!   CreditResponse). A prediction or a fresh id must fit below it; a client frame that
//!   needs a fresh id that does not fit waits for the server's next grant.
//! - **What is read ahead.** A file opened with a share mode that excludes writers, with
//!   a Level II, exclusive or batch oplock, or with a lease that caches reads (its end of
//!   file from the CREATE answer), or,
//!   with a validity window ([`Far::set_validity`]), one others may write: near then gives
//!   its answers only within the window (each ANNOUNCE says how long), and far keeps
//!   ahead of the client what it takes in half the window at the rate near last reported
//!   it taking answers (CONSUMED, over a quarter of the window, at most twice the rate
//!   before), and at least a kibibyte per millisecond of the window (the
//!   floor, again after a miss or a window in which the client took nothing): what it
//!   reads ahead does not queue on its way for longer than half the window while the
//!   session's share of the path carries what the client took (in the client's bytes:
//!   data that compresses less than what was measured queues longer), nor longer than the
//!   window at the floor on paths of 8 Mbit/s or more; past that, answers expire at near,
//!   a miss, and far measures again from the floor. One file at a time, while the READs
//!   predicted and not consumed stay within `window` bytes ([`Far::set_window`]), never
//!   past its end. WRITE, SET_INFO, FLUSH, LOCK, IOCTL or CLOSE from the client, an oplock
//!   or lease break from the server, or a READ that is not the predicted one stops it; a
//!   miss stops it too, until the client, reading one READ at a time, asks two blocks in a
//!   row itself (read-ahead then resumes from there, with fresh ids; at most
//!   [`MAX_RESUMES`] times a file). The same files are
//!   opened ahead (a directory gets its QUERY_INFOs, no READ).
//! - **Memory.** Predictions are bounded by the window and [`MAX_PREDICTIONS`]; a file is
//!   forgotten at its CLOSE; a script holds at most [`MAX_SCRIPT_QUERIES`] queries; requests waiting for credits are bounded by the client's own
//!   window (it cannot send more than it was granted).
//! - **Answers.** An interim answer (STATUS_PENDING) to a prediction is kept back and its
//!   credits added to the final one, which is made synchronous (the client never saw the
//!   interim): what near hands the client is what the server would have sent it.

use super::link::NO_CLOCK;
use super::{Clock, EngineStats, Key, Record, charge_of, single_request};
use crate::observe::{Direction, Observer, Verdict};
use crate::wire::framing::{FRAME_HEADER_LEN, MAX_FRAME_LEN, frame_header};
use crate::wire::header::{Command, HEADER_LEN, Header, Messages, TreeOrAsync, flags, status};
use crate::wire::le32;
use crate::wire::messages::{
    CreateResponse, FileId, NegotiateResponse, QueryInfoRequest, ReadRequest, file_id_of,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// `ShareAccess` bit: other opens may write.
const FILE_SHARE_WRITE: u32 = 0x2;
/// `FileAttributes` bit: a directory, which has no data to READ.
const FILE_ATTRIBUTE_DIRECTORY: u32 = 0x10;
/// Predictions outstanding at most per session, whatever the window.
pub const MAX_PREDICTIONS: usize = 1024;
/// Times a file's read-ahead resumes after a miss at most: a client that reads at
/// random, now and then two blocks in a row, would otherwise have a window read ahead for
/// nothing at each.
pub const MAX_RESUMES: u8 = 3;
/// Open files far keeps track of at most per session (past it, a file opened is not read
/// ahead).
pub const MAX_FILES: usize = 1024;

/// Far measures the rate the client takes its answers at over intervals of this part of
/// the validity window.
const UPTAKE_INTERVALS: u32 = 4;

/// The rate at which what far keeps ahead of a reader is its floor, a kibibyte per
/// millisecond of the window (bytes a second: that rate for half the window).
const FLOOR_RATE: u64 = 2 * 1024 * 1000;

/// The rate the client takes the answers far read ahead at: the READ bytes near reports
/// consumed, by far's clock, over the last whole interval, at most twice the rate before
/// it (or the floor's): a client that takes at once answers near had been holding reads
/// faster than the path brought them, and the amount ahead grows at most twofold an
/// interval, so that a rate too high shows in a few answers (dropped, a miss) rather than
/// in a window's worth.
#[derive(Debug, Default)]
struct Uptake {
    /// Far's clock (ms) when the current interval began: the first report after the
    /// last interval ended.
    since: Option<u64>,
    /// Bytes reported since.
    bytes: u64,
    /// Bytes per second over the last interval (0 before one).
    rate: u64,
}

impl Uptake {
    /// Near reports `bytes` consumed; far's clock reads `now` (`None`: far has none, and
    /// nothing is measured). An interval ends at the first report `interval` ms or more
    /// after it began: one across a pause of the client's is long and gives a low rate.
    fn consumed(&mut self, now: Option<u64>, bytes: u64, interval: u64) {
        let Some(now) = now else {
            return;
        };
        let Some(since) = self.since else {
            self.since = Some(now);
            return;
        };
        self.bytes = self.bytes.saturating_add(bytes);
        let elapsed = now.saturating_sub(since);
        if elapsed >= interval {
            let measured = self.bytes.saturating_mul(1000) / elapsed;
            self.rate = measured.min(2 * self.rate.max(FLOOR_RATE));
            self.since = Some(now);
            self.bytes = 0;
        }
    }

    /// The rate at `now`, if an interval ended within `stale` ms of it: a client that has
    /// taken nothing for that long (paused, or done with a file) starts from the floor.
    fn rate(&self, now: Option<u64>, stale: u64) -> u64 {
        match (now, self.since) {
            (Some(now), Some(since)) if now.saturating_sub(since) <= stale => self.rate,
            _ => 0,
        }
    }
}

/// What a request sent to the server was.
#[derive(Debug)]
enum Pending {
    /// The client's, with the id the client gave it.
    Client { client_id: u64, command: Command },
    /// A prediction for the client's id `client_id`; credits of its interim answers; the
    /// length the client's own READ asked, if it crossed the announcement (its answer then
    /// goes to near as the server's answer to that READ, cut to it).
    Prediction {
        client_id: u64,
        interim_credits: u16,
        claimed: Option<Claimed>,
    },
}

/// A prediction a client request crossed: the prediction, and what the request asked.
#[derive(Debug, Clone, Copy)]
struct Claimed {
    key: Key,
    asked: Key,
}

/// What a client did with the files it opened, after each CREATE: the QUERY_INFOs it sent
/// before reading, its first READ (at offset 0), if it read, and how far it then read that
/// file in a row. Far learns it from the last file it saw opened without predictions and
/// plays it for the next one. A first READ that took the whole file may have asked for less
/// than the client's block (it asked for the file's size): far then plays a READ of the
/// charge it had, as long as that allows.
#[derive(Debug, Clone, Default)]
struct Script {
    queries: Vec<(Header, QueryInfoRequest)>,
    read: Option<(Header, ReadRequest)>,
    /// The bytes from the file's start the client read in a row (its first READ and those
    /// that followed it, none longer than the first), at most [`MAX_SCRIPT_READS`] blocks:
    /// how far far reads the next file ahead before the client has taken anything of it.
    read_to: u64,
    /// The file it is learnt from is still open: its READs extend `read_to` (a later file
    /// the server gives the same id must not).
    reading: bool,
}

impl Script {
    /// The client read `offset..offset + length` of the file this script was learnt from
    /// (near's answer or the server's): one more READ in a row extends it.
    fn read_on(&mut self, file_id: FileId, offset: u64, length: u32) {
        let Some((_, first)) = self.read else {
            return;
        };
        let reach = u64::from(first.length) * MAX_SCRIPT_READS;
        if self.reading
            && first.file_id == file_id
            && offset == self.read_to
            && length <= first.length
            && offset + u64::from(length) <= reach
        {
            self.read_to += u64::from(length);
        }
    }
}

/// READs of the client's block a script plays at most before the client has taken the
/// first: a client that reads less of the next file costs the server no more.
pub const MAX_SCRIPT_READS: u64 = 16;

/// Bytes a READ may ask per credit it is charged (SMB 2.1 on).
const BYTES_PER_CREDIT: u32 = 65536;

/// Queries a script holds at most.
pub const MAX_SCRIPT_QUERIES: usize = 4;

/// A file whose CREATE was just answered: the ids and the tree of the requests to play.
#[derive(Debug, Clone, Copy)]
struct Opened {
    file_id: FileId,
    /// The client id after the CREATE's.
    next_id: u64,
    session_id: u64,
    tree_id: u32,
    directory: bool,
}

impl Opened {
    /// A script's request `header` as it is for this file: its session and tree.
    fn on_tree(&self, header: Header) -> Header {
        Header {
            session_id: self.session_id,
            tree_or_async: TreeOrAsync::Tree {
                reserved: 0,
                tree_id: self.tree_id,
            },
            ..header
        }
    }
}

/// Whether far reads a file ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ahead {
    /// It may (beyond what a script plays, once `File::confirmed`).
    On,
    /// Stopped by a miss (a prediction's id spent, an answer dropped at near), not by the
    /// file, the server or a request that changes it: read-ahead resumes once the client
    /// reads on sequentially by itself.
    Missed,
    /// Stopped for good.
    Off,
}

/// A file the client opened.
#[derive(Debug)]
struct File {
    /// Where it was opened: its handle goes with the session or the tree.
    session_id: u64,
    tree_id: u32,
    end_of_file: u64,
    /// Read ahead may serve it: its share mode or oplock keeps other writers out, or far
    /// has a validity window ([`Far::set_validity`]).
    eligible: bool,
    /// How long near may hold an answer about it, ms: 0 if other writers are kept out,
    /// the validity window if not.
    valid_ms: u32,
    /// Whether far reads it ahead.
    ahead: Ahead,
    /// Where the client's last READ of it that reached far ended.
    client_end: Option<u64>,
    /// Times read-ahead resumed on it ([`MAX_RESUMES`]).
    resumes: u8,
    /// The READ predictions copy, once the client has read: header and body.
    template: Option<(Header, ReadRequest)>,
    /// The next prediction's offset and id.
    next_offset: u64,
    next_id: u64,
    /// The client's requests on it so far, while far learns a [`Script`] from it.
    learning: Option<Script>,
    /// Far may read it ahead beyond what a script plays: the client's first READ of it, or
    /// its first answer taken, while the client reads files on ([`Far::reads_on`]), or
    /// else its next block asked or a later one taken (a client may read only the start of
    /// a file, and a script's guess of its block may be wrong: a window of wrong READs
    /// costs the server).
    confirmed: bool,
    /// How far a script said the client reads it in a row: read ahead before the client
    /// has taken anything ([`Script::read_to`]; 0 without one).
    scripted_to: u64,
}

/// Far's outstanding predictions by the client id each is for, with the bytes their
/// answers may bring kept as they change (the gateway asks for it on every step).
#[derive(Debug, Default)]
struct Outstanding {
    by_id: BTreeMap<u64, Key>,
    bytes: u64,
}

impl Outstanding {
    fn insert(&mut self, id: u64, key: Key) {
        if let Some(old) = self.by_id.insert(id, key) {
            self.bytes -= u64::from(old.answer_bound());
        }
        self.bytes += u64::from(key.answer_bound());
    }

    fn remove(&mut self, id: &u64) -> Option<Key> {
        let key = self.by_id.remove(id)?;
        self.bytes -= u64::from(key.answer_bound());
        Some(key)
    }

    /// All of them, leaving none.
    fn take(&mut self) -> BTreeMap<u64, Key> {
        self.bytes = 0;
        std::mem::take(&mut self.by_id)
    }

    fn get(&self, id: &u64) -> Option<&Key> {
        self.by_id.get(id)
    }

    fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether a prediction has one of the ids in `ids`.
    fn any_in(&self, ids: std::ops::Range<u64>) -> bool {
        self.by_id.range(ids).next().is_some()
    }

    /// The most bytes their answers may bring.
    fn bytes(&self) -> u64 {
        debug_assert_eq!(
            self.bytes,
            self.by_id
                .values()
                .map(|k| u64::from(k.answer_bound()))
                .sum::<u64>()
        );
        self.bytes
    }
}

/// The server's half of the engine; see the module documentation.
#[derive(Debug)]
pub struct Far {
    observer: Observer,
    window: u64,
    /// How long near may hold an answer about a file other clients may write, ms; 0:
    /// such files are not read ahead.
    validity_ms: u32,
    /// The time, as the gateway says ([`Far::set_now`]): PREFETCHED carries it.
    clock: Clock,
    /// How fast the client takes what far reads ahead.
    uptake: Uptake,
    window_end: u64,
    /// By server id.
    pending: HashMap<u64, Pending>,
    /// Outstanding predictions, by the client id each is for.
    predictions: Outstanding,
    /// Every request (the client's, a prediction) gets the next server id, `top`: set at
    /// the first miss. Until then, server id = client id.
    fresh: bool,
    /// One past the highest server id used.
    top: u64,
    /// One past the highest client id seen.
    client_next: u64,
    /// What the client does after opening a file, if far has learnt it.
    script: Option<Script>,
    /// Whether far reads a file on at the client's first READ of it (or its first answer
    /// taken): until a miss (the client may read only the start of each file, and close
    /// it), and again once the client has asked for the block right after its last READ
    /// of a file, or taken one far predicted beyond a file's first.
    reads_on: bool,
    /// Whether the client asks no more than a file's rest in its last READ.
    clips: bool,
    /// A file just opened, whose script far plays at the next chance.
    opened: Option<Opened>,
    /// CREATE requests sent, by server id: share access and tree.
    creates: HashMap<u64, (u32, u32)>,
    /// The server's MaxReadSize (NEGOTIATE): no READ is predicted longer.
    max_read: u32,
    files: HashMap<FileId, File>,
    active: Option<FileId>,
    blocked: VecDeque<Vec<u8>>,
    /// Read-ahead ended for good ([`Far::pass_through`]): client frames go on untouched.
    through: bool,
    to_server: VecDeque<Vec<u8>>,
    to_near: VecDeque<Record>,
    stats: EngineStats,
}

impl Far {
    /// Far for one session, reading ahead up to `window` bytes beyond the client.
    pub fn new(window: u64) -> Self {
        Self {
            observer: Observer::new(),
            window,
            validity_ms: 0,
            clock: Clock::default(),
            uptake: Uptake::default(),
            window_end: 1,
            pending: HashMap::new(),
            predictions: Outstanding::default(),
            fresh: false,
            top: 0,
            client_next: 0,
            script: None,
            reads_on: true,
            clips: true,
            opened: None,
            creates: HashMap::new(),
            max_read: u32::MAX,
            files: HashMap::new(),
            active: None,
            blocked: VecDeque::new(),
            through: false,
            to_server: VecDeque::new(),
            to_near: VecDeque::new(),
            stats: EngineStats::default(),
        }
    }

    /// A record from near.
    pub fn from_near(&mut self, record: Record) {
        match record {
            Record::Smb(frame) if self.through => self.to_server.push_back(frame),
            Record::Smb(frame) => {
                if self.blocked.is_empty() {
                    self.client_frame(frame);
                } else {
                    self.blocked.push_back(frame);
                }
            }
            Record::Consumed { message_id } => {
                if let Some(key) = self.predictions.remove(&message_id) {
                    self.consumed(&key);
                }
            }
            Record::Dropped { message_id } => {
                // Its id is spent at the server: a miss, a client request with that id
                // given a fresh one. One far no longer has was withdrawn by a miss, or its
                // answer was too long to send, which turned the ids fresh already.
                if let Some(key) = self.predictions.remove(&message_id) {
                    self.stats.missed += 1;
                    self.stats.missed_bytes += u64::from(key.read_length());
                    self.missed();
                } else {
                    self.fresh = true;
                }
            }
            // Only near is told these.
            Record::Announce { .. } | Record::Prefetched { .. } | Record::Withdrawn { .. } => {}
        }
        self.read_ahead();
    }

    /// A frame's payload from the server.
    pub fn from_server(&mut self, mut frame: Vec<u8>) {
        feed(&mut self.observer, Direction::ToClient, &frame);
        // Everything goes on to near but answers to predictions: frames far cannot read
        // (SMB1, encrypted, compressed, malformed) included.
        let mut forward = false;
        let chain = chain(&frame);
        let chain_is_empty = chain.is_empty();
        let closes = chain
            .iter()
            .any(|(h, _, _)| h.is_response() && h.command == Command::CLOSE);
        // The client id after the last of the client's requests this frame answers: a
        // CREATE compounded with what follows (Windows sends CREATE and QUERY_INFO so)
        // is opened ahead from there.
        let mut chain_next = 0;
        for (header, at, len) in chain {
            if !header.is_response() {
                forward = true;
                continue;
            }
            let interim = header.status == status::PENDING && header.is_async();
            self.window_end = self.window_end.saturating_add(u64::from(header.credits));
            match self.pending.get_mut(&header.message_id) {
                Some(Pending::Prediction {
                    client_id,
                    interim_credits,
                    claimed,
                }) => {
                    if interim {
                        *interim_credits = interim_credits.saturating_add(header.credits);
                    } else {
                        let (client_id, extra, claimed) = (*client_id, *interim_credits, *claimed);
                        self.pending.remove(&header.message_id);
                        let message = &frame[at..at + len];
                        self.prediction_answered(client_id, &header, message, extra, claimed);
                    }
                }
                Some(Pending::Client { client_id, command }) => {
                    let (client_id, command) = (*client_id, *command);
                    if !interim {
                        self.pending.remove(&header.message_id);
                    }
                    chain_next =
                        chain_next.max(client_id.saturating_add(charge_of(header.credit_charge)));
                    if client_id != header.message_id {
                        frame[at + 24..at + 32].copy_from_slice(&client_id.to_le_bytes());
                    }
                    let body = &frame[at + HEADER_LEN..at + len];
                    if command == Command::CREATE && !interim {
                        if header.status == status::SUCCESS && !closes {
                            self.created(&header, client_id, body);
                        } else {
                            // Failed, or closed in the same compound: nothing open.
                            self.creates.remove(&header.message_id);
                        }
                    }
                    if command == Command::NEGOTIATE
                        && header.status == status::SUCCESS
                        && let Ok(negotiated) = NegotiateResponse::parse(body)
                    {
                        self.max_read = negotiated.max_read_size;
                    }
                    forward = true;
                }
                None => {
                    if header.command == Command::OPLOCK_BREAK {
                        self.stop_all();
                    }
                    forward = true;
                }
            }
        }
        if let Some(opened) = &mut self.opened {
            opened.next_id = opened.next_id.max(chain_next);
        }
        if forward || chain_is_empty {
            self.to_near.push_back(Record::Smb(frame));
        }
        self.after_server();
    }

    /// After an answer from the server: the credits it brought may let waiting client
    /// frames and predictions go.
    fn after_server(&mut self) {
        while let Some(frame) = self.blocked.pop_front() {
            if let Err(frame) = self.try_client_frame(frame) {
                self.blocked.push_front(frame);
                break;
            }
        }
        self.open_ahead();
        self.read_ahead();
    }

    /// Whether a frame from the server that starts with `start` (its framing header and
    /// its first 64 bytes) may go to near as its bytes come, far changing no more than its
    /// header: one response message to a client request (not to a prediction, not a
    /// CREATE's, whose body far reads), or to one it does not know. Far does here what
    /// [`Self::from_server`] would; the header to send, if so. The rest of the frame is
    /// given to [`Self::observe_server`] as it passes.
    pub fn passes(&mut self, start: &[u8]) -> Option<[u8; HEADER_LEN]> {
        let bytes = start.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + HEADER_LEN)?;
        let header = Header::parse(bytes).ok()?;
        if !header.is_response()
            || header.next_command != 0
            || matches!(header.command, Command::OPLOCK_BREAK | Command::CREATE)
        {
            return None;
        }
        let client_id = match self.pending.get(&header.message_id) {
            Some(Pending::Prediction { .. }) => return None,
            Some(Pending::Client { client_id, .. }) => *client_id,
            None => header.message_id,
        };
        let interim = header.status == status::PENDING && header.is_async();
        if !interim {
            self.pending.remove(&header.message_id);
        }
        self.window_end = self.window_end.saturating_add(u64::from(header.credits));
        self.observer.feed(Direction::ToClient, start);
        let mut out = [0; HEADER_LEN];
        out.copy_from_slice(bytes);
        out[24..32].copy_from_slice(&client_id.to_le_bytes());
        self.after_server();
        Some(out)
    }

    /// The rest of a frame [`Self::passes`] let through, as it passes.
    pub fn observe_server(&mut self, bytes: &[u8]) {
        self.observer.feed(Direction::ToClient, bytes);
    }

    fn client_frame(&mut self, frame: Vec<u8>) {
        if let Err(frame) = self.try_client_frame(frame) {
            self.blocked.push_back(frame);
        }
    }

    /// Sends a client frame on, its ids made the server's; gives it back if it needs fresh
    /// ids the server has not granted yet.
    fn try_client_frame(&mut self, mut frame: Vec<u8>) -> Result<(), Vec<u8>> {
        if let Some((id, key)) = single_request(&frame)
            && self.claim(id, &key)
        {
            return Ok(());
        }
        let chain = chain(&frame);
        // Plan first (a miss turns the ids of the requests after it fresh): the frame
        // waits if an id it would get is beyond what the server has granted.
        let (mut fresh, mut top) = (self.fresh, self.top);
        for (h, _, _) in &chain {
            if h.is_response() || h.command == Command::CANCEL {
                continue;
            }
            let charge = charge_of(h.credit_charge);
            fresh |= self.collides(h.message_id, charge);
            let start = if fresh { top } else { h.message_id };
            let end = start.saturating_add(charge);
            if end > self.window_end {
                return Err(frame);
            }
            top = top.max(end);
        }
        feed(&mut self.observer, Direction::ToServer, &frame);
        let single = chain.len() == 1;
        for (header, at, len) in chain {
            if header.is_response() {
                continue;
            }
            if header.command == Command::CANCEL {
                // A CANCEL consumes no id: it names its request's, which the server knows
                // by the id far gave it (a claimed prediction's, for a crossed request).
                let id = header.message_id;
                match self.pending.iter().find(|(_, p)| match p {
                    Pending::Client { client_id, .. } => *client_id == id,
                    Pending::Prediction {
                        client_id, claimed, ..
                    } => *client_id == id && claimed.is_some(),
                }) {
                    Some((&server_id, _)) => {
                        frame[at + 24..at + 32].copy_from_slice(&server_id.to_le_bytes());
                    }
                    // Answered already: with fresh ids, the client's id may be another
                    // request's at the server, which must not be cancelled. A CANCEL is
                    // advisory; one for nothing is dropped.
                    None if self.fresh && single => return Ok(()),
                    None => {}
                }
                continue;
            }
            self.request_out(&header, &mut frame[at..at + len]);
        }
        self.to_server.push_back(frame);
        Ok(())
    }

    /// A client request goes to the server (`message`: its header and its body, or the
    /// start of its body, enough to name a file): its server id written in, the ids and
    /// credits it takes counted, what it means for read-ahead noted.
    fn request_out(&mut self, header: &Header, message: &mut [u8]) {
        let client_id = header.message_id;
        let charge = charge_of(header.credit_charge);
        if self.collides(client_id, charge) {
            self.missed();
        }
        let server_id = if self.fresh { self.top } else { client_id };
        if server_id != client_id {
            message[24..32].copy_from_slice(&server_id.to_le_bytes());
            self.stats.remapped += 1;
        }
        self.top = self.top.max(server_id.saturating_add(charge));
        self.client_next = self.client_next.max(client_id.saturating_add(charge));
        // Whatever the request (but the active file's next READ, which `client_read`
        // judges), it has taken ids a prediction would otherwise have had.
        let body = &message[HEADER_LEN..];
        let next_read = header.command == Command::READ
            && ReadRequest::parse(body).is_ok_and(|r| Some(r.file_id) == self.active);
        if let Some(file) = self.active.and_then(|f| self.files.get_mut(&f))
            && client_id >= file.next_id
            && !(next_read && client_id == file.next_id)
        {
            file.next_id = client_id.saturating_add(charge);
        }
        self.pending.insert(
            server_id,
            Pending::Client {
                client_id,
                command: header.command,
            },
        );
        self.client_request(header, server_id, body);
    }

    /// Whether a client frame from near that starts with `start` (its framing header, its
    /// SMB header and at least the first 32 bytes of its body) may go to the server as its
    /// bytes come, far changing no more than its header: one WRITE request (large) that
    /// waits for nothing, its ids within what the server has granted. Far does here what
    /// [`Self::from_near`] would; the header to send, if so. The rest of the frame is given
    /// to [`Self::observe_client`] as it passes.
    pub fn passes_request(&mut self, start: &[u8]) -> Option<[u8; HEADER_LEN]> {
        let message = start.get(FRAME_HEADER_LEN..)?;
        let header = Header::parse(message).ok()?;
        if header.is_response()
            || header.next_command != 0
            || header.command != Command::WRITE
            || !self.blocked.is_empty()
        {
            return None;
        }
        let mut out = [0; HEADER_LEN];
        out.copy_from_slice(&message[..HEADER_LEN]);
        if self.through {
            return Some(out);
        }
        let charge = charge_of(header.credit_charge);
        let fresh = self.fresh || self.collides(header.message_id, charge);
        let first = if fresh { self.top } else { header.message_id };
        if first.saturating_add(charge) > self.window_end {
            return None;
        }
        // The observer sees the framing and the header here, the rest as it passes
        // ([`Self::observe_client`]), as the splice hands it on.
        self.observer
            .feed(Direction::ToServer, &start[..FRAME_HEADER_LEN + HEADER_LEN]);
        let mut message = message.to_vec();
        self.request_out(&header, &mut message);
        out.copy_from_slice(&message[..HEADER_LEN]);
        self.read_ahead();
        Some(out)
    }

    /// The rest of a frame [`Self::passes_request`] let through, as it passes.
    pub fn observe_client(&mut self, bytes: &[u8]) {
        if !self.through {
            self.observer.feed(Direction::ToServer, bytes);
        }
    }

    /// A client request with id `id` that near passed on while the prediction for that id
    /// was on its way to near: if it asks what the prediction asks (or, a READ, less), it
    /// is the prediction's, and not a miss. Its answer goes to near as the server's answer
    /// to it, or went already as PREFETCHED, which near gives the client (it takes the
    /// announcement that crossed its request as asked).
    fn claim(&mut self, id: u64, asked: &Key) -> bool {
        let Some(&key) = self.predictions.get(&id) else {
            return false;
        };
        if !key.covers(asked) {
            return false;
        }
        self.predictions.remove(&id);
        self.consumed(&key);
        for pending in self.pending.values_mut() {
            if let Pending::Prediction {
                client_id, claimed, ..
            } = pending
                && *client_id == id
            {
                *claimed = Some(Claimed { key, asked: *asked });
            }
        }
        self.stats.crossed += 1;
        true
    }

    /// The client has had the answer to the prediction with `key`.
    fn consumed(&mut self, key: &Key) {
        let interval = u64::from(self.validity_ms / UPTAKE_INTERVALS).max(1);
        self.uptake
            .consumed(self.clock.ms(), u64::from(key.read_length()), interval);
        if let Key::Read(read) = key {
            if let Some(script) = &mut self.script {
                script.read_on(read.file_id, read.offset, read.length);
            }
            // Taken: far reads on once the client has (a block after the first), or at
            // once while the client reads files on (`reads_on`).
            if read.offset > 0 {
                self.reads_on = true;
            }
            if let Some(file) = self.files.get_mut(&read.file_id)
                && self.reads_on
            {
                file.confirmed = true;
            }
        }
    }

    /// What a client request means for read-ahead.
    fn client_request(&mut self, header: &Header, server_id: u64, body: &[u8]) {
        match header.command {
            Command::CREATE => {
                // ShareAccess (4 bytes at 32); the tree, which an async answer does not name.
                if let (Some(share), TreeOrAsync::Tree { tree_id, .. }) =
                    (body.get(32..36), header.tree_or_async)
                {
                    self.creates.insert(server_id, (le32(share, 0), tree_id));
                }
            }
            Command::READ => {
                if let Ok(read) = ReadRequest::parse(body) {
                    self.client_read(header, &read);
                }
            }
            Command::QUERY_INFO => {
                if let Ok(query) = QueryInfoRequest::parse(body)
                    && let Some(file) = self.files.get_mut(&query.file_id)
                    && let Some(script) = &mut file.learning
                {
                    if query.input_buffer_length == 0 && script.queries.len() < MAX_SCRIPT_QUERIES {
                        script.queries.push((*header, query));
                    } else {
                        file.learning = None;
                    }
                }
            }
            Command::CLOSE => {
                self.stop_all();
                // The file is gone from the client's view. One it did not read teaches
                // what the client does with a file it opens only to look at.
                if let Some(file) =
                    file_id_of(Command::CLOSE, body).and_then(|id| self.files.remove(&id))
                    && let Some(script) = file.learning
                {
                    self.script = Some(script);
                }
                self.script_file_closed();
            }
            // Handles the session or the tree had are closed with it.
            Command::LOGOFF => {
                self.files.retain(|_, f| f.session_id != header.session_id);
                self.script_file_closed();
            }
            Command::TREE_DISCONNECT => {
                if let TreeOrAsync::Tree { tree_id, .. } = header.tree_or_async {
                    self.files
                        .retain(|_, f| f.session_id != header.session_id || f.tree_id != tree_id);
                    self.script_file_closed();
                }
            }
            Command::WRITE
            | Command::SET_INFO
            | Command::FLUSH
            | Command::LOCK
            | Command::IOCTL => {
                self.stop_all();
                if let Some(file) =
                    file_id_of(header.command, body).and_then(|id| self.files.get_mut(&id))
                {
                    file.learning = None;
                }
            }
            _ => {}
        }
    }

    /// The file the script is learnt from may be closed: if so, the script is whole (a
    /// file opened later with the same id does not extend it).
    fn script_file_closed(&mut self) {
        if let Some(script) = &mut self.script
            && let Some((_, read)) = script.read
            && !self.files.contains_key(&read.file_id)
        {
            script.reading = false;
        }
    }

    /// A client READ reached far (near had no prediction for it).
    fn client_read(&mut self, header: &Header, read: &ReadRequest) {
        let unsigned = self.observer.verdict() == Verdict::Unsigned;
        let charge = charge_of(header.credit_charge);
        let Some(file) = self.files.get_mut(&read.file_id) else {
            return;
        };
        let next = read.offset.saturating_add(u64::from(read.length));
        if read.offset > 0 && file.client_end == Some(read.offset) {
            // The client reads on by itself: the next block after its last READ.
            self.reads_on = true;
        }
        if let Some(mut script) = file.learning.take()
            && read.offset == 0
        {
            let mut read = *read;
            if u64::from(read.length) >= file.end_of_file {
                let block = u64::from(read.length.div_ceil(BYTES_PER_CREDIT).max(1))
                    * u64::from(BYTES_PER_CREDIT);
                read.length = u32::try_from(block)
                    .unwrap_or(u32::MAX)
                    .min(self.max_read)
                    .max(read.length);
            }
            script.read = Some((*header, read));
            script.read_to = next;
            script.reading = true;
            self.script = Some(script);
        } else if let Some(script) = &mut self.script {
            script.read_on(read.file_id, read.offset, read.length);
        }
        // A READ past the end asks the whole block; one that ends at the end and asks less
        // than the block asks only the rest.
        if next > file.end_of_file {
            self.clips = false;
        } else if next == file.end_of_file
            && file.template.is_some_and(|(_, t)| read.length < t.length)
        {
            self.clips = true;
        }
        match &file.template {
            None if unsigned
                && file.eligible
                && file.ahead == Ahead::On
                && self.active.is_none() =>
            {
                // Read ahead from the client's next block on, at once if the client has
                // read on in files before (or this is its first), else once it asks for
                // it: a client may look at the start of each file and close it.
                file.template = Some((*header, *read));
                file.next_offset = next;
                file.next_id = header.message_id.saturating_add(charge);
                file.confirmed = self.reads_on;
                self.active = Some(read.file_id);
            }
            Some((_, template))
                if file.ahead == Ahead::On
                    && header.message_id == file.next_id
                    && read.offset == file.next_offset
                    && read.length == template.length =>
            {
                // The client asked for the next block itself (the window had not reached
                // it): the prediction goes on from there.
                file.next_offset = next;
                file.next_id = header.message_id.saturating_add(charge);
                file.confirmed = true;
            }
            Some((_, template)) if file.ahead == Ahead::Missed => {
                // After a miss the client's READs all reach far: the second of two in a
                // row, of the block read ahead before, from a client that reads one at a
                // time, starts read-ahead again (the ids are fresh by then, the
                // predictions' too).
                let in_row = file.client_end == Some(read.offset);
                // This READ is the only one of the client's at the server: it reads one at
                // a time (one that keeps several outstanding has sent more that far has
                // not seen yet, which a prediction must not take ids from).
                let alone = || {
                    let reads = self.pending.values().filter(
                        |p| matches!(p, Pending::Client { command, .. } if *command == Command::READ),
                    );
                    reads.count() == 1
                };
                if unsigned
                    && in_row
                    && file.resumes < MAX_RESUMES
                    && read.length == template.length
                    && self.active.is_none_or(|a| a == read.file_id)
                    && alone()
                {
                    file.template = Some((*header, *read));
                    file.next_offset = next;
                    file.next_id = header.message_id.saturating_add(charge);
                    file.confirmed = true;
                    file.ahead = Ahead::On;
                    file.resumes += 1;
                    self.active = Some(read.file_id);
                    self.stats.resumed += 1;
                }
            }
            Some(_) => file.ahead = Ahead::Off,
            None => {}
        }
        file.client_end = Some(next);
    }

    /// A CREATE answered (the client's `client_id`): the file, its end, whether it may be
    /// read ahead, and the script to play for it.
    fn created(&mut self, header: &Header, client_id: u64, body: &[u8]) {
        let Some((share, tree_id)) = self.creates.remove(&header.message_id) else {
            return;
        };
        if self.files.len() >= MAX_FILES {
            return;
        }
        let Ok(created) = CreateResponse::parse(body) else {
            return;
        };
        let file_id = created.file_id;
        let protected = share & FILE_SHARE_WRITE == 0 || created.caches_reads();
        let eligible = protected || self.validity_ms > 0;
        self.files.insert(
            file_id,
            File {
                session_id: header.session_id,
                tree_id,
                end_of_file: created.end_of_file,
                eligible,
                valid_ms: if protected { 0 } else { self.validity_ms },
                ahead: Ahead::On,
                client_end: None,
                resumes: 0,
                template: None,
                next_offset: 0,
                next_id: 0,
                learning: Some(Script::default()),
                confirmed: false,
                scripted_to: 0,
            },
        );
        if eligible {
            self.opened = Some(Opened {
                file_id,
                next_id: client_id.saturating_add(charge_of(header.credit_charge)),
                session_id: header.session_id,
                tree_id,
                directory: created.file_attributes & FILE_ATTRIBUTE_DIRECTORY != 0,
            });
        }
    }

    /// Plays the script for the file just opened, if the client has sent nothing since its
    /// CREATE and nothing else is predicted: its QUERY_INFOs with the ids the client will
    /// give them, then its first READ, from which [`Self::read_ahead`] goes on.
    fn open_ahead(&mut self) {
        let Some(opened) = self.opened.take() else {
            return;
        };
        if self.through
            || self.window == 0
            || self.observer.verdict() != Verdict::Unsigned
            || !self.predictions.is_empty()
            || self.client_next != opened.next_id
        {
            return;
        }
        let Some(script) = self
            .script
            .clone()
            .filter(|s| !s.queries.is_empty() || (s.read.is_some() && !opened.directory))
        else {
            // Nothing to play: the file teaches far what the client does.
            return;
        };
        // What the client does with this file is what far predicts, not what it learns;
        // but for a READ the script has not got yet, which the client may send next.
        if let Some(file) = self.files.get_mut(&opened.file_id) {
            file.learning = script.read.is_none().then(|| Script {
                queries: script.queries.clone(),
                ..Script::default()
            });
        }
        let mut id = opened.next_id;
        let mut ahead = self.ahead_bytes();
        let valid_ms = self
            .files
            .get(&opened.file_id)
            .map_or(self.validity_ms, |f| f.valid_ms);
        let window = self.window_for(valid_ms);
        for (header, query) in script.queries {
            ahead += u64::from(query.output_buffer_length);
            if ahead > window {
                return;
            }
            let request = Header {
                message_id: id,
                ..opened.on_tree(header)
            };
            let query = QueryInfoRequest {
                file_id: opened.file_id,
                ..query
            };
            let mut message = vec![0; HEADER_LEN + QueryInfoRequest::LEN];
            if query.emit(&mut message[HEADER_LEN..]).is_none() {
                return;
            }
            let Some(next) = self.predict(request, message, valid_ms) else {
                return;
            };
            id = next;
        }
        let Some((header, read)) = script.read.filter(|_| !opened.directory) else {
            return;
        };
        let Some(file) = self.files.get_mut(&opened.file_id) else {
            return;
        };
        let header = opened.on_tree(header);
        let read = ReadRequest {
            file_id: opened.file_id,
            ..read
        };
        file.template = Some((header, read));
        file.next_id = id;
        file.scripted_to = script.read_to;
        self.active = Some(opened.file_id);
    }

    /// Sends the server `message`, a request with `header` (the client's id for it, the
    /// credits to ask) and its body, as a prediction, and announces it to near, which may
    /// hold its answer for `valid_ms` (0: while the prediction stands); the client id after
    /// it, or `None` if the ids, the credits or the limits do not allow it.
    fn predict(&mut self, header: Header, mut message: Vec<u8>, valid_ms: u32) -> Option<u64> {
        let id = header.message_id;
        let charge = charge_of(header.credit_charge);
        let server_id = if self.fresh { self.top } else { id };
        if server_id.saturating_add(charge) > self.window_end
            || server_id < self.top
            || id < self.client_next
            || self.collides(id, charge)
            || self.predictions.len() >= MAX_PREDICTIONS
        {
            return None;
        }
        // Ask at least the credits the request spends: a prediction the client never uses
        // must leave the server's window no shorter than the client's.
        let request = Header {
            status: 0,
            flags: 0,
            next_command: 0,
            credits: header
                .credits
                .max(u16::try_from(charge).unwrap_or(u16::MAX)),
            signature: [0; 16],
            ..header
        };
        request.emit(&mut message)?;
        let key = Key::of(&request, &message[HEADER_LEN..])?;
        self.to_near.push_back(Record::Announce {
            message_id: id,
            key,
            valid_ms,
        });
        message[24..32].copy_from_slice(&server_id.to_le_bytes());
        self.to_server.push_back(message);
        self.predictions.insert(id, key);
        self.pending.insert(
            server_id,
            Pending::Prediction {
                client_id: id,
                interim_credits: 0,
                claimed: None,
            },
        );
        self.top = self.top.max(server_id.saturating_add(charge));
        self.stats.prefetched += 1;
        self.stats.prefetched_bytes += u64::from(key.read_length());
        Some(id.saturating_add(charge))
    }

    /// The final answer to a prediction: made synchronous, the interim's credits added, and
    /// sent to near unless the client has gone another way meanwhile.
    fn prediction_answered(
        &mut self,
        client_id: u64,
        header: &Header,
        message: &[u8],
        interim_credits: u16,
        claimed: Option<Claimed>,
    ) {
        let key = match (claimed, self.predictions.get(&client_id)) {
            (Some(c), _) => c.key,
            (None, Some(&found)) => found,
            // Missed: its id went to another request. Nothing to give.
            (None, None) => return,
        };
        if message.len() > MAX_FRAME_LEN - 16 && claimed.is_none() {
            // Longer than a record can carry (a server answering more than was asked):
            // withdrawn, so that near sends the client's request, if it holds one, on,
            // with a fresh id (the prediction spent the client's).
            self.predictions.remove(&client_id);
            self.fresh = true;
            self.to_near.push_back(Record::Withdrawn {
                message_id: client_id,
            });
            return;
        }
        let tree_id = match key {
            Key::Read(read) => read.tree_id,
            Key::Query(query) => query.tree_id,
        };
        let mut answer = message.to_vec();
        let sync = Header {
            message_id: client_id,
            flags: header.flags & !flags::ASYNC_COMMAND,
            credits: header.credits.saturating_add(interim_credits),
            next_command: 0,
            tree_or_async: TreeOrAsync::Tree {
                reserved: 0,
                tree_id,
            },
            ..*header
        };
        if sync.emit(&mut answer).is_none() {
            return;
        }
        if header.status != status::SUCCESS
            && let Key::Read(read) = key
            && let Some(file) = self.files.get_mut(&read.file_id)
        {
            // The end of the file, or an error: nothing further to read ahead.
            file.ahead = Ahead::Off;
        }
        match claimed {
            Some(Claimed { asked, .. }) => {
                asked.cut_for(&mut answer);
                self.to_near.push_back(Record::Smb(answer));
            }
            None => self.to_near.push_back(Record::Prefetched {
                message_id: client_id,
                at: self.clock.ms().unwrap_or(NO_CLOCK),
                answer,
            }),
        }
    }

    /// Issues the READs the window, the credits and the file allow.
    fn read_ahead(&mut self) {
        let Some(file_id) = self.active.filter(|_| !self.through) else {
            return;
        };
        if self.observer.verdict() != Verdict::Unsigned {
            return;
        }
        let mut ahead = self.ahead_bytes();
        loop {
            let Some(file) = self.files.get(&file_id) else {
                return;
            };
            let Some((header, read)) = file.template else {
                return;
            };
            let valid_ms = file.valid_ms;
            let window = self.window_for(valid_ms);
            let rest = file.end_of_file.saturating_sub(file.next_offset);
            if file.ahead != Ahead::On
                || rest == 0
                || (!file.confirmed && file.next_offset > 0 && file.next_offset >= file.scripted_to)
                // Its answer, and the record that carries it, must fit a frame.
                || read.length as usize > MAX_FRAME_LEN - 4096
            {
                return;
            }
            // What the client will ask: the block, or only the file's rest if it clips, at
            // the charge of what it asks (none in 2.0.2).
            let length = if self.clips {
                read.length.min(u32::try_from(rest).unwrap_or(u32::MAX))
            } else {
                read.length
            };
            if length == 0 || ahead.saturating_add(u64::from(length)) > window {
                return;
            }
            let credit_charge = if header.credit_charge == 0 {
                0
            } else {
                u16::try_from(length.div_ceil(BYTES_PER_CREDIT).max(1)).unwrap_or(u16::MAX)
            };
            let request = Header {
                message_id: file.next_id,
                credit_charge,
                ..header
            };
            let read = ReadRequest {
                offset: file.next_offset,
                length,
                ..read
            };
            let mut message = vec![0; HEADER_LEN + ReadRequest::LEN];
            if read.emit(&mut message[HEADER_LEN..]).is_none() {
                return;
            }
            let Some(next_id) = self.predict(request, message, valid_ms) else {
                return;
            };
            ahead += u64::from(length);
            if let Some(file) = self.files.get_mut(&file_id) {
                file.next_offset = file.next_offset.saturating_add(u64::from(length));
                file.next_id = next_id;
            }
        }
    }

    /// Whether the client ids `id..id + charge` include one a prediction has.
    fn collides(&self, id: u64, charge: u64) -> bool {
        self.predictions.any_in(id..id.saturating_add(charge))
    }

    /// The client used ids a prediction had (its request's id is `at`): every outstanding
    /// prediction is lost (their ids are spent at the server) and withdrawn, their files'
    /// read-ahead stops, and the script is forgotten (the client does something else now;
    /// far learns again from the next file it opens).
    fn missed(&mut self) {
        self.fresh = true;
        for (id, key) in self.predictions.take() {
            // Near may hold a client request for it: it goes to the server after all.
            self.to_near.push_back(Record::Withdrawn { message_id: id });
            self.stats.missed += 1;
            self.stats.missed_bytes += u64::from(key.read_length());
            if let Some(file) = self.files.get_mut(&key.file_id()) {
                if file.ahead == Ahead::On {
                    file.ahead = Ahead::Missed;
                }
            }
        }
        self.script = None;
        // Perhaps the client closed a file after its first block while far read on: it
        // must read on by itself before far does again.
        self.reads_on = false;
        // The rate may have been too high (answers outlived their window): measured again
        // from the floor.
        self.uptake = Uptake::default();
        // What the played files' clients sent is partly unknown here (near answered it):
        // the next file opened teaches.
        for file in self.files.values_mut() {
            file.learning = None;
        }
    }

    fn stop_all(&mut self) {
        for file in self.files.values_mut() {
            file.ahead = Ahead::Off;
        }
        self.active = None;
    }

    /// Whether far stands between the client's ids and the server's: a prediction is
    /// outstanding or the ids are fresh. Until then, every client frame reached the
    /// server as the client sent it.
    pub fn translating(&self) -> bool {
        !self.predictions.is_empty() || self.fresh
    }

    /// Ends read-ahead for good: from here each client frame goes to the server as it
    /// comes, none waits for credits (far may no longer see the server's grants). The
    /// frames waiting go first, in order. Only while far is not [`translating`](Self::translating):
    /// `false` (and nothing changed) otherwise.
    pub fn pass_through(&mut self) -> bool {
        if self.translating() {
            return false;
        }
        self.through = true;
        self.stop_all();
        self.to_server.extend(self.blocked.drain(..));
        true
    }

    /// The most bytes the answers to far's predictions not seen consumed may carry at once
    /// (READs' lengths, QUERY_INFOs' output buffers): its window, which the gateway may change as the session goes (a budget shared by all
    /// sessions). A smaller window issues nothing until enough is consumed.
    pub fn set_window(&mut self, window: u64) {
        self.window = window;
        self.read_ahead();
    }

    /// How long near may hold an answer about a file whose share mode lets other clients
    /// write and that has no oplock granting read caching, ms: such files are read ahead
    /// too, and near gives the client an answer only within this long of its arrival. 0
    /// (the start): they are not read ahead. Applies to files opened from now on.
    pub fn set_validity(&mut self, ms: u32) {
        self.validity_ms = ms;
    }

    /// The time now: PREFETCHED records carry it, so that near can tell how long each
    /// queued on its way.
    pub fn set_now(&mut self, now: Instant) {
        self.clock.set(now);
    }

    /// The bytes far may have ahead of the client for a file whose answers near may hold
    /// `valid_ms` (0: as long as predictions stand), within the window far was given:
    /// what the client takes in half as long at the rate it last took answers
    /// ([`Uptake`]), and at least a kibibyte per millisecond of the window (before that
    /// rate is known, after a miss, when the client took nothing for a window, or when
    /// it is slow).
    fn window_for(&self, valid_ms: u32) -> u64 {
        if valid_ms == 0 {
            return self.window;
        }
        let floor = u64::from(valid_ms) << 10;
        let rate = self.uptake.rate(self.clock.ms(), u64::from(valid_ms));
        let taken = rate.saturating_mul(u64::from(valid_ms)) / 2000;
        self.window.min(floor.max(taken))
    }

    /// Whether far may act ahead of the client: the session is judged unsigned and far
    /// has not passed through for good. A window is of use to it only then.
    pub fn may_act(&self) -> bool {
        !self.through && self.observer.verdict() == Verdict::Unsigned
    }

    /// Bytes the answers to far's predictions not seen consumed may carry (on their way to
    /// near, or held there): at most the window when it was last issued one.
    pub fn ahead_bytes(&self) -> u64 {
        self.predictions.bytes()
    }

    /// Bytes far holds: client frames waiting for the server's credits.
    pub fn held_bytes(&self) -> usize {
        self.blocked.iter().map(Vec::len).sum()
    }

    /// The next frame payload for the server.
    pub fn poll_to_server(&mut self) -> Option<Vec<u8>> {
        self.to_server.pop_front()
    }

    /// The next record for near.
    pub fn poll_to_near(&mut self) -> Option<Record> {
        self.to_near.pop_front()
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }
}

/// The messages of a frame's payload: each header, where its message starts and its
/// length, so that far can rewrite a header in place afterwards.
fn chain(frame: &[u8]) -> Vec<(Header, usize, usize)> {
    let mut at = 0;
    Messages::new(frame)
        .map(|(header, message)| {
            let start = at;
            at += message.len();
            (header, start, message.len())
        })
        .collect()
}

/// Feeds one frame's payload, framed again, to the observer.
fn feed(observer: &mut Observer, direction: Direction, payload: &[u8]) {
    if let Some(header) = frame_header(payload.len()) {
        observer.feed(direction, &header);
        observer.feed(direction, payload);
    }
}

#[cfg(test)]
mod tests {
    use super::Uptake;

    /// The rate is the bytes reported over a whole interval, the report that opens the
    /// first one not counted, at most twice the last (or the floor's); it is none once
    /// nothing was taken for a window; an interval across a pause gives the pause's low
    /// rate, and without a clock nothing is measured.
    #[test]
    fn uptake_is_measured_over_whole_intervals() {
        let mut u = Uptake::default();
        u.consumed(Some(1000), 65_536, 250);
        assert_eq!(u.rate, 0, "one report is no interval");
        for ms in [1100, 1200] {
            u.consumed(Some(ms), 1 << 20, 250);
        }
        assert_eq!(u.rate, 0, "200 ms is not yet an interval");
        u.consumed(Some(1250), 1 << 20, 250);
        // 3 MiB in 250 ms (12.6 MB/s), at most twice the floor's rate.
        assert_eq!(u.rate, 4_096_000);
        assert_eq!(u.rate(Some(2250), 1000), 4_096_000);
        assert_eq!(u.rate(Some(2251), 1000), 0, "nothing taken for a window");
        // 3 MiB in the next 250 ms: twice the last.
        u.consumed(Some(1300), 3 << 20, 250);
        u.consumed(Some(1500), 0, 250);
        assert_eq!(u.rate, 8_192_000);
        // The client paused for 10 s, then took 1 MiB.
        u.consumed(Some(11_500), 1 << 20, 250);
        assert_eq!(u.rate, 104_857);
        u.consumed(None, 1 << 30, 250);
        assert_eq!(u.rate, 104_857);
    }
}
