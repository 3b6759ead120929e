//! The observer: reads both directions of one TCP 445 connection and says whether its SMB
//! traffic is of the kind the read-ahead engine may touch.
//!
//! The engine may only ever act on SMB2/3 sessions that are neither signed nor encrypted: a
//! signature covers the MessageId and the credits, so a proxy that answers or issues requests
//! itself would break it, and an encrypted message cannot be read at all. Signing cannot be
//! switched off by a proxy either (never alter NEGOTIATE). So the observer watches for what
//! rules a connection out, and a connection it rules out stays out for good:
//!
//! ```text
//!  Negotiating ──a session set up, then a share connected, nothing signed──> Unsigned
//!      │                                                                       │
//!      └───────────────────────── any of these ───────────────────────────────┴──> PassThrough(reason)
//!        not Direct TCP framing · SMB1 answered or used after NEGOTIATE · a dialect other
//!        than 2.0.2-3.1.1 · a signed message other than SESSION_SETUP · an encrypted or
//!        compressed message · a session or share that requires encryption · a header
//!        that does not parse
//! ```
//!
//! SESSION_SETUP is exempt from the signing rule because SMB 3.1.1 signs the last leg of
//! every authenticated session's setup even when signing is not required; it is whether the
//! session's later messages are signed that matters. The verdict waits for the first share
//! connected (a TREE_CONNECT answered with success) because that is where what follows the
//! setup shows: smbclient signs its TREE_CONNECT in any session with a key, 3.1.1 requires it
//! signed, a client that wants encryption sends it encrypted, and a share that requires
//! encryption says so in the answer. Files are only reached through a share, so nothing the
//! engine could act on comes earlier. A connection is judged as a whole: one signed session
//! on it passes the whole connection through.
//!
//! The observer reads only the first [`KEEP`] bytes of each frame (headers and fixed-size
//! bodies; compound chains within them) and skips payloads without touching them, so it
//! costs little beside the relay's copy. Once a connection passes through, it reads nothing.

use crate::wire::framing::{Deframer, FrameStart};
use crate::wire::header::{Command, Header, Messages, Protocol, status};
use crate::wire::messages::{
    Dialect, NegotiateResponse, ReadRequest, SessionSetupResponse, TreeConnectResponse,
};

/// Bytes of each frame the observer reads: headers, fixed bodies, compound chains of small
/// requests (a CREATE with its name and contexts, then a QUERY_INFO).
pub const KEEP: usize = 1024;

/// What the observer has concluded about a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No share is connected yet.
    Negotiating,
    /// A session is set up and a share connected, and nothing seen so far is signed or
    /// encrypted.
    Unsigned,
    /// The connection passes through byte for byte, for good.
    PassThrough(Reason),
}

/// Why a connection passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The byte stream is not SMB's Direct TCP framing.
    NotFramed,
    /// SMB1 is in use.
    Smb1,
    /// A dialect other than 2.0.2 through 3.1.1 was agreed.
    Dialect(Dialect),
    /// A message after authentication is signed.
    Signed,
    /// A message is encrypted, or the session or share requires encryption.
    Encrypted,
    /// A message is compressed (SMB 3.1.1 compression transform).
    Compressed,
    /// A frame holds something that does not parse as SMB2.
    Malformed,
}

impl Reason {
    /// Every reason's name as the counters show it, in a fixed order.
    pub const NAMES: [&'static str; 7] = [
        "not_framed",
        "smb1",
        "dialect",
        "signed",
        "encrypted",
        "compressed",
        "malformed",
    ];

    /// The reason's name as the counters show it (one of [`Reason::NAMES`]).
    pub fn name(self) -> &'static str {
        Self::NAMES[self.index()]
    }

    /// The reason's place in [`Reason::NAMES`].
    pub fn index(self) -> usize {
        match self {
            Self::NotFramed => 0,
            Self::Smb1 => 1,
            Self::Dialect(_) => 2,
            Self::Signed => 3,
            Self::Encrypted => 4,
            Self::Compressed => 5,
            Self::Malformed => 6,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFramed => f.write_str("not SMB Direct TCP framing"),
            Self::Smb1 => f.write_str("SMB1"),
            Self::Dialect(d) => write!(f, "dialect {d}"),
            Self::Signed => f.write_str("signed"),
            Self::Encrypted => f.write_str("encrypted"),
            Self::Compressed => f.write_str("compressed"),
            Self::Malformed => f.write_str("malformed SMB2"),
        }
    }
}

