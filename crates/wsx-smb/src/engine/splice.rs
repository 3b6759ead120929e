//! One session's engine half between its two byte streams, without I/O: the gateway hands
//! [`Splice`] what it reads from the session's TCP end (the client, at near; the server, at
//! far) and from the tunnel stream to the other gateway (the peer), and writes what it
//! hands back, as it does for any relay.
//!
//! ```text
//!   end (TCP 445) ── Direct TCP frames ──> Frames ─> Near/Far ─> records ──> peer (stream)
//!   end <── frames ── Near/Far <─ Frames <── records (SMB frames and the engine's) ── peer
//! ```
//!
//! An SMB frame and a record of type 0 are the same bytes, so what the engines do not touch
//! crosses unchanged. An end that sends something that is not a Direct TCP frame (it does
//! not speak SMB2) turns its direction opaque: an [`OPAQUE`] record, then its bytes as they
//! come, to the end of the stream. That is safe only while far is not translating ids
//! ([`Far::translating`]); a stream that turns opaque while it is fails the session
//! ([`SpliceError::Unframed`]) rather than hand either end ids the other did not give.
//!
//! Frames of 16 KiB or more that a half passes on with no more than its header changed
//! (large READ answers, WRITE requests) stream: written on as their bytes come.
//!
//! Memory: the frame being read each way (at most a frame, 16 MiB), what waits to be written
//! (the caller stops reading a side while the way it feeds holds [`Splice::to_end`] or
//! [`Splice::to_peer`] bytes beyond its limit), and what near holds of far's answers
//! (bounded by far's window).

use super::link::{MAX_RECORD, OPAQUE};
use super::{EngineStats, Far, Near, Record, RecordError};
use crate::wire::framing::{FRAME_HEADER_LEN, Frames, MAX_FRAME_LEN};
use crate::wire::header::{HEADER_LEN, Header, Protocol};

/// Why a session's splice cannot go on; the gateway aborts the session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    /// The peer sent a record that cannot be read: a bug, or not a wsx gateway.
    #[error("the peer gateway's stream: {0}")]
    Record(#[from] RecordError),
    /// An end stopped speaking SMB2 after far had started translating ids.
    #[error("the {0} stopped framing SMB2 after read-ahead had begun")]
    Unframed(&'static str),
    /// A record too long to send: a server's answer to a READ far took for a prediction
    /// that says more than the READ asked.
    #[error("an answer longer than a record may be")]
    TooLong,
    /// The peer's stream ended inside an engine record.
    #[error("the peer gateway's stream ended inside a record")]
    CutRecord,
}

/// Which half a gateway runs: near for a session it intercepted (its client is local), far
/// for one that came through the tunnel (its server is local).
#[derive(Debug)]
enum Half {
    Near(Box<Near>),
    Far(Box<Far>),
}

/// The room an emptied [`Outbox`] keeps: small messages' worth; a larger burst's is
/// allocated for it and given back once written.
const KEEP_ROOM: usize = 16 << 10;

/// Bytes waiting to be written to one side.
#[derive(Debug, Default)]
struct Outbox {
    bytes: Vec<u8>,
    /// `bytes[at..]` wait; the rest was written.
    at: usize,
}

impl Outbox {
    fn pending(&self) -> &[u8] {
        &self.bytes[self.at..]
    }

    fn written(&mut self, n: usize) {
        self.at = (self.at + n).min(self.bytes.len());
        if self.at == self.bytes.len() {
            // Emptied: a burst's room goes back unless it is small, so that an idle
            // session keeps little (10,000 of them at most 2 × KEEP_ROOM each).
            if self.bytes.capacity() > KEEP_ROOM {
                self.bytes = Vec::new();
            }
            self.bytes.clear();
            self.at = 0;
        }
    }

    /// Room at the end, the written bytes reclaimed first once they are the larger part.
    fn reserve(&mut self, n: usize) -> &mut Vec<u8> {
        if self.at > 0 && self.at >= self.bytes.len() / 2 {
            self.bytes.drain(..self.at);
            self.at = 0;
        }
        self.bytes.reserve(n);
        &mut self.bytes
    }

    fn frame(&mut self, payload: &[u8]) {
        // Engines' payloads come from frames, so they fit; one that did not is cut to the
        // 24-bit length rather than lie about it (it cannot happen).
        let len = payload.len().min(MAX_FRAME_LEN);
        let out = self.reserve(FRAME_HEADER_LEN + len);
        out.extend_from_slice(&[0, (len >> 16) as u8, (len >> 8) as u8, len as u8]);
        out.extend_from_slice(&payload[..len]);
    }
}

/// One session's engine half and the framing both ways; see the module documentation.
#[derive(Debug)]
pub struct Splice {
    half: Half,
    from_end: Frames,
    from_peer: Frames,
    /// The end's direction, or the peer's, turned opaque: its bytes go on as they come.
    end_opaque: bool,
    peer_opaque: bool,
    to_end: Outbox,
    to_peer: Outbox,
    /// Bytes of a record streaming from the peer to the end that are still to come, and of
    /// a frame streaming from the end to the peer.
    passing: usize,
    end_passing: usize,
    /// The first bytes of a frame from the end, or the peer, that may stream, gathered
    /// until there are enough to judge it (a read ended inside them).
    end_start: Vec<u8>,
    peer_start: Vec<u8>,
    /// Why the splice cannot go on, found while handing out (returned by the next call).
    failed: Option<SpliceError>,
}

/// The shortest SMB frame a half streams through instead of holding it whole.
const CUT_THROUGH: usize = 16 << 10;

/// What a half reads of a request before it lets it stream: the header and the start of
/// the body, far enough to name the file (a WRITE's FileId ends 32 bytes in).
const REQUEST_START: usize = HEADER_LEN + 32;

/// The bytes of a frame's start a half judges it on: its framing header and
/// [`REQUEST_START`].
const JUDGE: usize = FRAME_HEADER_LEN + REQUEST_START;

/// Whether the frame starting `data` (at least [`JUDGE`] bytes) is one the half passes on
/// from its end with no more than its header changed, long enough to stream: at far a
/// server's answer ([`Far::passes`]), at near a client's WRITE ([`Near::passes_request`]).
/// Its length and the header to send, if so.
fn end_cut_through(half: &mut Half, data: &[u8]) -> Option<(usize, [u8; HEADER_LEN])> {
    let len = stream_len(data)?;
    match half {
        Half::Far(far) => far
            .passes(data.get(..FRAME_HEADER_LEN + HEADER_LEN)?)
            .map(|header| (len, header)),
        Half::Near(near) => {
            let start = data.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + REQUEST_START)?;
            let mut header = [0; HEADER_LEN];
            header.copy_from_slice(&start[..HEADER_LEN]);
            near.passes_request(start).then_some((len, header))
        }
    }
}

