//! Frames: the decrypted payload of a data packet is a sequence of frames (PROTOCOL.md §4).
//!
//! [`Frames`] parses a payload lazily and never panics: malformed input yields a
//! [`FrameError`], which closes the connection. Emitters write into a caller's buffer and
//! report their size beforehand so that packets are filled exactly.

use crate::coding::{Reader, Truncated, Writer, varint_len};
use crate::streams::{StreamId, StreamMeta, Target};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;

pub(crate) const PADDING: u64 = 0x00;
pub(crate) const PING: u64 = 0x01;
pub(crate) const ACK: u64 = 0x02;
pub(crate) const CLOSE: u64 = 0x03;
pub(crate) const MAX_DATA: u64 = 0x04;
pub(crate) const MAX_STREAM_DATA: u64 = 0x05;
pub(crate) const MAX_STREAMS: u64 = 0x06;
pub(crate) const CONTROL: u64 = 0x07;
pub(crate) const OPEN: u64 = 0x08;
pub(crate) const RESET: u64 = 0x09;
/// Packets the receiver rebuilt from parity: laid out as ACK, with a zero delay.
pub(crate) const RECOVERED: u64 = 0x0a;
/// STREAM frames use types 0x10-0x13: bit 0 is FIN, bit 1 says an explicit length follows.
pub(crate) const STREAM: u64 = 0x10;
const STREAM_FIN: u64 = 0x01;
const STREAM_LEN: u64 = 0x02;

/// The most ACK ranges a frame may carry. Senders write fewer when space is short; a frame
/// with more is malformed.
pub(crate) const MAX_ACK_RANGES: usize = 32;
/// The longest application hint an OPEN frame carries.
pub const MAX_HINT_LEN: usize = 255;

/// The longest destination name an OPEN frame carries (a DNS name is at most 253).
pub const MAX_NAME_LEN: usize = 255;
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
        meta: StreamMeta,
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
    pub(crate) data: &'a [u8],
}

