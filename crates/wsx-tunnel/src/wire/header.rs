//! Packet headers (PROTOCOL.md §2): what is readable before decryption.
//!
//! Four packet types share the first byte. Handshake packets carry the Noise messages; data
//! packets carry the receiver's connection id, in the clear, so that one socket can serve many
//! peers and a peer may change address, and the packet number, which is the AEAD nonce.
//!
//! Two views, as smoltcp has them: [`Header`] is the parsed representation (`parse`/`emit`),
//! and [`Packet`] is a checked view of a whole datagram that hands out its parts (header
//! bytes, body, and for a data packet the sealed payload and its tag) without the caller
//! slicing by header lengths.

use super::coding::{Reader, Truncated, Writer};
use crate::crypto::TAG_LEN;

/// The protocol version this implementation speaks. Handshake packets carry it; a peer speaking
/// another version gets no answer (answering would let a forged packet draw traffic).
pub const PROTOCOL_VERSION: u8 = 1;

/// Type byte of a handshake initiation.
const TYPE_INITIATION: u8 = 0x01;
/// Type byte of a handshake response.
const TYPE_RESPONSE: u8 = 0x02;
/// Type of a data packet; the top bit of the byte is the key phase.
const TYPE_DATA: u8 = 0x03;
const KEY_PHASE_BIT: u8 = 0x80;
/// In a data packet's type byte: the packet belongs to an FEC block.
const PROTECTED_BIT: u8 = 0x40;
/// Type byte of a parity packet (FEC).
const TYPE_PARITY: u8 = 0x04;

/// Bytes in a data packet's header: type, receiver id, packet number.
pub(crate) const DATA_HEADER_LEN: usize = 1 + 4 + 8;
/// Bytes of a parity packet before the parity description: type, receiver id.
pub(crate) const PARITY_HEADER_LEN: usize = 1 + 4;
/// Bytes of an initiation before the Noise message: type, version, sender id.
pub(crate) const INITIATION_HEADER_LEN: usize = 1 + 1 + 4;
/// Bytes of a response before the Noise message: type, version, sender id, receiver id.
pub(crate) const RESPONSE_HEADER_LEN: usize = 1 + 1 + 4 + 4;

/// A datagram's header, parsed; the rest of the datagram follows at `header_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    Initiation {
        sender: u32,
    },
    Response {
        sender: u32,
        receiver: u32,
    },
    Data(DataHeader),
    /// A parity shard; the description and the shard follow.
    Parity {
        receiver: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataHeader {
    pub(crate) receiver: u32,
    pub(crate) key_phase: bool,
    /// The packet belongs to an FEC block: the receiver keeps a copy.
    pub(crate) protected: bool,
    pub(crate) number: u64,
}

impl DataHeader {
    /// The key phase a data packet's type byte says.
    pub(crate) fn key_phase_of(type_byte: u8) -> bool {
        type_byte & KEY_PHASE_BIT != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("truncated header")]
    Truncated,
    #[error("unknown packet type {0:#04x}")]
    UnknownType(u8),
    #[error("unsupported protocol version {0}")]
    Version(u8),
}

impl From<Truncated> for HeaderError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

impl Header {
    /// Parses the header at the start of `datagram`.
    pub(crate) fn parse(datagram: &[u8]) -> Result<Self, HeaderError> {
        let mut r = Reader::new(datagram);
        let first = r.u8()?;
        match first & !KEY_PHASE_BIT & !PROTECTED_BIT {
            TYPE_DATA => Ok(Self::Data(DataHeader {
                receiver: r.u32()?,
                key_phase: first & KEY_PHASE_BIT != 0,
                protected: first & PROTECTED_BIT != 0,
                number: r.u64()?,
            })),
            _ if first & (KEY_PHASE_BIT | PROTECTED_BIT) != 0 => {
                Err(HeaderError::UnknownType(first))
            }
            TYPE_PARITY => Ok(Self::Parity { receiver: r.u32()? }),
            TYPE_INITIATION => {
                check_version(r.u8()?)?;
                Ok(Self::Initiation { sender: r.u32()? })
            }
            TYPE_RESPONSE => {
                check_version(r.u8()?)?;
                Ok(Self::Response {
                    sender: r.u32()?,
                    receiver: r.u32()?,
                })
            }
            _ => Err(HeaderError::UnknownType(first)),
        }
    }

    /// The header's size on the wire; the packet's body follows it.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Initiation { .. } => INITIATION_HEADER_LEN,
            Self::Response { .. } => RESPONSE_HEADER_LEN,
            Self::Data(_) => DATA_HEADER_LEN,
            Self::Parity { .. } => PARITY_HEADER_LEN,
        }
    }

    pub(crate) fn emit(&self, w: &mut Writer<'_>) {
        match *self {
            Self::Initiation { sender } => {
                w.u8(TYPE_INITIATION);
                w.u8(PROTOCOL_VERSION);
                w.u32(sender);
            }
            Self::Response { sender, receiver } => {
                w.u8(TYPE_RESPONSE);
                w.u8(PROTOCOL_VERSION);
                w.u32(sender);
                w.u32(receiver);
            }
            Self::Data(DataHeader {
                receiver,
                key_phase,
                protected,
                number,
            }) => {
                let phase = if key_phase { KEY_PHASE_BIT } else { 0 };
                let protected = if protected { PROTECTED_BIT } else { 0 };
                w.u8(TYPE_DATA | phase | protected);
                w.u32(receiver);
                w.u64(number);
            }
            Self::Parity { receiver } => {
                w.u8(TYPE_PARITY);
                w.u32(receiver);
            }
        }
    }
}

