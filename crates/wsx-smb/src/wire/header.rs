//! The SMB2 message header (MS-SMB2 2.2.1: 2.2.1.1 async, 2.2.1.2 sync): 64 bytes,
//! little-endian, at the start of every message and of every message compounded after the
//! first ([`Header::next_command`] is the offset of the next one from this one).
//!
//! A frame may instead start with another protocol's identifier ([`Protocol`]): SMB1 (the
//! multi-protocol NEGOTIATE older clients open with), the SMB3 transform header of an
//! encrypted message, or the SMB 3.1.1 compression transform header.

use super::{le16, le32, le64};

/// Bytes in an SMB2 header.
pub const HEADER_LEN: usize = 64;

/// What the first four bytes of a frame say it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `FE 'S' 'M' 'B'`: an SMB2/3 message.
    Smb2,
    /// `FF 'S' 'M' 'B'`: SMB1.
    Smb1,
    /// `FD 'S' 'M' 'B'`: an encrypted message (transform header, MS-SMB2 2.2.41).
    Encrypted,
    /// `FC 'S' 'M' 'B'`: a compressed message (MS-SMB2 2.2.42).
    Compressed,
}

impl Protocol {
    /// The protocol a frame starting with `frame` holds, if any of these.
    pub fn of(frame: &[u8]) -> Option<Self> {
        match frame.get(..4)? {
            [0xfe, b'S', b'M', b'B'] => Some(Self::Smb2),
            [0xff, b'S', b'M', b'B'] => Some(Self::Smb1),
            [0xfd, b'S', b'M', b'B'] => Some(Self::Encrypted),
            [0xfc, b'S', b'M', b'B'] => Some(Self::Compressed),
            _ => None,
        }
    }
}

/// The commands (MS-SMB2 2.2.1.2, `Command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Command(pub u16);

impl Command {
    pub const NEGOTIATE: Self = Self(0x00);
    pub const SESSION_SETUP: Self = Self(0x01);
    pub const LOGOFF: Self = Self(0x02);
    pub const TREE_CONNECT: Self = Self(0x03);
    pub const TREE_DISCONNECT: Self = Self(0x04);
    pub const CREATE: Self = Self(0x05);
    pub const CLOSE: Self = Self(0x06);
    pub const FLUSH: Self = Self(0x07);
    pub const READ: Self = Self(0x08);
    pub const WRITE: Self = Self(0x09);
    pub const LOCK: Self = Self(0x0a);
    pub const IOCTL: Self = Self(0x0b);
    pub const CANCEL: Self = Self(0x0c);
    pub const ECHO: Self = Self(0x0d);
    pub const QUERY_DIRECTORY: Self = Self(0x0e);
    pub const CHANGE_NOTIFY: Self = Self(0x0f);
    pub const QUERY_INFO: Self = Self(0x10);
    pub const SET_INFO: Self = Self(0x11);
    pub const OPLOCK_BREAK: Self = Self(0x12);
}

/// Header flags (MS-SMB2 2.2.1.2, `Flags`).
pub mod flags {
    /// The message is a response.
    pub const SERVER_TO_REDIR: u32 = 0x0000_0001;
    /// The header is the async form: `AsyncId` instead of `TreeId`.
    pub const ASYNC_COMMAND: u32 = 0x0000_0002;
    /// A compounded request related to the previous one.
    pub const RELATED_OPERATIONS: u32 = 0x0000_0004;
    /// The message is signed.
    pub const SIGNED: u32 = 0x0000_0008;
    /// A replayed operation (3.x).
    pub const REPLAY_OPERATION: u32 = 0x2000_0000;
}

/// NT status codes the observer and the engine read (MS-ERREF 2.3).
pub mod status {
    pub const SUCCESS: u32 = 0x0000_0000;
    /// An async response follows (interim response).
    pub const PENDING: u32 = 0x0000_0103;
    /// A multi-leg SESSION_SETUP continues.
    pub const MORE_PROCESSING_REQUIRED: u32 = 0xc000_0016;
}

/// An SMB2 header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub credit_charge: u16,
    /// A response's status; in a 3.x request, the channel sequence and reserved bytes.
    pub status: u32,
    pub command: Command,
    /// CreditRequest in a request, CreditResponse in a response.
    pub credits: u16,
    pub flags: u32,
    /// Offset from this header to the next compounded one; 0 for the last.
    pub next_command: u32,
    pub message_id: u64,
    /// `TreeId` (sync) or `AsyncId` (async), as [`Header::is_async`] says.
    pub tree_or_async: TreeOrAsync,
    pub session_id: u64,
    pub signature: [u8; 16],
}

