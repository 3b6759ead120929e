//! Frames: the decrypted payload of a data packet is a sequence of frames (PROTOCOL.md §4).
//!
//! One type, [`Frame`], both ways: [`Frames`] parses a payload lazily and never panics
//! (malformed input yields a [`FrameError`], which closes the connection), and
//! [`Frame::encode`] writes a frame into a caller's buffer after [`Frame::encoded_len`] said
//! whether it fits, so that packets are filled exactly. STREAM frames are the one frame whose
//! bytes the sender does not hold in a slice (they are copied from the send buffer straight
//! into the packet): [`StreamHeader`] writes their header and the caller the data.

use super::coding::{Reader, Truncated, VARINT_MAX, Writer, varint_len};
use super::stream::{StreamId, StreamMeta, Target};
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::{Range, RangeInclusive};

// Frame types ([`Frame::ty`]); errors name the frame that caused them by these.
const PADDING: u64 = 0x00;
const PING: u64 = 0x01;
pub(crate) const ACK: u64 = 0x02;
const CLOSE: u64 = 0x03;
const MAX_DATA: u64 = 0x04;
const MAX_STREAM_DATA: u64 = 0x05;
const MAX_STREAMS: u64 = 0x06;
pub(crate) const CONTROL: u64 = 0x07;
const OPEN: u64 = 0x08;
const RESET: u64 = 0x09;
/// Packets the receiver rebuilt from parity: laid out as ACK, with a zero delay.
pub(crate) const RECOVERED: u64 = 0x0a;
/// STREAM frames use types 0x10-0x17: bit 0 is FIN, bit 1 says an explicit length follows,
/// bit 2 is PUSH (the frame ends what the sender had been given so far).
const STREAM: u64 = 0x10;
const STREAM_FIN: u64 = 0x01;
const STREAM_LEN: u64 = 0x02;
const STREAM_PUSH: u64 = 0x04;

/// The most ACK ranges a frame may carry. Senders write fewer when space is short; a frame
/// with more is malformed.
pub(crate) const MAX_ACK_RANGES: usize = 32;
/// The longest reason a CLOSE frame carries.
pub(crate) const MAX_REASON_LEN: usize = 256;

// One frame lives on the stack at a time while a packet is parsed; boxing the ACK's ranges
// would allocate for every ACK received.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    Padding,
    Ping,
    Ack(Ack),
    /// Packets rebuilt from parity (FEC): received, but lost on the path.
    Recovered(Ack),
    Close {
        code: u64,
        reason: &'a [u8],
    },
    MaxData(u64),
    MaxStreamData {
        id: StreamId,
        max: u64,
    },
    MaxStreams(u64),
    Control {
        seq: u64,
        data: &'a [u8],
    },
    Open {
        id: StreamId,
        /// Borrowed when sending, owned when parsed.
        meta: Cow<'a, StreamMeta>,
    },
    Reset {
        id: StreamId,
        code: u64,
        final_size: u64,
    },
    Stream(StreamFrame<'a>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamFrame<'a> {
    pub(crate) id: StreamId,
    pub(crate) offset: u64,
    pub(crate) fin: bool,
    /// The data ends at the last byte the sender's application had written when the frame
    /// was built: the receiver should hand it over now rather than wait for more.
    pub(crate) push: bool,
    pub(crate) data: &'a [u8],
}

/// The header of a STREAM frame with an explicit length; `len` data bytes follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamHeader {
    pub(crate) id: StreamId,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) fin: bool,
    pub(crate) push: bool,
}

impl StreamHeader {
    pub(crate) fn encoded_len(&self) -> usize {
        1 + varint_len(self.id.0) + varint_len(self.offset) + varint_len(self.len as u64)
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        let fin = if self.fin { STREAM_FIN } else { 0 };
        let push = if self.push { STREAM_PUSH } else { 0 };
        w.varint(STREAM | STREAM_LEN | fin | push);
        w.varint(self.id.0);
        w.varint(self.offset);
        w.varint(self.len as u64);
    }
}