/// An ACK frame: the largest packet number received, how long the receiver held it before
/// acknowledging, and the received ranges, highest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ack {
    pub(crate) delay_us: u64,
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
                meta: parse_meta(r)?,
            },
            RESET => Frame::Reset {
                id: StreamId(r.varint()?),
                code: r.varint()?,
                final_size: r.varint()?,
            },
            t if t & !(STREAM_FIN | STREAM_LEN) == STREAM => {
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
                    .is_none_or(|end| end > crate::coding::VARINT_MAX)
                {
                    return Err(FrameError::Malformed("STREAM"));
                }
                Frame::Stream(StreamFrame {
                    id,
                    offset,
                    fin: t & STREAM_FIN != 0,
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

pub(crate) fn open_len(id: StreamId, meta: &StreamMeta) -> usize {
    1 + varint_len(id.0)
        + varint_len(u64::from(meta.scenario))
        + 1
        + addr_len(&meta.source)
        + target_len(&meta.destination)
        + 1
        + meta.hint.len()
}

pub(crate) fn emit_open(w: &mut Writer<'_>, id: StreamId, meta: &StreamMeta) {
    w.varint(OPEN);
    w.varint(id.0);
    w.varint(u64::from(meta.scenario));
    w.u8(if meta.transparent {
        OPEN_TRANSPARENT
    } else {
        0
    });
    emit_addr(w, &meta.source);
    emit_target(w, &meta.destination);
    // `StreamMeta::hint` is checked against MAX_HINT_LEN when the stream is opened.
    w.u8(meta.hint.len() as u8);
    w.bytes(&meta.hint);
}

/// Writes an ACK frame for `ranges` (received packet numbers, ascending, half-open), highest
/// first, as many ranges as fit in `w` (at most [`MAX_ACK_RANGES`]). Returns whether anything was
/// written: nothing is when even one range does not fit.
pub(crate) fn emit_ack(
    w: &mut Writer<'_>,
    ranges: impl DoubleEndedIterator<Item = std::ops::Range<u64>>,
    delay_us: u64,
) -> bool {
    emit_ranges(w, ACK, ranges, delay_us)
}

/// Writes a RECOVERED frame for `ranges` as [`emit_ack`] writes an ACK.
pub(crate) fn emit_recovered(
    w: &mut Writer<'_>,
    ranges: impl DoubleEndedIterator<Item = std::ops::Range<u64>>,
) -> bool {
    emit_ranges(w, RECOVERED, ranges, 0)
}

fn emit_ranges(
    w: &mut Writer<'_>,
    ty: u64,
    ranges: impl DoubleEndedIterator<Item = std::ops::Range<u64>>,
    delay_us: u64,
) -> bool {
    // Encode into a scratch buffer first: the range count precedes the ranges and depends on
    // how many fit.
    let mut scratch = [0u8; 2 * 8 * MAX_ACK_RANGES];
    let mut body = Writer::new(&mut scratch);
    let mut ranges = ranges.rev();
    let Some(top) = ranges.next() else {
        return false;
    };
    let largest = top.end - 1;
    let head_len = |count: usize| {
        varint_len(ty) + varint_len(largest) + varint_len(delay_us) + varint_len(count as u64)
    };
    body.varint(top.end - 1 - top.start);
    if head_len(1) + body.len() > w.remaining() {
        return false;
    }
    let mut count = 1;
    let mut low = top.start;
    for range in ranges.take(MAX_ACK_RANGES - 1) {
        let gap = low - range.end - 1;
        let len = range.end - 1 - range.start;
        let add = varint_len(gap) + varint_len(len);
        if head_len(count + 1) + body.len() + add > w.remaining() {
            break;
        }
        body.varint(gap);
        body.varint(len);
        count += 1;
        low = range.start;
    }
    let body_len = body.len();
    w.varint(ty);
    w.varint(largest);
    w.varint(delay_us);
    w.varint(count as u64);
    w.bytes(&scratch[..body_len]);
    true
}

/// The header size of a STREAM frame with an explicit length.
pub(crate) fn stream_header_len(id: StreamId, offset: u64, len: usize) -> usize {
    1 + varint_len(id.0) + varint_len(offset) + varint_len(len as u64)
}

/// Writes a STREAM frame header with an explicit length; the caller writes `len` data bytes.
pub(crate) fn emit_stream_header(
    w: &mut Writer<'_>,
    id: StreamId,
    offset: u64,
    len: usize,
    fin: bool,
) {
    w.varint(STREAM | STREAM_LEN | if fin { STREAM_FIN } else { 0 });
    w.varint(id.0);
    w.varint(offset);
    w.varint(len as u64);
}

pub(crate) fn emit_varint_frame(w: &mut Writer<'_>, ty: u64, values: &[u64]) {
    w.varint(ty);
    for &v in values {
        w.varint(v);
    }
}

pub(crate) fn varint_frame_len(ty: u64, values: &[u64]) -> usize {
    varint_len(ty) + values.iter().map(|&v| varint_len(v)).sum::<usize>()
}

pub(crate) fn control_len(seq: u64, data: &[u8]) -> usize {
    varint_len(CONTROL) + varint_len(seq) + varint_len(data.len() as u64) + data.len()
}

pub(crate) fn emit_control(w: &mut Writer<'_>, seq: u64, data: &[u8]) {
    w.varint(CONTROL);
    w.varint(seq);
    w.varint(data.len() as u64);
    w.bytes(data);
}

pub(crate) fn emit_close(w: &mut Writer<'_>, code: u64, reason: &[u8]) {
    w.varint(CLOSE);
    w.varint(code);
    w.varint(reason.len() as u64);
    w.bytes(reason);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range_set::RangeSet;
    use proptest::prelude::*;

    fn parse_all(bytes: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
        Frames::new(bytes).collect()
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
        let id = StreamId(4);
        let mut buf = [0u8; 128];
        let mut w = Writer::new(&mut buf);
        emit_open(&mut w, id, &meta);
        let n = w.len();
        assert_eq!(n, open_len(id, &meta));
        assert_eq!(parse_all(&buf[..n]), Ok(vec![Frame::Open { id, meta }]));
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
        let mut buf = [0u8; 128];
        let mut w = Writer::new(&mut buf);
        emit_open(&mut w, id, &meta);
        let n = w.len();
        assert_eq!(n, open_len(id, &meta));
        assert_eq!(
            parse_all(&buf[..n]),
            Ok(vec![Frame::Open {
                id,
                meta: meta.clone()
            }])
        );
        // A name as the source, an empty name, bytes that are not UTF-8, unknown flags.
        let bad = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = buf[..n].to_vec();
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
        emit_stream_header(&mut w, StreamId(9), 1 << 40, 3, true);
        w.bytes(b"abc");
        let n = w.len();
        assert_eq!(
            parse_all(&buf[..n]),
            Ok(vec![Frame::Stream(StreamFrame {
                id: StreamId(9),
                offset: 1 << 40,
                fin: true,
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
            if !emit_ack(&mut w, set.iter(), 1234) {
                prop_assert!(room < 16);
                return Ok(());
            }
            let n = w.len();
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
