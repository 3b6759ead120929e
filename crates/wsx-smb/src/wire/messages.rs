//! The bodies of the messages the observer reads: what a NEGOTIATE response agrees, what a
//! SESSION_SETUP response grants, what a TREE_CONNECT response says of the share, what a
//! CREATE response opened (and the oplock or lease it granted), and READ requests and
//! responses. Each parses from the bytes after the header and checks its
//! `StructureSize`; the READ ones also emit, for the read-ahead engine that issues them.

use super::{le16, le32, le64};

/// A dialect (MS-SMB2 2.2.4, `DialectRevision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dialect(pub u16);

impl Dialect {
    pub const SMB_2_0_2: Self = Self(0x0202);
    pub const SMB_2_1: Self = Self(0x0210);
    pub const SMB_3_0: Self = Self(0x0300);
    pub const SMB_3_0_2: Self = Self(0x0302);
    pub const SMB_3_1_1: Self = Self(0x0311);
    /// `SMB 2.???`: the answer to an SMB1 multi-protocol NEGOTIATE; an SMB2 NEGOTIATE follows.
    pub const WILDCARD: Self = Self(0x02ff);

    /// One of the dialects 2.0.2 through 3.1.1.
    pub fn is_known(self) -> bool {
        matches!(
            self,
            Self::SMB_2_0_2 | Self::SMB_2_1 | Self::SMB_3_0 | Self::SMB_3_0_2 | Self::SMB_3_1_1
        )
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::SMB_2_0_2 => f.write_str("2.0.2"),
            Self::SMB_2_1 => f.write_str("2.1"),
            Self::SMB_3_0 => f.write_str("3.0"),
            Self::SMB_3_0_2 => f.write_str("3.0.2"),
            Self::SMB_3_1_1 => f.write_str("3.1.1"),
            Self::WILDCARD => f.write_str("2.???"),
            Self(other) => write!(f, "{other:#06x}"),
        }
    }
}

/// A body too short for its structure, or with the wrong `StructureSize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("truncated {0} body")]
    Truncated(&'static str),
    #[error("{what} structure size {got}, not {want}")]
    StructureSize {
        what: &'static str,
        got: u16,
        want: u16,
    },
}

/// Checks that `body` holds `len` bytes and starts with `StructureSize` `size`.
fn checked<'a>(
    body: &'a [u8],
    what: &'static str,
    size: u16,
    len: usize,
) -> Result<&'a [u8], BodyError> {
    let b = body.get(..len).ok_or(BodyError::Truncated(what))?;
    let got = le16(b, 0);
    if got != size {
        return Err(BodyError::StructureSize {
            what,
            got,
            want: size,
        });
    }
    Ok(b)
}

/// `SecurityMode` bits (NEGOTIATE and SESSION_SETUP).
pub mod security_mode {
    pub const SIGNING_ENABLED: u16 = 0x0001;
    pub const SIGNING_REQUIRED: u16 = 0x0002;
}

/// The NEGOTIATE response's fields the observer reads (MS-SMB2 2.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateResponse {
    pub security_mode: u16,
    pub dialect: Dialect,
    pub capabilities: u32,
    pub max_read_size: u32,
}

impl NegotiateResponse {
    /// The response's structure size (the fixed part is 64 bytes, then the buffer).
    const SIZE: u16 = 65;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "NEGOTIATE response", Self::SIZE, 64)?;
        Ok(Self {
            security_mode: le16(b, 2),
            dialect: Dialect(le16(b, 4)),
            capabilities: le32(b, 24),
            max_read_size: le32(b, 32),
        })
    }

    /// The server requires every message of an authenticated session to be signed.
    pub fn signing_required(&self) -> bool {
        self.security_mode & security_mode::SIGNING_REQUIRED != 0
    }
}

/// `SessionFlags` of a SESSION_SETUP response (MS-SMB2 2.2.6).
pub mod session_flags {
    pub const IS_GUEST: u16 = 0x0001;
    pub const IS_NULL: u16 = 0x0002;
    pub const ENCRYPT_DATA: u16 = 0x0004;
}

/// The SESSION_SETUP response's flags (MS-SMB2 2.2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSetupResponse {
    pub session_flags: u16,
}