/// An ACK (or RECOVERED) frame: the received ranges, highest first, and for an ACK how long
/// the receiver held the largest before acknowledging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ack {
    pub(crate) delay_us: u64,
    /// Inclusive (start, end) pairs, highest first; `count` of them are used.
    ranges: [(u64, u64); MAX_ACK_RANGES],
    count: usize,
}

impl Ack {
    pub(crate) fn largest(&self) -> u64 {
        self.ranges[0].1
    }

    /// Acknowledged ranges, inclusive, highest first.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = RangeInclusive<u64>> + '_ {
        self.ranges[..self.count].iter().map(|&(s, e)| s..=e)
    }

    /// The frame for the highest of `ranges` (packet numbers received, ascending, half-open)
    /// that fit in `room` bytes as a frame of `ty` (at most [`MAX_ACK_RANGES`]); `None` when
    /// there is no range or not even one fits.
    fn fit(
        ty: u64,
        ranges: impl DoubleEndedIterator<Item = Range<u64>>,
        delay_us: u64,
        room: usize,
    ) -> Option<Self> {
        let mut ranges = ranges.rev();
        let top = ranges.next()?;
        let largest = top.end - 1;
        let head_len = |count: usize| {
            varint_len(ty) + varint_len(largest) + varint_len(delay_us) + varint_len(count as u64)
        };
        let mut ack = Ack {
            delay_us,
            ranges: [(0, 0); MAX_ACK_RANGES],
            count: 1,
        };
        ack.ranges[0] = (top.start, largest);
        let mut body = varint_len(largest - top.start);
        if head_len(1) + body > room {
            return None;
        }
        for range in ranges.take(MAX_ACK_RANGES - 1) {
            let low = ack.ranges[ack.count - 1].0;
            let end = range.end - 1;
            let add = varint_len(low - end - 2) + varint_len(end - range.start);
            if head_len(ack.count + 1) + body + add > room {
                break;
            }
            body += add;
            ack.ranges[ack.count] = (range.start, end);
            ack.count += 1;
        }
        Some(ack)
    }

    /// An ACK frame for what `ranges` (received, ascending, half-open) holds, as much as
    /// fits in `room` bytes.
    pub(crate) fn acknowledging(
        ranges: impl DoubleEndedIterator<Item = Range<u64>>,
        delay_us: u64,
        room: usize,
    ) -> Option<Self> {
        Self::fit(ACK, ranges, delay_us, room)
    }

    /// A RECOVERED frame for `ranges`, as [`Ack::acknowledging`] builds an ACK.
    pub(crate) fn recovering(
        ranges: impl DoubleEndedIterator<Item = Range<u64>>,
        room: usize,
    ) -> Option<Self> {
        Self::fit(RECOVERED, ranges, 0, room)
    }

    fn encoded_len(&self, ty: u64) -> usize {
        let (mut len, mut low) = (0, self.ranges[0].0);
        len += varint_len(ty)
            + varint_len(self.largest())
            + varint_len(self.delay_us)
            + varint_len(self.count as u64)
            + varint_len(self.largest() - low);
        for &(start, end) in &self.ranges[1..self.count] {
            len += varint_len(low - end - 2) + varint_len(end - start);
            low = start;
        }
        len
    }

    fn encode(&self, ty: u64, w: &mut Writer<'_>) {
        let mut low = self.ranges[0].0;
        w.varint(ty);
        w.varint(self.largest());
        w.varint(self.delay_us);
        w.varint(self.count as u64);
        // First range: `first` packets below `largest` are acknowledged too; then `gap`
        // unacknowledged packets and a range of `len + 1`, repeatedly.
        w.varint(self.largest() - low);
        for &(start, end) in &self.ranges[1..self.count] {
            w.varint(low - end - 2);
            w.varint(end - start);
            low = start;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("truncated frame")]
    Truncated,
    #[error("unknown frame type {0:#x}")]
    UnknownType(u64),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
}