/// The same for a record from the peer that is an SMB frame: written on as its bytes come
/// instead of after the last (at the WAN's rate, an 8 MiB frame held whole would wait
/// 134 ms at 500 Mbit/s). At near an answer ([`Near::passes`], untouched), at far a
/// client's WRITE ([`Far::passes_request`]); the engine has seen the frame's start.
fn cut_through(half: &mut Half, data: &[u8]) -> Option<(usize, [u8; HEADER_LEN])> {
    let len = stream_len(data)?;
    match half {
        Half::Near(near) => {
            let message = data.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + HEADER_LEN)?;
            let mut header = [0; HEADER_LEN];
            header.copy_from_slice(message);
            let passes = match Header::parse(message) {
                Ok(parsed) => near.passes(&parsed),
                // Not SMB2 (encrypted, compressed, SMB1): nothing near acts on.
                Err(_) => Protocol::of(message) != Some(Protocol::Smb2),
            };
            passes.then_some((len, header))
        }
        Half::Far(far) => far
            .passes_request(data.get(..FRAME_HEADER_LEN + REQUEST_START)?)
            .map(|header| (len, header)),
    }
}

/// A frame that streams: its first bytes, its length, the header to send for it, and how
/// many of the read's bytes its start took (0: it was all in the read, which still holds
/// it).
struct Stream {
    start: [u8; JUDGE],
    len: usize,
    header: [u8; HEADER_LEN],
    taken: usize,
}

/// What a way does with a read's bytes at a frame's start ([`judge`]).
enum Judged {
    /// All were gathered; more are needed.
    Wait,
    /// The frame goes the usual way, from the read's bytes.
    Usual,
    /// The frame goes the usual way, from these gathered bytes first (this many of the
    /// read's).
    Feed(Vec<u8>, usize),
    /// The frame streams.
    Stream(Stream),
}