impl SessionSetupResponse {
    const SIZE: u16 = 9;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "SESSION_SETUP response", Self::SIZE, 8)?;
        Ok(Self {
            session_flags: le16(b, 2),
        })
    }

    /// The server encrypts the session's messages.
    pub fn encrypts(&self) -> bool {
        self.session_flags & session_flags::ENCRYPT_DATA != 0
    }

    /// A guest or anonymous session: there is no session key, so nothing can be signed.
    pub fn keyless(&self) -> bool {
        self.session_flags & (session_flags::IS_GUEST | session_flags::IS_NULL) != 0
    }
}

/// `ShareFlags` bits of a TREE_CONNECT response (MS-SMB2 2.2.10).
pub mod share_flags {
    pub const ENCRYPT_DATA: u32 = 0x0000_8000;
}

/// The TREE_CONNECT response's share flags (MS-SMB2 2.2.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConnectResponse {
    pub share_type: u8,
    pub share_flags: u32,
}

impl TreeConnectResponse {
    const SIZE: u16 = 16;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "TREE_CONNECT response", Self::SIZE, 16)?;
        Ok(Self {
            share_type: b[2],
            share_flags: le32(b, 4),
        })
    }

    /// The share requires its traffic encrypted.
    pub fn encrypts(&self) -> bool {
        self.share_flags & share_flags::ENCRYPT_DATA != 0
    }
}

/// A file's handle (MS-SMB2 2.2.14.1): the persistent and the volatile part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub persistent: u64,
    pub volatile: u64,
}

impl FileId {
    /// The id in the first 16 bytes of `b`; the caller has checked the length.
    pub(crate) fn parse(b: &[u8]) -> Self {
        Self {
            persistent: le64(b, 0),
            volatile: le64(b, 8),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[..8].copy_from_slice(&self.persistent.to_le_bytes());
        b[8..16].copy_from_slice(&self.volatile.to_le_bytes());
    }
}

/// A READ request (MS-SMB2 2.2.19): `length` bytes of `file_id` from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Where the client wants the data in the response, from the header's start.
    pub padding: u8,
    /// `SMB2_READFLAG_*` (3.0.2 on); reserved before.
    pub flags: u8,
    pub length: u32,
    pub offset: u64,
    pub file_id: FileId,
    pub minimum_count: u32,
    /// RDMA only; 0 over TCP.
    pub channel: u32,
    pub remaining_bytes: u32,
    pub channel_info_offset: u16,
    pub channel_info_length: u16,
}

impl ReadRequest {
    const SIZE: u16 = 49;
    /// The fixed part; `StructureSize` counts one byte of the buffer that follows.
    const FIXED: usize = 48;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "READ request", Self::SIZE, Self::FIXED)?;
        Ok(Self {
            padding: b[2],
            flags: b[3],
            length: le32(b, 4),
            offset: le64(b, 8),
            file_id: FileId::parse(&b[16..32]),
            minimum_count: le32(b, 32),
            channel: le32(b, 36),
            remaining_bytes: le32(b, 40),
            channel_info_offset: le16(b, 44),
            channel_info_length: le16(b, 46),
        })
    }

    /// Bytes [`ReadRequest::emit`] writes: the fixed part and the one buffer byte.
    pub const LEN: usize = Self::FIXED + 1;

    /// Writes the body into the first [`ReadRequest::LEN`] bytes of `out`; `None` if `out`
    /// is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..Self::LEN)?;
        b[..2].copy_from_slice(&Self::SIZE.to_le_bytes());
        b[2] = self.padding;
        b[3] = self.flags;
        b[4..8].copy_from_slice(&self.length.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        self.file_id.emit(&mut b[16..32]);
        b[32..36].copy_from_slice(&self.minimum_count.to_le_bytes());
        b[36..40].copy_from_slice(&self.channel.to_le_bytes());
        b[40..44].copy_from_slice(&self.remaining_bytes.to_le_bytes());
        b[44..46].copy_from_slice(&self.channel_info_offset.to_le_bytes());
        b[46..48].copy_from_slice(&self.channel_info_length.to_le_bytes());
        b[48] = 0;
        Some(())
    }
}