impl From<Truncated> for FrameError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

impl Frame<'_> {
    /// The frame's type on the wire (for a STREAM frame, the base type 0x10).
    pub(crate) fn ty(&self) -> u64 {
        match self {
            Frame::Padding => PADDING,
            Frame::Ping => PING,
            Frame::Ack(_) => ACK,
            Frame::Recovered(_) => RECOVERED,
            Frame::Close { .. } => CLOSE,
            Frame::MaxData(_) => MAX_DATA,
            Frame::MaxStreamData { .. } => MAX_STREAM_DATA,
            Frame::MaxStreams(_) => MAX_STREAMS,
            Frame::Control { .. } => CONTROL,
            Frame::Open { .. } => OPEN,
            Frame::Reset { .. } => RESET,
            Frame::Stream(_) => STREAM,
        }
    }

    /// Whether receiving the frame obliges the receiver to acknowledge its packet.
    pub(crate) fn is_ack_eliciting(&self) -> bool {
        !matches!(
            self,
            Frame::Ack(_) | Frame::Recovered(_) | Frame::Padding | Frame::Close { .. }
        )
    }

    /// The bytes [`Frame::encode`] writes.
    pub(crate) fn encoded_len(&self) -> usize {
        let ty = varint_len(self.ty());
        match self {
            Frame::Padding | Frame::Ping => ty,
            Frame::Ack(ack) | Frame::Recovered(ack) => ack.encoded_len(self.ty()),
            Frame::Close { code, reason } => {
                ty + varint_len(*code) + varint_len(reason.len() as u64) + reason.len()
            }
            Frame::MaxData(max) | Frame::MaxStreams(max) => ty + varint_len(*max),
            Frame::MaxStreamData { id, max } => ty + varint_len(id.0) + varint_len(*max),
            Frame::Control { seq, data } => {
                ty + varint_len(*seq) + varint_len(data.len() as u64) + data.len()
            }
            Frame::Open { id, meta } => {
                ty + varint_len(id.0)
                    + varint_len(u64::from(meta.scenario))
                    + 1
                    + addr_len(&meta.source)
                    + target_len(&meta.destination)
                    + 1
                    + meta.hint.len()
            }
            Frame::Reset {
                id,
                code,
                final_size,
            } => ty + varint_len(id.0) + varint_len(*code) + varint_len(*final_size),
            Frame::Stream(f) => f.header().encoded_len() + f.data.len(),
        }
    }

    /// Writes the frame; `w` must have [`Frame::encoded_len`] bytes left. A CLOSE reason, an
    /// OPEN's hint and destination name are checked against their limits by whoever made
    /// them ([`MAX_REASON_LEN`], [`super::MAX_HINT_LEN`], [`super::MAX_NAME_LEN`]).
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        if let Frame::Ack(ack) | Frame::Recovered(ack) = self {
            return ack.encode(self.ty(), w);
        }
        if let Frame::Stream(f) = self {
            f.header().encode(w);
            return w.bytes(f.data);
        }
        w.varint(self.ty());
        match self {
            Frame::Padding | Frame::Ping | Frame::Ack(_) | Frame::Recovered(_) => {}
            Frame::Stream(_) => {}
            Frame::Close { code, reason } => {
                w.varint(*code);
                w.varint(reason.len() as u64);
                w.bytes(reason);
            }
            Frame::MaxData(max) | Frame::MaxStreams(max) => w.varint(*max),
            Frame::MaxStreamData { id, max } => {
                w.varint(id.0);
                w.varint(*max);
            }
            Frame::Control { seq, data } => {
                w.varint(*seq);
                w.varint(data.len() as u64);
                w.bytes(data);
            }
            Frame::Open { id, meta } => {
                w.varint(id.0);
                w.varint(u64::from(meta.scenario));
                w.u8(if meta.transparent {
                    OPEN_TRANSPARENT
                } else {
                    0
                });
                emit_addr(w, &meta.source);
                emit_target(w, &meta.destination);
                w.u8(meta.hint.len() as u8);
                w.bytes(&meta.hint);
            }
            Frame::Reset {
                id,
                code,
                final_size,
            } => {
                w.varint(id.0);
                w.varint(*code);
                w.varint(*final_size);
            }
        }
    }

    /// Writes the frame if it fits in what `w` has left; returns whether it did.
    pub(crate) fn encode_if_fits(&self, w: &mut Writer<'_>) -> bool {
        let fits = self.encoded_len() <= w.remaining();
        if fits {
            self.encode(w);
        }
        fits
    }
}