/// The READs of a connection the observer read (those of a connection that passed through
/// stop counting then).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// READ requests.
    pub reads: u64,
    /// The bytes they asked for.
    pub bytes: u64,
    /// READ requests sent while no other READ of the connection was in flight: each waits
    /// a whole round trip for its answer, which is what read-ahead takes away.
    pub alone: u64,
}

/// Which way bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client toward the server: requests.
    ToServer,
    /// From the server toward the client: responses.
    ToClient,
}

/// Watches one connection; see the module documentation.
#[derive(Debug, Clone)]
pub struct Observer {
    to_server: Deframer,
    to_client: Deframer,
    verdict: Verdict,
    dialect: Option<Dialect>,
    /// A SESSION_SETUP succeeded.
    session: bool,
    /// The verdict was [`Verdict::Unsigned`] at some point.
    was_unsigned: bool,
    reads: ReadStats,
    /// READ requests not answered yet (an interim answer does not count).
    reads_in_flight: u64,
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer {
    pub fn new() -> Self {
        Self {
            to_server: Deframer::new(KEEP),
            to_client: Deframer::new(KEEP),
            verdict: Verdict::Negotiating,
            dialect: None,
            session: false,
            was_unsigned: false,
            reads: ReadStats::default(),
            reads_in_flight: 0,
        }
    }

    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Whether the connection was judged [`Verdict::Unsigned`] at some point, perhaps in the
    /// same read that then passed it through (which [`Observer::feed`] reports alone).
    pub fn was_unsigned(&self) -> bool {
        self.was_unsigned
    }

    /// The READs read so far.
    pub fn reads(&self) -> ReadStats {
        self.reads
    }

    /// The dialect the last NEGOTIATE response agreed, once one did.
    pub fn dialect(&self) -> Option<Dialect> {
        self.dialect
    }

    /// Reads the next bytes travelling `direction`; returns the new verdict if it changed
    /// (the last one, if one read changed it twice).
    pub fn feed(&mut self, direction: Direction, data: &[u8]) -> Option<Verdict> {
        if let Verdict::PassThrough(_) = self.verdict {
            return None;
        }
        let before = self.verdict;
        let mut judged = Judged {
            verdict: self.verdict,
            dialect: &mut self.dialect,
            session: &mut self.session,
            was_unsigned: &mut self.was_unsigned,
            reads: &mut self.reads,
            reads_in_flight: &mut self.reads_in_flight,
            direction,
        };
        let deframer = match direction {
            Direction::ToServer => &mut self.to_server,
            Direction::ToClient => &mut self.to_client,
        };
        let result = deframer.feed(data, |frame| judged.frame(frame));
        self.verdict = match (result, judged.verdict) {
            // A reason found earlier in the same read stands.
            (_, Verdict::PassThrough(reason)) => Verdict::PassThrough(reason),
            (Err(_), _) => Verdict::PassThrough(Reason::NotFramed),
            (Ok(()), verdict) => verdict,
        };
        (self.verdict != before).then_some(self.verdict)
    }
}

/// One feed's judgement of the frames it completes.
struct Judged<'a> {
    verdict: Verdict,
    dialect: &'a mut Option<Dialect>,
    session: &'a mut bool,
    was_unsigned: &'a mut bool,
    reads: &'a mut ReadStats,
    reads_in_flight: &'a mut u64,
    direction: Direction,
}