/// Judges the frame that starts in `start` (gathered from earlier reads) and `data`: on
/// its first [`JUDGE`] bytes, read in place when they are all in `data`, else gathered;
/// `cut` says whether it streams and how.
fn judge(
    start: &mut Vec<u8>,
    data: &[u8],
    mut cut: impl FnMut(&[u8]) -> Option<(usize, [u8; HEADER_LEN])>,
) -> Judged {
    let taken = if start.is_empty() && data.len() >= JUDGE {
        0
    } else {
        match gather(start, data) {
            Gather::Wait => return Judged::Wait,
            Gather::No(n) => return Judged::Feed(std::mem::take(start), n),
            Gather::Judge(n) => n,
        }
    };
    let mut first = [0; JUDGE];
    first.copy_from_slice(if taken == 0 {
        &data[..JUDGE]
    } else {
        &start[..]
    });
    match cut(&first) {
        Some((len, header)) => {
            start.clear();
            Judged::Stream(Stream {
                start: first,
                len,
                header,
                taken,
            })
        }
        None if taken == 0 => Judged::Usual,
        None => Judged::Feed(std::mem::take(start), taken),
    }
}

/// What [`gather`] made of a read's bytes at a frame's start.
enum Gather {
    /// All were taken, and more are needed.
    Wait,
    /// The start holds [`JUDGE`] bytes of a frame that may stream, this many from the read.
    Judge(usize),
    /// The frame cannot stream (not an SMB frame, or too short): the start (this many from
    /// the read) goes the usual way.
    No(usize),
}

/// Gathers a frame's start from `data` into `start` (which holds what earlier reads
/// brought): its framing header first, then, if the frame is long enough to stream, up to
/// [`JUDGE`] bytes. Never takes bytes past the frame's end.
fn gather(start: &mut Vec<u8>, data: &[u8]) -> Gather {
    let mut taken = 0;
    for goal in [FRAME_HEADER_LEN, JUDGE] {
        let n = goal.saturating_sub(start.len()).min(data.len() - taken);
        start.extend_from_slice(&data[taken..taken + n]);
        taken += n;
        let framed = start.len() >= FRAME_HEADER_LEN;
        if start.first().is_some_and(|&kind| kind != 0) || framed && stream_len(start).is_none() {
            return Gather::No(taken);
        }
        if start.len() < goal {
            return Gather::Wait;
        }
    }
    Gather::Judge(taken)
}

/// The length of the SMB frame (record type 0) starting `data`, if it is long enough to
/// stream and its framing header is all there.
fn stream_len(data: &[u8]) -> Option<usize> {
    let start = data.get(..FRAME_HEADER_LEN)?;
    let len = usize::from(start[1]) << 16 | usize::from(start[2]) << 8 | usize::from(start[3]);
    (start[0] == 0 && len >= CUT_THROUGH).then_some(len)
}

impl Splice {
    /// The client's gateway's half.
    pub fn near() -> Self {
        Self::new(Half::Near(Box::default()))
    }

    /// The server's gateway's half, reading ahead up to `window` bytes beyond the client.
    pub fn far(window: u64) -> Self {
        Self::new(Half::Far(Box::new(Far::new(window))))
    }

    fn new(half: Half) -> Self {
        Self {
            half,
            from_end: Frames::new(),
            from_peer: Frames::new(),
            end_opaque: false,
            peer_opaque: false,
            to_end: Outbox::default(),
            to_peer: Outbox::default(),
            passing: 0,
            end_passing: 0,
            end_start: Vec::new(),
            peer_start: Vec::new(),
            failed: None,
        }
    }

    /// Bytes read from the end.
    pub fn from_end(&mut self, mut data: &[u8]) -> Result<(), SpliceError> {
        while !data.is_empty() {
            if self.end_opaque {
                self.to_peer.reserve(data.len()).extend_from_slice(data);
                break;
            }
            if self.end_passing > 0 {
                data = &data[self.end_pass(data)..];
                continue;
            }
            if self.from_end.between_frames() {
                let half = &mut self.half;
                match judge(&mut self.end_start, data, |start| {
                    end_cut_through(half, start)
                }) {
                    Judged::Wait => break,
                    Judged::Usual => {}
                    Judged::Feed(start, taken) => {
                        self.end_frames(&start)?;
                        data = &data[taken..];
                        continue;
                    }
                    Judged::Stream(stream) => {
                        data = self.start_stream(true, &stream, data);
                        continue;
                    }
                }
            }
            // Up to the end of one frame at a time, so that the next is judged afresh.
            let n = self.from_end.to_frame_end(data);
            self.end_frames(&data[..n])?;
            data = &data[n..];
        }
        self.failed.clone().map_or(Ok(()), Err)
    }