impl StreamFrame<'_> {
    fn header(&self) -> StreamHeader {
        StreamHeader {
            id: self.id,
            offset: self.offset,
            len: self.data.len(),
            fin: self.fin,
            push: self.push,
        }
    }
}

/// Iterates the frames of a decrypted payload.
#[derive(Debug)]
pub(crate) struct Frames<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> Frames<'a> {
    pub(crate) fn new(payload: &'a [u8]) -> Self {
        Self {
            r: Reader::new(payload),
            failed: false,
        }
    }

    fn parse(&mut self) -> Result<Frame<'a>, FrameError> {
        let r = &mut self.r;
        let ty = r.varint()?;
        Ok(match ty {
            PADDING => Frame::Padding,
            PING => Frame::Ping,
            ACK => Frame::Ack(parse_ack(r)?),
            RECOVERED => Frame::Recovered(parse_ack(r)?),
            CLOSE => {
                let code = r.varint()?;
                let len = r.varint()? as usize;
                if len > MAX_REASON_LEN {
                    return Err(FrameError::Malformed("CLOSE"));
                }
                Frame::Close {
                    code,
                    reason: r.bytes(len)?,
                }
            }
            MAX_DATA => Frame::MaxData(r.varint()?),
            MAX_STREAM_DATA => Frame::MaxStreamData {
                id: StreamId(r.varint()?),
                max: r.varint()?,
            },
            MAX_STREAMS => Frame::MaxStreams(r.varint()?),
            CONTROL => {
                let seq = r.varint()?;
                let len = r.varint()? as usize;
                Frame::Control {
                    seq,
                    data: r.bytes(len)?,
                }
            }
            OPEN => Frame::Open {
                id: StreamId(r.varint()?),
                meta: Cow::Owned(parse_meta(r)?),
            },
            RESET => Frame::Reset {
                id: StreamId(r.varint()?),
                code: r.varint()?,
                final_size: r.varint()?,
            },
            t if t & !(STREAM_FIN | STREAM_LEN | STREAM_PUSH) == STREAM => {
                let id = StreamId(r.varint()?);
                let offset = r.varint()?;
                let data = if t & STREAM_LEN != 0 {
                    let len = r.varint()? as usize;
                    r.bytes(len)?
                } else {
                    r.rest()
                };
                if offset
                    .checked_add(data.len() as u64)
                    .is_none_or(|end| end > VARINT_MAX)
                {
                    return Err(FrameError::Malformed("STREAM"));
                }
                Frame::Stream(StreamFrame {
                    id,
                    offset,
                    fin: t & STREAM_FIN != 0,
                    push: t & STREAM_PUSH != 0,
                    data,
                })
            }
            other => return Err(FrameError::UnknownType(other)),
        })
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.is_empty() {
            return None;
        }
        let frame = self.parse();
        self.failed = frame.is_err();
        Some(frame)
    }
}