/// A received datagram with a parsed header. `new_checked` refuses a datagram too short for
/// its type (a data packet must hold at least the AEAD tag), so the accessors never panic.
#[derive(Debug)]
pub(crate) struct Packet<T> {
    buffer: T,
    header: Header,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub(crate) fn new_checked(buffer: T) -> Result<Self, HeaderError> {
        let header = Header::parse(buffer.as_ref())?;
        let min = match header {
            Header::Data(_) => DATA_HEADER_LEN + TAG_LEN,
            _ => header.len(),
        };
        if buffer.as_ref().len() < min {
            return Err(HeaderError::Truncated);
        }
        Ok(Self { buffer, header })
    }

    pub(crate) fn header(&self) -> Header {
        self.header
    }

    /// The header's bytes (a data packet's are the AEAD's associated data).
    pub(crate) fn header_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header.len()]
    }

    /// What follows the header: a Noise message, a parity description and shard, or a
    /// sealed payload with its tag.
    pub(crate) fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header.len()..]
    }

    pub(crate) fn len(&self) -> usize {
        self.buffer.as_ref().len()
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A data packet's payload between the header and the tag (plaintext once opened).
    pub(crate) fn payload(&self) -> &[u8] {
        let body = self.body();
        match self.header {
            Header::Data(_) => &body[..body.len() - TAG_LEN],
            _ => body,
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The whole datagram, for callers that keep a sealed copy.
    pub(crate) fn buffer_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// A data packet's parts for opening in place: the header (associated data), the sealed
    /// payload and the tag. For other packet types the payload is the body and the tag empty.
    pub(crate) fn sealed_mut(&mut self) -> (&[u8], &mut [u8], &mut [u8]) {
        let header_len = self.header.len();
        let tag_len = match self.header {
            Header::Data(_) => TAG_LEN,
            _ => 0,
        };
        let (header, rest) = self.buffer.as_mut().split_at_mut(header_len);
        let (payload, tag) = rest.split_at_mut(rest.len() - tag_len);
        (header, payload, tag)
    }
}

fn check_version(version: u8) -> Result<(), HeaderError> {
    if version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(HeaderError::Version(version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(header: Header) {
        let mut buf = [0u8; 32];
        let mut w = Writer::new(&mut buf);
        header.emit(&mut w);
        assert_eq!(w.len(), header.len());
        assert_eq!(Header::parse(&buf[..header.len()]), Ok(header));
        for cut in 0..header.len() {
            assert_eq!(Header::parse(&buf[..cut]), Err(HeaderError::Truncated));
        }
    }

    #[test]
    fn headers_round_trip_and_truncations_are_errors() {
        round_trip(Header::Initiation { sender: 7 });
        round_trip(Header::Response {
            sender: 1,
            receiver: u32::MAX,
        });
        for key_phase in [false, true] {
            for protected in [false, true] {
                round_trip(Header::Data(DataHeader {
                    receiver: 0xdead_beef,
                    key_phase,
                    protected,
                    number: u64::MAX - 1,
                }));
            }
        }
        round_trip(Header::Parity { receiver: 9 });
    }

    #[test]
    fn a_packet_view_splits_a_data_packet_and_refuses_short_ones() {
        let header = Header::Data(DataHeader {
            receiver: 7,
            key_phase: false,
            protected: false,
            number: 9,
        });
        let mut buf = vec![0u8; DATA_HEADER_LEN + 3 + TAG_LEN];
        header.emit(&mut Writer::new(&mut buf));
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        assert_eq!(packet.header(), header);
        assert_eq!(packet.body().len(), 3 + TAG_LEN);
        let (h, payload, tag) = packet.sealed_mut();
        assert_eq!(
            (h.len(), payload.len(), tag.len()),
            (DATA_HEADER_LEN, 3, TAG_LEN)
        );
        // A data packet without room for its tag is refused, even though its header parses.
        assert_eq!(
            Packet::new_checked(&buf[..DATA_HEADER_LEN + TAG_LEN - 1]).unwrap_err(),
            HeaderError::Truncated
        );
        let parity = Header::Parity { receiver: 1 };
        let mut buf = [0u8; PARITY_HEADER_LEN + 10];
        parity.emit(&mut Writer::new(&mut buf));
        assert_eq!(Packet::new_checked(&buf[..]).unwrap().body().len(), 10);
    }

    #[test]
    fn other_versions_and_types_are_refused() {
        assert_eq!(
            Header::parse(&[TYPE_INITIATION, 2, 0, 0, 0, 0]),
            Err(HeaderError::Version(2))
        );
        assert_eq!(Header::parse(&[0x05]), Err(HeaderError::UnknownType(5)));
        assert_eq!(
            Header::parse(&[TYPE_PARITY | PROTECTED_BIT]),
            Err(HeaderError::UnknownType(0x44))
        );
        assert_eq!(
            Header::parse(&[TYPE_RESPONSE | KEY_PHASE_BIT]),
            Err(HeaderError::UnknownType(0x82))
        );
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Header::parse(&bytes);
        }
    }
}