/// A READ response's fixed part (MS-SMB2 2.2.20); the data follows at `data_offset` from
/// the header's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadResponse {
    pub data_offset: u8,
    pub data_length: u32,
    pub data_remaining: u32,
    /// `Reserved2` before 3.1.1, `Flags` (RDMA transform) from it.
    pub flags: u32,
}

impl ReadResponse {
    const SIZE: u16 = 17;
    /// Bytes of the fixed part.
    pub const LEN: usize = 16;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "READ response", Self::SIZE, Self::LEN)?;
        Ok(Self {
            data_offset: b[2],
            data_length: le32(b, 4),
            data_remaining: le32(b, 8),
            flags: le32(b, 12),
        })
    }

    /// Writes the fixed part into the first [`ReadResponse::LEN`] bytes of `out`; `None` if
    /// `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..Self::LEN)?;
        b[..2].copy_from_slice(&Self::SIZE.to_le_bytes());
        b[2] = self.data_offset;
        b[3] = 0;
        b[4..8].copy_from_slice(&self.data_length.to_le_bytes());
        b[8..12].copy_from_slice(&self.data_remaining.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        Some(())
    }
}

/// `OplockLevel` values (MS-SMB2 2.2.13, 2.2.14).
pub mod oplock {
    pub const LEVEL_II: u8 = 0x01;
    pub const EXCLUSIVE: u8 = 0x08;
    pub const BATCH: u8 = 0x09;
    /// The open has a lease instead; its state is in the response's lease context.
    pub const LEASE: u8 = 0xFF;
}

/// `LeaseState` bits (MS-SMB2 2.2.13.2.8), and the response's `LeaseFlags` bit that says
/// the lease is being broken (2.2.14.2.10).
pub mod lease {
    pub const READ_CACHING: u32 = 0x01;
    pub const HANDLE_CACHING: u32 = 0x02;
    pub const WRITE_CACHING: u32 = 0x04;
    pub const FLAG_BREAK_IN_PROGRESS: u32 = 0x02;
}

/// A CREATE response's fields the read-ahead engine reads (MS-SMB2 2.2.14), with the state
/// of the lease granted, if any (its create context, "RqLs", 2.2.14.2.10 and 2.2.14.2.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateResponse {
    pub oplock_level: u8,
    pub end_of_file: u64,
    pub file_attributes: u32,
    pub file_id: FileId,
    /// `Some` when the oplock level is [`oplock::LEASE`] and the lease context is there:
    /// its `LeaseState`, and whether a break of it is in progress (another open's
    /// conflicting request has started one; the state is the one being broken).
    pub lease_state: Option<u32>,
    pub lease_breaking: bool,
}

impl CreateResponse {
    const SIZE: u16 = 89;
    /// Bytes of the fixed part.
    const LEN: usize = 88;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "CREATE response", Self::SIZE, Self::LEN)?;
        let oplock_level = b[2];
        let lease = (oplock_level == oplock::LEASE)
            .then(|| Self::lease(body))
            .flatten();
        Ok(Self {
            oplock_level,
            end_of_file: le64(b, 48),
            file_attributes: le32(b, 56),
            file_id: FileId::parse(&b[64..80]),
            lease_state: lease.map(|(state, _)| state),
            lease_breaking: lease
                .is_some_and(|(_, flags)| flags & lease::FLAG_BREAK_IN_PROGRESS != 0),
        })
    }

    /// Whether the open lets its client cache what it reads, so that nobody else can
    /// change the file unseen: a Level II, exclusive or batch oplock, or a lease with read
    /// caching that is not being broken (a break of either comes before a change).
    pub fn caches_reads(&self) -> bool {
        matches!(
            self.oplock_level,
            oplock::LEVEL_II | oplock::EXCLUSIVE | oplock::BATCH
        ) || (!self.lease_breaking
            && self
                .lease_state
                .is_some_and(|state| state & lease::READ_CACHING != 0))
    }

    /// The `LeaseState` and `LeaseFlags` of the lease context among the response's create
    /// contexts (`CreateContextsOffset` counts from the header's start); `None` if there is
    /// none or the chain is malformed.
    fn lease(body: &[u8]) -> Option<(u32, u32)> {
        let offset = (le32(body, 80) as usize).checked_sub(super::header::HEADER_LEN)?;
        let length = le32(body, 84) as usize;
        let mut contexts = body.get(offset..offset.checked_add(length)?)?;
        loop {
            // Next (4), NameOffset (2), NameLength (2), Reserved (2), DataOffset (2),
            // DataLength (4); offsets from the context's start.
            let head = contexts.get(..16)?;
            let next = le32(head, 0) as usize;
            let this = if next == 0 {
                contexts
            } else {
                contexts.get(..next)?
            };
            let (name_at, name_len) = (usize::from(le16(head, 4)), usize::from(le16(head, 6)));
            if this.get(name_at..name_at + name_len) == Some(b"RqLs".as_slice()) {
                let (data_at, data_len) = (usize::from(le16(head, 10)), le32(head, 12) as usize);
                let data = this.get(data_at..data_at.checked_add(data_len)?)?;
                // LeaseKey (16), LeaseState (4), LeaseFlags (4), in both versions.
                return data.get(16..24).map(|d| (le32(d, 0), le32(d, 4)));
            }
            if next == 0 {
                return None;
            }
            contexts = contexts.get(next..)?;
        }
    }
}