fn parse_ack(r: &mut Reader<'_>) -> Result<Ack, FrameError> {
    let malformed = FrameError::Malformed("ACK");
    let largest = r.varint()?;
    let delay_us = r.varint()?;
    let count = r.varint()? as usize;
    if count == 0 || count > MAX_ACK_RANGES {
        return Err(malformed);
    }
    let mut ack = Ack {
        delay_us,
        ranges: [(0, 0); MAX_ACK_RANGES],
        count,
    };
    // First range: `first` packets below `largest` are acknowledged too.
    let first = r.varint()?;
    let mut start = largest.checked_sub(first).ok_or(malformed)?;
    ack.ranges[0] = (start, largest);
    for slot in &mut ack.ranges[1..count] {
        // `gap` unacknowledged packets, then a range of `len + 1`.
        let gap = r.varint()?;
        let len = r.varint()?;
        let end = start.checked_sub(gap + 2).ok_or(malformed)?;
        start = end.checked_sub(len).ok_or(malformed)?;
        *slot = (start, end);
    }
    Ok(ack)
}

fn parse_meta(r: &mut Reader<'_>) -> Result<StreamMeta, FrameError> {
    let scenario = u32::try_from(r.varint()?).map_err(|_| FrameError::Malformed("OPEN"))?;
    let flags = r.u8()?;
    if flags & !OPEN_TRANSPARENT != 0 {
        return Err(FrameError::Malformed("OPEN flags"));
    }
    let source = parse_addr(r)?;
    let destination = parse_target(r)?;
    let len = usize::from(r.u8()?);
    Ok(StreamMeta {
        source,
        destination,
        transparent: flags & OPEN_TRANSPARENT != 0,
        scenario,
        hint: r.bytes(len)?.to_vec(),
    })
}

/// OPEN flags: the far gateway may connect from the source address.
const OPEN_TRANSPARENT: u8 = 0x01;

const ADDR_NONE: u8 = 0;
const ADDR_V4: u8 = 4;
const ADDR_V6: u8 = 6;
/// A destination name: length (u8, at least 1), UTF-8 bytes, port.
const ADDR_NAME: u8 = 0x4e;

fn parse_addr(r: &mut Reader<'_>) -> Result<Option<SocketAddr>, FrameError> {
    match parse_target(r)? {
        None => Ok(None),
        Some(Target::Addr(a)) => Ok(Some(a)),
        Some(Target::Name { .. }) => Err(FrameError::Malformed("OPEN source")),
    }
}

fn parse_target(r: &mut Reader<'_>) -> Result<Option<Target>, FrameError> {
    let ip = match r.u8()? {
        ADDR_NONE => return Ok(None),
        ADDR_V4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
        ADDR_V6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
        ADDR_NAME => {
            let len = usize::from(r.u8()?);
            let host = std::str::from_utf8(r.bytes(len)?)
                .map_err(|_| FrameError::Malformed("OPEN name"))?;
            if host.is_empty() {
                return Err(FrameError::Malformed("OPEN name"));
            }
            let host = host.to_owned();
            return Ok(Some(Target::Name {
                host,
                port: r.u16()?,
            }));
        }
        _ => return Err(FrameError::Malformed("OPEN address")),
    };
    Ok(Some(Target::Addr(SocketAddr::new(ip, r.u16()?))))
}

fn addr_len(addr: &Option<SocketAddr>) -> usize {
    match addr {
        None => 1,
        Some(SocketAddr::V4(_)) => 1 + 4 + 2,
        Some(SocketAddr::V6(_)) => 1 + 16 + 2,
    }
}

fn target_len(target: &Option<Target>) -> usize {
    match target {
        Some(Target::Name { host, .. }) => 1 + 1 + host.len() + 2,
        Some(Target::Addr(a)) => addr_len(&Some(*a)),
        None => 1,
    }
}