impl Judged<'_> {
    /// Counts a READ request; `read` is its body, unless it was cut where the bytes held
    /// end (it is counted all the same, since its answer will be: only its bytes are not).
    fn read_asked(&mut self, read: Option<&ReadRequest>) {
        self.reads.reads += 1;
        self.reads.bytes += read.map_or(0, |r| u64::from(r.length));
        if *self.reads_in_flight == 0 {
            self.reads.alone += 1;
        }
        *self.reads_in_flight += 1;
    }

    /// A READ answered: an error ends it as well as data does; an interim STATUS_PENDING
    /// does not.
    fn read_answered(&mut self, header: &Header) {
        if header.status != status::PENDING {
            *self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
        }
    }

    fn frame(&mut self, frame: FrameStart<'_>) {
        if let Verdict::PassThrough(_) = self.verdict {
            return;
        }
        if let Err(reason) = self.judge(frame.prefix, frame.len == frame.prefix.len()) {
            self.verdict = Verdict::PassThrough(reason);
        }
    }

    /// Judges a frame from its first bytes, `frame` (`whole`: all of it).
    fn judge(&mut self, frame: &[u8], whole: bool) -> Result<(), Reason> {
        match Protocol::of(frame) {
            Some(Protocol::Smb2) => {}
            // Older clients open with an SMB1 multi-protocol NEGOTIATE; the server answers it
            // in SMB2 when it speaks SMB2.
            Some(Protocol::Smb1)
                if self.direction == Direction::ToServer && self.dialect.is_none() =>
            {
                return Ok(());
            }
            Some(Protocol::Smb1) => return Err(Reason::Smb1),
            Some(Protocol::Encrypted) => return Err(Reason::Encrypted),
            Some(Protocol::Compressed) => return Err(Reason::Compressed),
            None => return Err(Reason::Malformed),
        }
        let mut messages = Messages::new(frame);
        for (header, message) in messages.by_ref() {
            // The last message held may be cut where the bytes held end.
            let cut = !whole && std::ptr::eq(message.as_ptr_range().end, frame.as_ptr_range().end);
            self.message(&header, &message[crate::wire::header::HEADER_LEN..], cut)?;
        }
        match messages.error() {
            Some(_) => Err(Reason::Malformed),
            // A whole frame whose chain points past its end.
            None if whole && messages.continues_beyond() => Err(Reason::Malformed),
            None => Ok(()),
        }
    }

    /// Judges one message; `cut`: its body may be cut short (it is not judged then, if it
    /// does not parse).
    fn message(&mut self, header: &Header, body: &[u8], cut: bool) -> Result<(), Reason> {
        let unreadable = || if cut { Ok(()) } else { Err(Reason::Malformed) };
        if header.is_response() != (self.direction == Direction::ToClient) {
            return Err(Reason::Malformed);
        }
        if header.is_signed() && header.command != Command::SESSION_SETUP {
            return Err(Reason::Signed);
        }
        if header.command == Command::READ {
            if header.is_response() {
                self.read_answered(header);
            } else {
                match ReadRequest::parse(body) {
                    Ok(read) => self.read_asked(Some(&read)),
                    Err(_) if cut => self.read_asked(None),
                    Err(_) => return Err(Reason::Malformed),
                }
            }
        }
        // Only successful responses say anything more; an async interim response
        // (STATUS_PENDING) has an error body, and the final one follows.
        if !header.is_response() || header.status != status::SUCCESS {
            return Ok(());
        }
        match header.command {
            Command::NEGOTIATE => {
                let Ok(negotiate) = NegotiateResponse::parse(body) else {
                    return unreadable();
                };
                let dialect = negotiate.dialect;
                *self.dialect = Some(dialect);
                if !dialect.is_known() && dialect != Dialect::WILDCARD {
                    return Err(Reason::Dialect(dialect));
                }
            }
            Command::SESSION_SETUP => {
                let Ok(setup) = SessionSetupResponse::parse(body) else {
                    return unreadable();
                };
                if setup.encrypts() {
                    return Err(Reason::Encrypted);
                }
                if !self.dialect.is_some_and(Dialect::is_known) {
                    // A session before any dialect was agreed.
                    return Err(Reason::Malformed);
                }
                *self.session = true;
            }
            Command::TREE_CONNECT => {
                let Ok(tree) = TreeConnectResponse::parse(body) else {
                    return unreadable();
                };
                if tree.encrypts() {
                    return Err(Reason::Encrypted);
                }
                if !*self.session {
                    // A share before any session was set up.
                    return Err(Reason::Malformed);
                }
                self.verdict = Verdict::Unsigned;
                *self.was_unsigned = true;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::framing::frame_header;
    use crate::wire::header::{HEADER_LEN, TreeOrAsync, flags};

    /// A frame holding one message: a header with `command`, `flags` and `status`, and
    /// `body`.
    fn frame(command: Command, flags: u32, status: u32, body: &[u8]) -> Vec<u8> {
        let header = Header {
            credit_charge: 1,
            status,
            command,
            credits: 1,
            flags,
            next_command: 0,
            message_id: 1,
            tree_or_async: TreeOrAsync::Tree {
                reserved: 0,
                tree_id: 0,
            },
            session_id: 5,
            signature: [0; 16],
        };
        let mut message = vec![0; HEADER_LEN];
        header.emit(&mut message).unwrap();
        message.extend_from_slice(body);
        let mut out = frame_header(message.len()).unwrap().to_vec();
        out.extend(message);
        out
    }

    fn negotiate_response(dialect: Dialect) -> Vec<u8> {
        let mut body = vec![0; 64];
        body[0] = 65;
        body[4..6].copy_from_slice(&dialect.0.to_le_bytes());
        frame(
            Command::NEGOTIATE,
            flags::SERVER_TO_REDIR,
            status::SUCCESS,
            &body,
        )
    }

    fn session_setup_response(session_flags: u16) -> Vec<u8> {
        let mut body = vec![0; 8];
        body[0] = 9;
        body[2..4].copy_from_slice(&session_flags.to_le_bytes());
        frame(
            Command::SESSION_SETUP,
            flags::SERVER_TO_REDIR,
            status::SUCCESS,
            &body,
        )
    }

    fn tree_connect_response(share_flags: u32) -> Vec<u8> {
        let mut body = vec![0; 16];
        body[0] = 16;
        body[4..8].copy_from_slice(&share_flags.to_le_bytes());
        frame(
            Command::TREE_CONNECT,
            flags::SERVER_TO_REDIR,
            status::SUCCESS,
            &body,
        )
    }

    fn request(command: Command, flags: u32) -> Vec<u8> {
        frame(command, flags, 0, &[0; 8])
    }

    /// An observer that saw a session set up in `dialect`, not yet a share.
    fn set_up(dialect: Dialect) -> Observer {
        let mut o = Observer::new();
        assert_eq!(
            o.feed(Direction::ToServer, &request(Command::NEGOTIATE, 0)),
            None
        );
        assert_eq!(
            o.feed(Direction::ToClient, &negotiate_response(dialect)),
            None
        );
        assert_eq!(
            o.feed(Direction::ToClient, &session_setup_response(0)),
            None
        );
        assert_eq!(o.dialect(), Some(dialect));
        o
    }

    /// An observer that saw a session set up in `dialect` and a share connected.
    fn established(dialect: Dialect) -> Observer {
        let mut o = set_up(dialect);
        assert_eq!(
            o.feed(Direction::ToClient, &tree_connect_response(0)),
            Some(Verdict::Unsigned)
        );
        o
    }

    #[test]
    fn an_smb1_negotiate_answered_in_smb2_is_no_reason_to_pass_through() {
        let mut o = Observer::new();
        let mut smb1 = frame_header(40).unwrap().to_vec();
        smb1.extend(b"\xffSMBr");
        smb1.resize(44, 0);
        assert_eq!(o.feed(Direction::ToServer, &smb1), None);
        assert_eq!(
            o.feed(Direction::ToClient, &negotiate_response(Dialect::WILDCARD)),
            None
        );
        assert_eq!(
            o.feed(Direction::ToClient, &negotiate_response(Dialect::SMB_2_1)),
            None
        );
        assert_eq!(
            o.feed(Direction::ToClient, &session_setup_response(0)),
            None
        );
        assert_eq!(
            o.feed(Direction::ToClient, &tree_connect_response(0)),
            Some(Verdict::Unsigned)
        );
        // SMB1 once a dialect is agreed is SMB1 in use.
        assert_eq!(
            o.feed(Direction::ToServer, &smb1),
            Some(Verdict::PassThrough(Reason::Smb1))
        );
    }

    #[test]
    fn every_reason_to_pass_through_is_found() {
        let cases: Vec<(Observer, Direction, Vec<u8>, Reason)> = vec![
            (
                Observer::new(),
                Direction::ToServer,
                vec![0x81, 0, 0, 0],
                Reason::NotFramed,
            ),
            (
                Observer::new(),
                Direction::ToClient,
                negotiate_response(Dialect(0x0222)),
                Reason::Dialect(Dialect(0x0222)),
            ),
            (
                // smbclient's TREE_CONNECT in a session with a key.
                set_up(Dialect::SMB_2_1),
                Direction::ToServer,
                request(Command::TREE_CONNECT, flags::SIGNED),
                Reason::Signed,
            ),
            (
                established(Dialect::SMB_2_1),
                Direction::ToServer,
                request(Command::READ, flags::SIGNED),
                Reason::Signed,
            ),
            (
                Observer::new(),
                Direction::ToClient,
                session_setup_response(0x0004),
                Reason::Encrypted,
            ),
            (
                set_up(Dialect::SMB_3_0),
                Direction::ToClient,
                tree_connect_response(0x8000),
                Reason::Encrypted,
            ),
            (
                established(Dialect::SMB_3_1_1),
                Direction::ToClient,
                [&frame_header(60).unwrap()[..], b"\xfdSMB", &[0; 56]].concat(),
                Reason::Encrypted,
            ),
            (
                established(Dialect::SMB_3_1_1),
                Direction::ToServer,
                [&frame_header(60).unwrap()[..], b"\xfcSMB", &[0; 56]].concat(),
                Reason::Compressed,
            ),
            (
                established(Dialect::SMB_2_1),
                Direction::ToServer,
                [&frame_header(8).unwrap()[..], b"HTTP/1.1"].concat(),
                Reason::Malformed,
            ),
            (
                // A response travelling toward the server.
                established(Dialect::SMB_2_1),
                Direction::ToServer,
                session_setup_response(0),
                Reason::Malformed,
            ),
            (
                // A session before any dialect.
                Observer::new(),
                Direction::ToClient,
                session_setup_response(0),
                Reason::Malformed,
            ),
            (
                // A share before any session.
                Observer::new(),
                Direction::ToClient,
                tree_connect_response(0),
                Reason::Malformed,
            ),
        ];
        for (mut o, direction, bytes, reason) in cases {
            assert_eq!(
                o.feed(direction, &bytes),
                Some(Verdict::PassThrough(reason)),
                "{reason}"
            );
            // For good: nothing more is read.
            assert_eq!(
                o.feed(Direction::ToClient, &session_setup_response(0)),
                None
            );
            assert_eq!(o.verdict(), Verdict::PassThrough(reason));
        }
    }

    #[test]
    fn one_read_that_connects_a_share_and_then_passes_through_is_both() {
        let mut o = set_up(Dialect::SMB_2_1);
        let mut both = tree_connect_response(0);
        both.extend([0, 0, 0, 4, 0xff, b'S', b'M', b'B']);
        assert!(!o.was_unsigned());
        assert_eq!(
            o.feed(Direction::ToClient, &both),
            Some(Verdict::PassThrough(Reason::Smb1))
        );
        assert!(o.was_unsigned());
    }

    #[test]
    fn a_signed_final_session_setup_is_not_a_signed_session() {
        let mut o = Observer::new();
        o.feed(Direction::ToClient, &negotiate_response(Dialect::SMB_3_1_1));
        let mut signed = session_setup_response(0);
        // The flags field of the header, after the 4-byte framing.
        signed[4 + 16] |= flags::SIGNED as u8;
        assert_eq!(o.feed(Direction::ToClient, &signed), None);
        assert_eq!(
            o.feed(Direction::ToClient, &tree_connect_response(0)),
            Some(Verdict::Unsigned)
        );
        assert_eq!(
            o.feed(Direction::ToServer, &request(Command::QUERY_INFO, 0)),
            None
        );
    }

    proptest::proptest! {
        /// Any bytes either way, in any reads: no panic, and a connection that passed
        /// through never comes back.
        #[test]
        fn any_bytes_are_judged_without_panic_and_pass_through_is_for_good(
            reads in proptest::collection::vec(
                (proptest::bool::ANY, proptest::collection::vec(proptest::num::u8::ANY, 0..200)),
                0..20,
            ),
        ) {
            let mut o = established(Dialect::SMB_2_1);
            let mut passed = None;
            for (to_server, bytes) in reads {
                let direction = if to_server { Direction::ToServer } else { Direction::ToClient };
                o.feed(direction, &bytes);
                if let Some(v) = passed {
                    proptest::prop_assert_eq!(o.verdict(), v);
                } else if let Verdict::PassThrough(_) = o.verdict() {
                    passed = Some(o.verdict());
                }
            }
        }
    }

    #[test]
    fn reads_are_counted_and_those_sent_alone_told_apart() {
        let mut o = established(Dialect::SMB_2_1);
        let read = |length: u32| {
            let mut body = [0; ReadRequest::LEN];
            ReadRequest {
                padding: 0x50,
                flags: 0,
                length,
                offset: 0,
                file_id: crate::wire::messages::FileId {
                    persistent: 1,
                    volatile: 2,
                },
                minimum_count: 0,
                channel: 0,
                remaining_bytes: 0,
                channel_info_offset: 0,
                channel_info_length: 0,
            }
            .emit(&mut body)
            .unwrap();
            frame(Command::READ, 0, 0, &body)
        };
        let answer = |status| frame(Command::READ, flags::SERVER_TO_REDIR, status, &[0; 16]);
        // One at a time: each alone.
        for _ in 0..3 {
            o.feed(Direction::ToServer, &read(65536));
            o.feed(Direction::ToClient, &answer(status::PENDING));
            o.feed(Direction::ToClient, &answer(status::SUCCESS));
        }
        // Two outstanding: the second is not alone; an error answer ends one too.
        o.feed(Direction::ToServer, &read(1000));
        o.feed(Direction::ToServer, &read(1000));
        o.feed(Direction::ToClient, &answer(0xc000_0011));
        o.feed(Direction::ToClient, &answer(status::SUCCESS));
        o.feed(Direction::ToServer, &read(1));
        assert_eq!(
            o.reads(),
            ReadStats {
                reads: 6,
                bytes: 3 * 65536 + 2001,
                alone: 5
            }
        );
        assert_eq!(o.verdict(), Verdict::Unsigned);
    }

    #[test]
    fn a_message_cut_where_the_bytes_held_end_is_not_malformed() {
        // A compound: a CREATE whose NextCommand puts a READ request 952 bytes in, so that
        // the READ's body runs past the KEEP bytes the observer holds of the frame.
        let head = |command, next: u32| {
            let mut b = [0; HEADER_LEN];
            Header {
                credit_charge: 1,
                status: 0,
                command,
                credits: 1,
                flags: 0,
                next_command: next,
                message_id: 3,
                tree_or_async: TreeOrAsync::Tree {
                    reserved: 0,
                    tree_id: 1,
                },
                session_id: 5,
                signature: [0; 16],
            }
            .emit(&mut b)
            .unwrap();
            b
        };
        let mut message = head(Command::CREATE, 952).to_vec();
        message.resize(952, 0);
        message.extend(head(Command::READ, 0));
        message.extend([49, 0]);
        message.resize(952 + HEADER_LEN + ReadRequest::LEN, 0);
        let mut frame = frame_header(message.len()).unwrap().to_vec();
        frame.extend(&message);
        let mut o = established(Dialect::SMB_2_1);
        assert_eq!(o.feed(Direction::ToServer, &frame), None);
        assert_eq!(
            o.reads(),
            ReadStats {
                reads: 1,
                bytes: 0,
                alone: 1
            },
            "a READ cut short is counted, its bytes unknown"
        );
        // The same READ, whole but short, is malformed.
        let mut o = established(Dialect::SMB_2_1);
        let short = [
            &frame_header(HEADER_LEN + 8).unwrap()[..],
            &head(Command::READ, 0),
            &[49, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
        assert_eq!(
            o.feed(Direction::ToServer, &short),
            Some(Verdict::PassThrough(Reason::Malformed))
        );
    }

    #[test]
    fn a_whole_frame_whose_chain_points_past_its_end_is_malformed() {
        let mut frame = request(Command::CREATE, 0);
        // NextCommand (at 20 in the header, after the 4-byte framing) past the frame's end.
        frame[4 + 20..4 + 24].copy_from_slice(&128u32.to_le_bytes());
        let mut o = established(Dialect::SMB_2_1);
        assert_eq!(
            o.feed(Direction::ToServer, &frame),
            Some(Verdict::PassThrough(Reason::Malformed))
        );
    }

    #[test]
    fn the_first_reason_found_in_a_read_stands() {
        let mut o = established(Dialect::SMB_2_1);
        let mut bytes = request(Command::READ, flags::SIGNED);
        bytes.extend([0x81, 0, 0, 0]);
        assert_eq!(
            o.feed(Direction::ToServer, &bytes),
            Some(Verdict::PassThrough(Reason::Signed))
        );
    }

    #[test]
    fn every_reason_has_its_own_name() {
        let reasons = [
            Reason::NotFramed,
            Reason::Smb1,
            Reason::Dialect(Dialect(1)),
            Reason::Signed,
            Reason::Encrypted,
            Reason::Compressed,
            Reason::Malformed,
        ];
        for (i, r) in reasons.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert_eq!(r.name(), Reason::NAMES[i]);
        }
    }
}
