//! Everything on the wire, one file per layer (smoltcp's `wire/`): the Direct TCP framing,
//! the SMB2 header and compound chains, and the bodies the observer reads. Nothing here
//! panics on input: every parser returns an error for bytes it cannot read.

pub mod framing;
pub mod header;
pub mod messages;

/// The little-endian `u16` at `at`; the caller has checked the length.
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian `u32` at `at`; the caller has checked the length.
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The little-endian `u64` at `at`; the caller has checked the length.
pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}
