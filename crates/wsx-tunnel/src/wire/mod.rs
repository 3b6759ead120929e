//! Everything on the wire (PROTOCOL.md §2-§4), one file per layer, as smoltcp's `wire`:
//!
//! - `coding`: big-endian integers and RFC 9000 variable-length integers ([`Reader`],
//!   [`Writer`]);
//! - `header`: the cleartext packet header ([`Header`]) and a checked view of a datagram
//!   ([`Packet`]);
//! - `frame`: the frames of a decrypted payload, parsed and encoded by one type ([`Frame`]);
//! - `stream`: what names a stream and what it carries at open ([`StreamId`], [`StreamMeta`],
//!   [`Target`]).
//!
//! Nothing here keeps state or knows about connections; parsers return errors and never
//! panic on input. Dependencies run one way: `frame` → `stream`, `header` → `coding`.

pub(crate) mod coding;
pub(crate) mod frame;
pub(crate) mod header;
pub(crate) mod stream;

pub(crate) use coding::{Reader, Writer};
pub(crate) use frame::{Ack, Frame, FrameError, Frames};
pub use header::PROTOCOL_VERSION;
pub(crate) use header::{DataHeader, Header, Packet};
pub use stream::{MAX_HINT_LEN, MAX_NAME_LEN, StreamId, StreamMeta, Target};