/// The header's identifier of the share, or of the pending operation in an async header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeOrAsync {
    Tree { reserved: u32, tree_id: u32 },
    Async(u64),
}

/// Why a header could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than 64 bytes.
    #[error("truncated SMB2 header")]
    Truncated,
    /// Not `FE 'S' 'M' 'B'`.
    #[error("not an SMB2 header")]
    NotSmb2,
    /// `StructureSize` is not 64.
    #[error("SMB2 header structure size {0}, not 64")]
    StructureSize(u16),
    /// `NextCommand` neither 0 nor a multiple of 8 past this header.
    #[error("SMB2 NextCommand {0} does not point past its header")]
    NextCommand(u32),
}

impl Header {
    /// Parses the header at the start of `message`.
    pub fn parse(message: &[u8]) -> Result<Self, HeaderError> {
        let b = message.get(..HEADER_LEN).ok_or(HeaderError::Truncated)?;
        if Protocol::of(b) != Some(Protocol::Smb2) {
            return Err(HeaderError::NotSmb2);
        }
        let size = le16(b, 4);
        if usize::from(size) != HEADER_LEN {
            return Err(HeaderError::StructureSize(size));
        }
        let flags = le32(b, 16);
        let tree_or_async = if flags & flags::ASYNC_COMMAND != 0 {
            TreeOrAsync::Async(le64(b, 32))
        } else {
            TreeOrAsync::Tree {
                reserved: le32(b, 32),
                tree_id: le32(b, 36),
            }
        };
        let mut signature = [0; 16];
        signature.copy_from_slice(&b[48..64]);
        Ok(Self {
            credit_charge: le16(b, 6),
            status: le32(b, 8),
            command: Command(le16(b, 12)),
            credits: le16(b, 14),
            flags,
            next_command: le32(b, 20),
            message_id: le64(b, 24),
            tree_or_async,
            session_id: le64(b, 40),
            signature,
        })
    }

    /// Writes the header into the first 64 bytes of `out`; `None` if `out` is shorter.
    /// The async flag is set from [`Header::tree_or_async`].
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..HEADER_LEN)?;
        b[..4].copy_from_slice(&[0xfe, b'S', b'M', b'B']);
        b[4..6].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[6..8].copy_from_slice(&self.credit_charge.to_le_bytes());
        b[8..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..14].copy_from_slice(&self.command.0.to_le_bytes());
        b[14..16].copy_from_slice(&self.credits.to_le_bytes());
        let flags = match self.tree_or_async {
            TreeOrAsync::Async(id) => {
                b[32..40].copy_from_slice(&id.to_le_bytes());
                self.flags | flags::ASYNC_COMMAND
            }
            TreeOrAsync::Tree { reserved, tree_id } => {
                b[32..36].copy_from_slice(&reserved.to_le_bytes());
                b[36..40].copy_from_slice(&tree_id.to_le_bytes());
                self.flags & !flags::ASYNC_COMMAND
            }
        };
        b[16..20].copy_from_slice(&flags.to_le_bytes());
        b[20..24].copy_from_slice(&self.next_command.to_le_bytes());
        b[24..32].copy_from_slice(&self.message_id.to_le_bytes());
        b[40..48].copy_from_slice(&self.session_id.to_le_bytes());
        b[48..64].copy_from_slice(&self.signature);
        Some(())
    }

    pub fn is_response(&self) -> bool {
        self.flags & flags::SERVER_TO_REDIR != 0
    }

    pub fn is_async(&self) -> bool {
        matches!(self.tree_or_async, TreeOrAsync::Async(_))
    }

    pub fn is_signed(&self) -> bool {
        self.flags & flags::SIGNED != 0
    }
}

/// The messages of one frame: each header with the bytes of its message (up to the next
/// compounded header, or to the end of what the caller holds of the frame).
///
/// Iteration stops at the first header that does not parse, or whose `NextCommand` does not
/// move forward by at least a header inside the bytes held (a hostile offset can neither loop
/// nor reach outside); [`Messages::error`] then says why, unless the chain simply continues
/// beyond the bytes held ([`Messages::continues_beyond`]).
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    frame: &'a [u8],
    at: Option<usize>,
    error: Option<HeaderError>,
    beyond: bool,
}

impl<'a> Messages<'a> {
    /// The messages of `frame`, which holds the frame's first bytes (perhaps all of them).
    pub fn new(frame: &'a [u8]) -> Self {
        Self {
            frame,
            at: Some(0),
            error: None,
            beyond: false,
        }
    }

    /// Why iteration stopped early, if it did for a malformed header.
    pub fn error(&self) -> Option<HeaderError> {
        self.error
    }