/// A QUERY_INFO request (MS-SMB2 2.2.37): what the client asks to know of `file_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueryInfoRequest {
    /// `SMB2_0_INFO_*`: file, file system, security or quota.
    pub info_type: u8,
    pub file_info_class: u8,
    /// The most the answer may carry.
    pub output_buffer_length: u32,
    pub input_buffer_offset: u16,
    pub input_buffer_length: u32,
    pub additional_information: u32,
    pub flags: u32,
    pub file_id: FileId,
}

impl QueryInfoRequest {
    const SIZE: u16 = 41;
    /// The fixed part; `StructureSize` counts one byte of the buffer that follows.
    const FIXED: usize = 40;
    /// Bytes [`QueryInfoRequest::emit`] writes: the fixed part and the one buffer byte.
    pub const LEN: usize = Self::FIXED + 1;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "QUERY_INFO request", Self::SIZE, Self::FIXED)?;
        Ok(Self {
            info_type: b[2],
            file_info_class: b[3],
            output_buffer_length: le32(b, 4),
            input_buffer_offset: le16(b, 8),
            input_buffer_length: le32(b, 12),
            additional_information: le32(b, 16),
            flags: le32(b, 20),
            file_id: FileId::parse(&b[24..40]),
        })
    }

    /// Writes the body (no input buffer) into the first [`QueryInfoRequest::LEN`] bytes of
    /// `out`; `None` if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..Self::LEN)?;
        b[..2].copy_from_slice(&Self::SIZE.to_le_bytes());
        b[2] = self.info_type;
        b[3] = self.file_info_class;
        b[4..8].copy_from_slice(&self.output_buffer_length.to_le_bytes());
        b[8..10].copy_from_slice(&self.input_buffer_offset.to_le_bytes());
        b[10..12].copy_from_slice(&[0, 0]);
        b[12..16].copy_from_slice(&self.input_buffer_length.to_le_bytes());
        b[16..20].copy_from_slice(&self.additional_information.to_le_bytes());
        b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        self.file_id.emit(&mut b[24..40]);
        b[40] = 0;
        Some(())
    }
}

/// A CLOSE request (MS-SMB2 2.2.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseRequest {
    /// [`CloseRequest::POSTQUERY_ATTRIB`]: the answer is to carry the file's attributes.
    pub flags: u16,
    pub file_id: FileId,
}

impl CloseRequest {
    const SIZE: u16 = 24;
    pub const LEN: usize = 24;
    pub const POSTQUERY_ATTRIB: u16 = 0x0001;

    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b = checked(body, "CLOSE request", Self::SIZE, Self::LEN)?;
        Ok(Self {
            flags: le16(b, 2),
            file_id: FileId::parse(&b[8..24]),
        })
    }

    /// Writes the body into the first [`CloseRequest::LEN`] bytes of `out`; `None` if `out`
    /// is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..Self::LEN)?;
        b[..2].copy_from_slice(&Self::SIZE.to_le_bytes());
        b[2..4].copy_from_slice(&self.flags.to_le_bytes());
        b[4..8].copy_from_slice(&[0; 4]);
        self.file_id.emit(&mut b[8..24]);
        Some(())
    }

    /// The body of the answer to a CLOSE without [`CloseRequest::POSTQUERY_ATTRIB`]: the
    /// structure size, and zeros where the attributes would be (MS-SMB2 2.2.16).
    pub const RESPONSE_WITHOUT_ATTRIBUTES: [u8; 60] = {
        let mut b = [0; 60];
        b[0] = 60;
        b
    };
}

