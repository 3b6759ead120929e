//! The bodies of the messages the observer reads: what a NEGOTIATE response agrees, what a
//! SESSION_SETUP response grants, what a TREE_CONNECT response says of the share. Each
//! parses from the bytes after the header and checks its `StructureSize`.

use super::{le16, le32};

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

    proptest! {
        #[test]
        fn any_body_parses_or_fails_cleanly(b in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = NegotiateResponse::parse(&b);
            let _ = SessionSetupResponse::parse(&b);
            let _ = TreeConnectResponse::parse(&b);
        }
    }
}