    /// Whether the chain went on past the bytes held: a frame's next message, or the rest of
    /// the last one, lies beyond them. For a whole frame that is malformed.
    pub fn continues_beyond(&self) -> bool {
        self.beyond
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = (Header, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let at = self.at.take()?;
        let rest = &self.frame[at..];
        if at > 0 && rest.len() < HEADER_LEN {
            // The chain continues past the bytes held.
            self.beyond = true;
            return None;
        }
        let header = match Header::parse(rest) {
            Ok(h) => h,
            Err(e) => {
                self.error = Some(e);
                return None;
            }
        };
        let next = header.next_command as usize;
        let message = if next == 0 {
            rest
        } else if next >= HEADER_LEN && next % 8 == 0 {
            if next < rest.len() {
                self.at = Some(at + next);
            } else {
                self.beyond = true;
            }
            &rest[..next.min(rest.len())]
        } else {
            self.error = Some(HeaderError::NextCommand(header.next_command));
            rest
        };
        Some((header, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        (
            any::<(u16, u32, u16, u16, u32, u32, u64)>(),
            prop_oneof![
                any::<(u32, u32)>()
                    .prop_map(|(reserved, tree_id)| TreeOrAsync::Tree { reserved, tree_id }),
                any::<u64>().prop_map(TreeOrAsync::Async),
            ],
            any::<(u64, [u8; 16])>(),
        )
            .prop_map(
                |(
                    (credit_charge, status, command, credits, flags, next_command, message_id),
                    tree_or_async,
                    (session_id, signature),
                )| {
                    let flags = match tree_or_async {
                        TreeOrAsync::Async(_) => flags | flags::ASYNC_COMMAND,
                        TreeOrAsync::Tree { .. } => flags & !flags::ASYNC_COMMAND,
                    };
                    Header {
                        credit_charge,
                        status,
                        command: Command(command),
                        credits,
                        flags,
                        next_command,
                        message_id,
                        tree_or_async,
                        session_id,
                        signature,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn headers_round_trip(h in header()) {
            let mut b = [0; HEADER_LEN];
            h.emit(&mut b).unwrap();
            prop_assert_eq!(Header::parse(&b), Ok(h));
        }

        #[test]
        fn any_bytes_parse_or_fail_cleanly(b in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Header::parse(&b);
            let mut n = 0;
            for (_, message) in Messages::new(&b) {
                prop_assert!(message.len() >= HEADER_LEN);
                n += 1;
            }
            prop_assert!(n <= b.len() / HEADER_LEN);
        }
    }

    fn message(command: Command, next: u32, body: usize) -> Vec<u8> {
        let h = Header {
            credit_charge: 1,
            status: 0,
            command,
            credits: 1,
            flags: 0,
            next_command: next,
            message_id: 7,
            tree_or_async: TreeOrAsync::Tree {
                reserved: 0,
                tree_id: 1,
            },
            session_id: 9,
            signature: [0; 16],
        };
        let mut b = vec![0; HEADER_LEN + body];
        h.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn a_compound_is_walked_by_next_command() {
        let mut frame = message(Command::CREATE, 128, 64);
        frame.extend(message(Command::QUERY_INFO, 0, 40));
        let got: Vec<_> = Messages::new(&frame)
            .map(|(h, m)| (h.command, m.len()))
            .collect();
        assert_eq!(
            got,
            vec![(Command::CREATE, 128), (Command::QUERY_INFO, 104)]
        );
    }

    #[test]
    fn a_chain_beyond_the_bytes_held_ends_quietly_and_a_bad_offset_is_an_error() {
        let frame = message(Command::CREATE, 4096, 64);
        let mut m = Messages::new(&frame);
        assert_eq!(m.next().map(|(h, _)| h.command), Some(Command::CREATE));
        assert!(m.next().is_none());
        assert_eq!(m.error(), None);

        // NextCommand pointing inside its own header.
        let frame = message(Command::CREATE, 8, 64);
        let mut m = Messages::new(&frame);
        assert!(m.next().is_some());
        assert!(m.next().is_none());
        assert_eq!(m.error(), Some(HeaderError::NextCommand(8)));
    }

    #[test]
    fn other_protocols_are_named() {
        assert_eq!(Protocol::of(b"\xfdSMB...."), Some(Protocol::Encrypted));
        assert_eq!(Protocol::of(b"\xfcSMB"), Some(Protocol::Compressed));
        assert_eq!(Protocol::of(b"\xffSMBr"), Some(Protocol::Smb1));
        assert_eq!(Protocol::of(b"\xfeSM"), None);
        assert_eq!(Header::parse(b"\xffSMB"), Err(HeaderError::Truncated));
    }
}