/// Where a request that names an open file carries its [`FileId`], by command (MS-SMB2
/// 2.2.13-2.2.41): the offset in its body.
pub fn file_id_at(command: super::header::Command) -> Option<usize> {
    use super::header::Command as C;
    match command {
        C::CLOSE
        | C::FLUSH
        | C::LOCK
        | C::IOCTL
        | C::QUERY_DIRECTORY
        | C::CHANGE_NOTIFY
        | C::OPLOCK_BREAK => Some(8),
        C::READ | C::WRITE | C::SET_INFO => Some(16),
        C::QUERY_INFO => Some(24),
        _ => None,
    }
}

/// The [`FileId`] a request of `command` with `body` names, if it names one.
pub fn file_id_of(command: super::header::Command, body: &[u8]) -> Option<FileId> {
    let at = file_id_at(command)?;
    body.get(at..at + 16).map(FileId::parse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_structure_size_that_is_wrong_is_named() {
        let mut b = [0u8; 64];
        b[0] = 9;
        assert_eq!(
            NegotiateResponse::parse(&b),
            Err(BodyError::StructureSize {
                what: "NEGOTIATE response",
                got: 9,
                want: 65
            })
        );
        assert_eq!(
            SessionSetupResponse::parse(&b[..7]),
            Err(BodyError::Truncated("SESSION_SETUP response"))
        );
        b[2] = 0x04;
        assert!(SessionSetupResponse::parse(&b).unwrap().encrypts());
    }

    #[test]
    fn dialects_print_as_operators_read_them() {
        assert_eq!(Dialect::SMB_3_1_1.to_string(), "3.1.1");
        assert_eq!(Dialect(0x0222).to_string(), "0x0222");
        assert!(!Dialect::WILDCARD.is_known());
    }

    fn read_request() -> impl Strategy<Value = ReadRequest> {
        (
            any::<(u8, u8, u32, u64, u64, u64)>(),
            any::<(u32, u32, u32, u16, u16)>(),
        )
            .prop_map(
                |(
                    (padding, flags, length, offset, persistent, volatile),
                    (minimum_count, channel, remaining_bytes, info_offset, info_length),
                )| ReadRequest {
                    padding,
                    flags,
                    length,
                    offset,
                    file_id: FileId {
                        persistent,
                        volatile,
                    },
                    minimum_count,
                    channel,
                    remaining_bytes,
                    channel_info_offset: info_offset,
                    channel_info_length: info_length,
                },
            )
    }

    proptest! {
        #[test]
        fn any_body_parses_or_fails_cleanly(b in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = NegotiateResponse::parse(&b);
            let _ = SessionSetupResponse::parse(&b);
            let _ = TreeConnectResponse::parse(&b);
            let _ = ReadRequest::parse(&b);
            let _ = ReadResponse::parse(&b);
            let _ = QueryInfoRequest::parse(&b);
            let _ = CloseRequest::parse(&b);
        }

        #[test]
        fn queries_and_closes_round_trip(
            q in (any::<(u8, u8, u32, u16, u32)>(), any::<(u32, u32, u64, u64)>()),
            c in any::<(u16, u64, u64)>(),
        ) {
            let ((info_type, file_info_class, output_buffer_length, input_buffer_offset, input_buffer_length),
                 (additional_information, flags, persistent, volatile)) = q;
            let query = QueryInfoRequest {
                info_type, file_info_class, output_buffer_length, input_buffer_offset,
                input_buffer_length, additional_information, flags,
                file_id: FileId { persistent, volatile },
            };
            let mut b = [0xaa; QueryInfoRequest::LEN];
            query.emit(&mut b).unwrap();
            prop_assert_eq!(QueryInfoRequest::parse(&b), Ok(query));
            prop_assert_eq!(file_id_of(crate::wire::header::Command::QUERY_INFO, &b), Some(query.file_id));
            let close = CloseRequest { flags: c.0, file_id: FileId { persistent: c.1, volatile: c.2 } };
            let mut b = [0xaa; CloseRequest::LEN];
            close.emit(&mut b).unwrap();
            prop_assert_eq!(CloseRequest::parse(&b), Ok(close));
            prop_assert_eq!(file_id_of(crate::wire::header::Command::CLOSE, &b), Some(close.file_id));
        }

        #[test]
        fn reads_round_trip(request in read_request(), response in any::<(u8, u32, u32, u32)>()) {
            let mut b = [0xaa; ReadRequest::LEN];
            request.emit(&mut b).unwrap();
            prop_assert_eq!(ReadRequest::parse(&b), Ok(request));
            let (data_offset, data_length, data_remaining, flags) = response;
            let response = ReadResponse { data_offset, data_length, data_remaining, flags };
            let mut b = [0xaa; ReadResponse::LEN];
            response.emit(&mut b).unwrap();
            prop_assert_eq!(ReadResponse::parse(&b), Ok(response));
            prop_assert!(request.emit(&mut [0; ReadRequest::LEN - 1]).is_none());
        }
    }

    /// The READ request and response of a recorded smbclient session (SMB 2.1, a 3,000-byte
    /// file read in one READ): the fields as smbclient and Samba wrote them.
    #[test]
    fn a_real_read_parses_as_sent() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/captures/");
        let frames = |name: &str| -> Vec<Vec<u8>> {
            let data = std::fs::read(format!("{dir}{name}")).unwrap();
            let mut out = Vec::new();
            let mut d = crate::wire::framing::Deframer::new(usize::MAX);
            d.feed(&data, |f| out.push(f.prefix.to_vec())).unwrap();
            out
        };
        let find = |frames: Vec<Vec<u8>>| {
            frames
                .into_iter()
                .find(|f| crate::wire::header::Header::parse(f).unwrap().command.0 == 8)
                .unwrap()
        };
        let request = find(frames("guest21.to_server"));
        let read = ReadRequest::parse(&request[64..]).unwrap();
        assert_eq!((read.offset, read.length, read.channel), (0, 3000, 0));
        let response = find(frames("guest21.to_client"));
        let answer = ReadResponse::parse(&response[64..]).unwrap();
        assert_eq!((answer.data_offset, answer.data_length), (0x50, 3000));
        assert_eq!(response.len(), 0x50 + 3000);
    }

    /// A create context as a server sends it: `name`, padded to 8, then `data`.
    fn context(name: &[u8; 4], data: &[u8], last: bool) -> Vec<u8> {
        let len = 24 + data.len();
        let next = if last {
            0
        } else {
            len.next_multiple_of(8) as u32
        };
        let mut c = Vec::new();
        c.extend_from_slice(&next.to_le_bytes());
        c.extend_from_slice(&16u16.to_le_bytes());
        c.extend_from_slice(&4u16.to_le_bytes());
        c.extend_from_slice(&[0, 0]);
        c.extend_from_slice(&24u16.to_le_bytes());
        c.extend_from_slice(&(data.len() as u32).to_le_bytes());
        c.extend_from_slice(name);
        c.extend_from_slice(&[0; 4]);
        c.extend_from_slice(data);
        if !last {
            c.resize(next as usize, 0);
        }
        c
    }

    /// A CREATE response body granting `oplock`, with `contexts` after the fixed part.
    fn create_response(oplock: u8, contexts: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 88];
        b[..2].copy_from_slice(&89u16.to_le_bytes());
        b[2] = oplock;
        b[48..56].copy_from_slice(&1_000_000u64.to_le_bytes());
        b[56..60].copy_from_slice(&0x80u32.to_le_bytes());
        b[64..80].copy_from_slice(&[7; 16]);
        if !contexts.is_empty() {
            b[80..84].copy_from_slice(&(64 + 88u32).to_le_bytes());
            b[84..88].copy_from_slice(&(contexts.len() as u32).to_le_bytes());
        }
        b.extend_from_slice(contexts);
        b
    }

    /// The lease data of a response (version 2: 52 bytes) in `state`.
    fn lease_v2(state: u32) -> Vec<u8> {
        let mut data = vec![0xAB; 16];
        data.extend_from_slice(&state.to_le_bytes());
        data.resize(52, 0);
        data
    }

    #[test]
    fn a_create_response_tells_whether_its_client_caches_reads() {
        // A lease with read and handle caching, after another context.
        let mut contexts = context(b"MxAc", &[0; 8], false);
        contexts.extend(context(
            b"RqLs",
            &lease_v2(lease::READ_CACHING | lease::HANDLE_CACHING),
            true,
        ));
        let created = CreateResponse::parse(&create_response(oplock::LEASE, &contexts)).unwrap();
        assert_eq!(created.lease_state, Some(3));
        assert_eq!(created.end_of_file, 1_000_000);
        assert_eq!(created.file_attributes, 0x80);
        assert_eq!(
            created.file_id,
            FileId {
                persistent: 0x0707_0707_0707_0707,
                volatile: 0x0707_0707_0707_0707
            }
        );
        assert!(created.caches_reads());
        // A version 1 lease (32 bytes) with handle caching only: the client may not cache.
        let v1 = &lease_v2(lease::HANDLE_CACHING)[..32];
        let created =
            CreateResponse::parse(&create_response(oplock::LEASE, &context(b"RqLs", v1, true)))
                .unwrap();
        assert_eq!(created.lease_state, Some(lease::HANDLE_CACHING));
        assert!(!created.caches_reads());
        // A lease with read caching that is being broken: another open wants to write.
        let mut breaking = lease_v2(lease::READ_CACHING | lease::HANDLE_CACHING);
        breaking[20..24].copy_from_slice(&lease::FLAG_BREAK_IN_PROGRESS.to_le_bytes());
        let created = CreateResponse::parse(&create_response(
            oplock::LEASE,
            &context(b"RqLs", &breaking, true),
        ))
        .unwrap();
        assert_eq!(
            (created.lease_state, created.lease_breaking),
            (Some(3), true)
        );
        assert!(!created.caches_reads());
        // A lease level without a lease context, and no oplock: nothing cached.
        assert!(
            !CreateResponse::parse(&create_response(oplock::LEASE, &[]))
                .unwrap()
                .caches_reads()
        );
        assert!(
            !CreateResponse::parse(&create_response(0, &[]))
                .unwrap()
                .caches_reads()
        );
        // Oplocks: Level II, exclusive and batch cache reads; a lease context beside an
        // oplock level is not read.
        for level in [oplock::LEVEL_II, oplock::EXCLUSIVE, oplock::BATCH] {
            assert!(
                CreateResponse::parse(&create_response(level, &[]))
                    .unwrap()
                    .caches_reads()
            );
        }
        let beside = context(b"RqLs", &lease_v2(lease::READ_CACHING), true);
        assert_eq!(
            CreateResponse::parse(&create_response(0, &beside))
                .unwrap()
                .lease_state,
            None
        );
        // A chain whose next context lies past its end, or a lease context cut short.
        let mut broken = context(b"MxAc", &[0; 8], false);
        broken[..4].copy_from_slice(&4096u32.to_le_bytes());
        broken.extend(context(b"RqLs", &lease_v2(1), true));
        assert_eq!(
            CreateResponse::parse(&create_response(oplock::LEASE, &broken))
                .unwrap()
                .lease_state,
            None
        );
        let short = context(b"RqLs", &lease_v2(1)[..22], true);
        assert_eq!(
            CreateResponse::parse(&create_response(oplock::LEASE, &short))
                .unwrap()
                .lease_state,
            None
        );
    }

    proptest! {
        /// Whatever follows a CREATE response's fixed part, and wherever its offsets point,
        /// parsing ends without a panic.
        #[test]
        fn any_create_contexts_parse_without_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..300),
            offset in 0u32..500,
            length in 0u32..500,
        ) {
            let mut body = create_response(oplock::LEASE, &tail);
            body[80..84].copy_from_slice(&offset.to_le_bytes());
            body[84..88].copy_from_slice(&length.to_le_bytes());
            let _ = CreateResponse::parse(&body);
        }
    }
}