fn emit_target(w: &mut Writer<'_>, target: &Option<Target>) {
    match target {
        // Checked against MAX_NAME_LEN (and not empty) when the stream is opened.
        Some(Target::Name { host, port }) => {
            w.u8(ADDR_NAME);
            w.u8(host.len() as u8);
            w.bytes(host.as_bytes());
            w.u16(*port);
        }
        Some(Target::Addr(a)) => emit_addr(w, &Some(*a)),
        None => emit_addr(w, &None),
    }
}

fn emit_addr(w: &mut Writer<'_>, addr: &Option<SocketAddr>) {
    match addr {
        None => w.u8(ADDR_NONE),
        Some(SocketAddr::V4(a)) => {
            w.u8(ADDR_V4);
            w.bytes(&a.ip().octets());
            w.u16(a.port());
        }
        Some(SocketAddr::V6(a)) => {
            w.u8(ADDR_V6);
            w.bytes(&a.ip().octets());
            w.u16(a.port());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range_set::RangeSet;
    use crate::wire::stream::MAX_HINT_LEN;
    use proptest::prelude::*;

    fn parse_all(bytes: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
        Frames::new(bytes).collect()
    }

    /// `frame`'s bytes, checked to be as long as `encoded_len` said and to parse back to it.
    fn encoded(frame: &Frame<'_>) -> Vec<u8> {
        let mut buf = [0u8; 512];
        let mut w = Writer::new(&mut buf);
        assert!(frame.encode_if_fits(&mut w), "{frame:?}");
        let n = w.len();
        let bytes = buf[..n].to_vec();
        assert_eq!(bytes.len(), frame.encoded_len(), "{frame:?}");
        assert_eq!(parse_all(&bytes), Ok(vec![frame.clone()]));
        bytes
    }

    #[test]
    fn open_round_trips_with_both_families() {
        let meta = StreamMeta {
            source: Some("10.0.0.1:40000".parse().unwrap()),
            destination: Some(Target::Addr("[fd00::2]:445".parse().unwrap())),
            transparent: true,
            scenario: 70_000,
            hint: b"smb2".to_vec(),
        };
        encoded(&Frame::Open {
            id: StreamId(4),
            meta: Cow::Borrowed(&meta),
        });
    }

    #[test]
    fn open_carries_a_destination_name() {
        let meta = StreamMeta {
            source: Some("127.0.0.1:5000".parse().unwrap()),
            destination: Some(Target::Name {
                host: "files.example.net".into(),
                port: 445,
            }),
            transparent: false,
            ..StreamMeta::default()
        };
        let id = StreamId(8);
        let bytes = encoded(&Frame::Open {
            id,
            meta: Cow::Borrowed(&meta),
        });
        // A name as the source, an empty name, bytes that are not UTF-8, unknown flags.
        let bad = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = bytes.clone();
            edit(&mut bytes);
            parse_all(&bytes).is_err()
        };
        let flags_at = 1 + varint_len(id.0) + varint_len(0);
        assert!(bad(&|b| b[flags_at] = 0x80));
        let source_at = flags_at + 1;
        assert!(bad(&|b| b[source_at] = ADDR_NAME));
        let name_at = source_at + addr_len(&meta.source);
        assert!(bad(&|b| b[name_at + 1] = 0));
        assert!(bad(&|b| b[name_at + 2] = 0xff));
    }

    #[test]
    fn stream_frames_round_trip_and_bad_ones_fail() {
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        let header = StreamHeader {
            id: StreamId(9),
            offset: 1 << 40,
            len: 3,
            fin: true,
            push: true,
        };
        header.encode(&mut w);
        w.bytes(b"abc");
        assert_eq!(w.len(), header.encoded_len() + 3);
        let n = w.len();
        assert_eq!(
            parse_all(&buf[..n]),
            Ok(vec![Frame::Stream(StreamFrame {
                id: StreamId(9),
                offset: 1 << 40,
                fin: true,
                push: true,
                data: b"abc",
            })])
        );
        // A declared length beyond the packet is truncation, not a panic.
        assert_eq!(parse_all(&buf[..n - 1]), Err(FrameError::Truncated));
        assert_eq!(parse_all(&[0x3f]), Err(FrameError::UnknownType(0x3f)));
    }

    #[test]
    fn ack_with_impossible_ranges_is_malformed() {
        // largest 5, first range 9: would go below zero.
        assert_eq!(
            parse_all(&[ACK as u8, 5, 0, 1, 9]),
            Err(FrameError::Malformed("ACK"))
        );
        assert_eq!(
            parse_all(&[ACK as u8, 5, 0, 0]),
            Err(FrameError::Malformed("ACK"))
        );
    }

    /// Every kind of frame, written after `encoded_len` said its size, parses back to itself.
    #[test]
    fn every_frame_round_trips_at_its_encoded_length() {
        let mut received = RangeSet::new();
        for r in [3..5, 9..10, 20..31] {
            received.insert(r);
        }
        let meta = StreamMeta {
            source: Some("[fd00::1]:5000".parse().unwrap()),
            destination: Some(Target::Addr("10.0.0.2:80".parse().unwrap())),
            transparent: true,
            scenario: 3,
            hint: vec![b'h'; MAX_HINT_LEN],
        };
        let frames = [
            Frame::Padding,
            Frame::Ping,
            Frame::Ack(Ack::acknowledging(received.iter(), 77, 100).unwrap()),
            Frame::Recovered(Ack::recovering(received.iter(), 100).unwrap()),
            Frame::Close {
                code: 0x100,
                reason: b"protocol violation",
            },
            Frame::MaxData(1 << 40),
            Frame::MaxStreamData {
                id: StreamId(5),
                max: 70_000,
            },
            Frame::MaxStreams(1000),
            Frame::Control {
                seq: 63,
                data: b"hello",
            },
            Frame::Open {
                id: StreamId(4),
                meta: Cow::Borrowed(&meta),
            },
            Frame::Reset {
                id: StreamId(7),
                code: 2,
                final_size: 1 << 20,
            },
            Frame::Stream(StreamFrame {
                id: StreamId(1),
                offset: 16_383,
                fin: false,
                push: false,
                data: b"data",
            }),
        ];
        for frame in frames {
            let n = encoded(&frame).len();
            // One byte too few: nothing is written.
            let mut short = vec![0u8; n - 1];
            let mut w = Writer::new(&mut short);
            assert!(!frame.encode_if_fits(&mut w));
            assert_eq!(w.len(), 0);
        }
    }

    proptest! {
        /// Whatever set of packet numbers was received, the ACK frame written for it parses
        /// back to the highest ranges of that set.
        #[test]
        fn ack_round_trips(pns in proptest::collection::btree_set(0u64..5000, 1..300), room in 8usize..600) {
            let mut set = RangeSet::new();
            for pn in &pns {
                set.insert(*pn..*pn + 1);
            }
            let mut buf = vec![0u8; room];
            let mut w = Writer::new(&mut buf);
            let Some(ack) = Ack::acknowledging(set.iter(), 1234, room) else {
                prop_assert!(room < 16);
                return Ok(());
            };
            let frame = Frame::Ack(ack);
            prop_assert!(frame.encode_if_fits(&mut w));
            let n = w.len();
            prop_assert_eq!(n, frame.encoded_len());
            let frames = parse_all(&buf[..n]).unwrap();
            let Frame::Ack(ack) = &frames[0] else { panic!("not an ACK") };
            prop_assert_eq!(ack.delay_us, 1234);
            let expected: Vec<_> = set.iter().rev().map(|r| r.start..=r.end - 1).collect();
            let got: Vec<_> = ack.ranges().collect();
            prop_assert!(!got.is_empty());
            prop_assert_eq!(&expected[..got.len()], &got[..]);
        }

        #[test]
        fn any_payload_parses_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            for frame in Frames::new(&bytes) {
                if frame.is_err() { break; }
            }
        }
    }
}