    /// A frame from the end (`from_end`) or the peer starts streaming: its framing and
    /// header go out, and what its start took of the read; the read's bytes left. What
    /// the half has for the other way may go now; for this way it waits for the frame's
    /// end.
    fn start_stream<'a>(&mut self, from_end: bool, stream: &Stream, data: &'a [u8]) -> &'a [u8] {
        let out = if from_end {
            self.end_passing = stream.len - HEADER_LEN;
            &mut self.to_peer
        } else {
            self.passing = stream.len - HEADER_LEN;
            &mut self.to_end
        }
        .reserve(FRAME_HEADER_LEN + HEADER_LEN);
        out.extend_from_slice(&stream.start[..FRAME_HEADER_LEN]);
        out.extend_from_slice(&stream.header);
        self.drain();
        let body = &stream.start[FRAME_HEADER_LEN + HEADER_LEN..];
        match stream.taken {
            0 => &data[FRAME_HEADER_LEN + HEADER_LEN..],
            taken => {
                if from_end {
                    self.end_pass(body);
                } else {
                    self.peer_pass(body);
                }
                &data[taken..]
            }
        }
    }

    /// Bytes of a frame streaming from the end to the peer: as many of `data` as the frame
    /// has left go on (far's observer sees them); how many.
    fn end_pass(&mut self, data: &[u8]) -> usize {
        let n = self.end_passing.min(data.len());
        if let Half::Far(far) = &mut self.half {
            far.observe_server(&data[..n]);
        }
        self.to_peer.reserve(n).extend_from_slice(&data[..n]);
        self.end_passing -= n;
        if self.end_passing == 0 {
            self.drain();
        }
        n
    }

    /// The same from the peer to the end.
    fn peer_pass(&mut self, data: &[u8]) -> usize {
        let n = self.passing.min(data.len());
        if let Half::Far(far) = &mut self.half {
            far.observe_client(&data[..n]);
        }
        self.to_end.reserve(n).extend_from_slice(&data[..n]);
        self.passing -= n;
        if self.passing == 0 {
            self.drain();
        }
        n
    }

    /// Frames from the end, up to the end of one at most.
    fn end_frames(&mut self, data: &[u8]) -> Result<(), SpliceError> {
        let Self { half, from_end, .. } = self;
        let fed = from_end.feed(
            data,
            |kind| kind == 0,
            |_, frame| match half {
                Half::Near(near) => near.from_client(frame),
                Half::Far(far) => far.from_server(frame),
            },
        );
        if let Err(rest) = fed {
            self.end_turns_opaque(rest)?;
        }
        self.drain();
        Ok(())
    }

    /// Bytes read from the peer's stream.
    pub fn from_peer(&mut self, mut data: &[u8]) -> Result<(), SpliceError> {
        while !data.is_empty() {
            if self.peer_opaque {
                self.to_end.reserve(data.len()).extend_from_slice(data);
                break;
            }
            if self.passing > 0 {
                data = &data[self.peer_pass(data)..];
                continue;
            }
            if self.from_peer.between_frames() {
                let half = &mut self.half;
                match judge(&mut self.peer_start, data, |start| cut_through(half, start)) {
                    Judged::Wait => break,
                    Judged::Usual => {}
                    Judged::Feed(start, taken) => {
                        self.peer_records(&start)?;
                        data = &data[taken..];
                        continue;
                    }
                    Judged::Stream(stream) => {
                        data = self.start_stream(false, &stream, data);
                        continue;
                    }
                }
            }
            // Up to the end of one record at a time, so that the next is judged afresh.
            let n = self.from_peer.to_frame_end(data);
            self.peer_records(&data[..n])?;
            data = &data[n..];
        }
        self.failed.clone().map_or(Ok(()), Err)
    }

    /// Records from the peer, up to the end of one at most.
    fn peer_records(&mut self, data: &[u8]) -> Result<(), SpliceError> {
        let Self {
            half, from_peer, ..
        } = self;
        let mut error = None;
        let opaque = std::cell::Cell::new(false);
        let fed = from_peer.feed(
            data,
            |kind| kind <= MAX_RECORD && !opaque.get(),
            |kind, payload| {
                let record = match kind {
                    OPAQUE => {
                        opaque.set(true);
                        return;
                    }
                    // An SMB frame: its payload as it is, not copied again.
                    0 => Record::Smb(payload),
                    kind => match Record::parse(kind, &payload) {
                        Ok(record) => record,
                        Err(e) => {
                            error.get_or_insert(e);
                            return;
                        }
                    },
                };
                match half {
                    Half::Near(near) => near.from_far(record),
                    Half::Far(far) => far.from_near(record),
                }
            },
        );
        let opaque = opaque.get();
        if let Some(e) = error {
            return Err(e.into());
        }
        match fed {
            // Refused after an OPAQUE record: the rest is the far end's bytes.
            Err(rest) if opaque => self.peer_turns_opaque(rest)?,
            Err(rest) => return Err(RecordError::Type(rest[0]).into()),
            Ok(()) if opaque => self.peer_turns_opaque(Vec::new())?,
            Ok(()) => {}
        }
        self.drain();
        Ok(())
    }

    /// The end finished sending: an incomplete frame goes on as it came. The peer then
    /// reads whatever follows as part of that frame, so the engine sends nothing more
    /// that way (as for a way turned opaque).
    pub fn end_finished(&mut self) {
        // Bytes being gathered are a frame's start the framing has not seen.
        let mut partial = std::mem::take(&mut self.end_start);
        partial.append(&mut self.from_end.take_partial());
        if !partial.is_empty() || self.end_passing > 0 {
            self.end_passing = 0;
            self.end_opaque = true;
        }
        self.to_peer
            .reserve(partial.len())
            .extend_from_slice(&partial);
        self.drain();
    }

    /// The peer finished sending: an incomplete SMB frame goes on as it came, and the
    /// engine sends nothing more to the end; an incomplete engine record is an error.
    pub fn peer_finished(&mut self) -> Result<(), SpliceError> {
        let mut partial = std::mem::take(&mut self.peer_start);
        partial.append(&mut self.from_peer.take_partial());
        if partial.first().is_some_and(|&kind| kind != 0) {
            return Err(SpliceError::CutRecord);
        }
        if !partial.is_empty() || self.passing > 0 {
            self.passing = 0;
            self.peer_opaque = true;
        }
        self.to_end
            .reserve(partial.len())
            .extend_from_slice(&partial);
        self.drain();
        Ok(())
    }

    fn end_turns_opaque(&mut self, rest: Vec<u8>) -> Result<(), SpliceError> {
        if let Half::Far(far) = &mut self.half
            && !far.pass_through()
        {
            return Err(SpliceError::Unframed("server"));
        }
        self.drain();
        self.end_opaque = true;
        let out = self.to_peer.reserve(FRAME_HEADER_LEN + rest.len());
        out.extend_from_slice(&[OPAQUE, 0, 0, 0]);
        out.extend_from_slice(&rest);
        Ok(())
    }

    fn peer_turns_opaque(&mut self, rest: Vec<u8>) -> Result<(), SpliceError> {
        if let Half::Far(far) = &mut self.half
            && !far.pass_through()
        {
            return Err(SpliceError::Unframed("client"));
        }
        self.drain();
        self.peer_opaque = true;
        self.to_end.reserve(rest.len()).extend_from_slice(&rest);
        Ok(())
    }

    /// Moves what the engine has for either side into its outbox.
    /// Nothing goes into a way while a frame streams through it: it waits in the engine
    /// until the frame's last byte has gone.
    fn drain(&mut self) {
        let (to_end, to_peer) = (self.passing == 0, self.end_passing == 0);
        // A way turned opaque carries its end's bytes only: the engine's output for it is
        // dropped (near's CONSUMED, say, after a client that stopped speaking SMB2).
        let (end_open, peer_open) = (!self.peer_opaque, !self.end_opaque);
        let mut too_long = false;
        match &mut self.half {
            Half::Near(near) => {
                while to_end && let Some(frame) = near.poll_to_client() {
                    if end_open {
                        self.to_end.frame(&frame);
                    }
                }
                while to_peer && let Some(record) = near.poll_to_far() {
                    too_long |= peer_open && !emit(&record, &mut self.to_peer);
                }
            }
            Half::Far(far) => {
                while to_end && let Some(frame) = far.poll_to_server() {
                    if end_open {
                        self.to_end.frame(&frame);
                    }
                }
                while to_peer && let Some(record) = far.poll_to_near() {
                    too_long |= peer_open && !emit(&record, &mut self.to_peer);
                }
            }
        }
        if too_long {
            self.failed.get_or_insert(SpliceError::TooLong);
        }
    }

    /// Bytes to write to the end; say how many were written with [`Self::end_written`].
    pub fn to_end(&self) -> &[u8] {
        self.to_end.pending()
    }

    pub fn end_written(&mut self, n: usize) {
        self.to_end.written(n);
    }

    /// Bytes to write to the peer; say how many were written with [`Self::peer_written`].
    pub fn to_peer(&self) -> &[u8] {
        self.to_peer.pending()
    }

    pub fn peer_written(&mut self, n: usize) {
        self.to_peer.written(n);
    }

    /// Bytes the engine holds for the end that it has not handed out yet (far: client
    /// requests waiting for the server's credits): the end's close waits for them as for
    /// [`Self::to_end`], and they count against the reads that feed them.
    pub fn held_for_end(&self) -> usize {
        match &self.half {
            Half::Near(_) => 0,
            Half::Far(far) => far.held_bytes(),
        }
    }

    /// The same for the peer (near: client READs it waits to answer, which go to far if
    /// far withdraws their predictions).
    pub fn held_for_peer(&self) -> usize {
        match &self.half {
            Half::Near(near) => near.held_requests(),
            Half::Far(_) => 0,
        }
    }

    /// Bytes the splice holds: frames being read, bytes waiting to be written, and what
    /// the engine keeps (near: far's answers for its client; far: client frames waiting
    /// for credits).
    pub fn held(&self) -> usize {
        let engine = match &self.half {
            Half::Near(near) => near.held_bytes(),
            Half::Far(far) => far.held_bytes(),
        };
        engine
            + self.from_end.held()
            + self.from_peer.held()
            + self.end_start.capacity()
            + self.peer_start.capacity()
            + self.to_end.bytes.capacity()
            + self.to_peer.bytes.capacity()
    }

    /// Far's window ([`Far::set_window`]); nothing at near.
    pub fn set_window(&mut self, window: u64) {
        if let Half::Far(far) = &mut self.half {
            far.set_window(window);
            self.drain();
        }
    }

    /// The time now ([`Near::set_now`], [`Far::set_now`]): what near drops for it goes to
    /// far.
    pub fn set_now(&mut self, now: std::time::Instant) {
        match &mut self.half {
            Half::Near(near) => near.set_now(now),
            Half::Far(far) => far.set_now(now),
        }
        self.drain();
    }

    /// When near next drops an answer whose window ends ([`Near::next_expiry`]): the
    /// caller tells the splice the time then, whether bytes come or not. Never at far.
    pub fn next_deadline(&self) -> Option<std::time::Instant> {
        match &self.half {
            Half::Near(near) => near.next_expiry(),
            Half::Far(_) => None,
        }
    }

    /// Far's validity window for files other clients may write ([`Far::set_validity`]);
    /// nothing at near.
    pub fn set_validity(&mut self, ms: u32) {
        if let Half::Far(far) = &mut self.half {
            far.set_validity(ms);
        }
    }

    /// Whether far may act ahead of the client ([`Far::may_act`]); never at near.
    pub fn may_act(&self) -> bool {
        matches!(&self.half, Half::Far(far) if far.may_act())
    }

    /// Far's bytes read ahead and not consumed ([`Far::ahead_bytes`]); 0 at near.
    pub fn ahead_bytes(&self) -> u64 {
        match &self.half {
            Half::Far(far) => far.ahead_bytes(),
            Half::Near(_) => 0,
        }
    }

    pub fn stats(&self) -> EngineStats {
        match &self.half {
            Half::Near(near) => near.stats(),
            Half::Far(far) => far.stats(),
        }
    }
}

/// Appends `record`, framed, to `out`; `false` if it is longer than a record may be (an
/// SMB frame from far cannot be; a server's answer to a claimed prediction that says more
/// than was asked could).
fn emit(record: &Record, out: &mut Outbox) -> bool {
    let len = match record {
        Record::Smb(p) | Record::Prefetched { answer: p, .. } => p.len() + 16,
        _ => 64,
    };
    let bytes = out.reserve(FRAME_HEADER_LEN + len);
    record.emit(bytes).is_ok()
}
