//! Traffic for the lab. [`send_paced`] offers a constant UDP load; [`probe`] and [`echo`]
//! time small requests and their answers; [`exchange`] and [`answer`] time large answers to
//! small requests, one outstanding at a time; [`sessions`] and [`echo_server`] open and hold
//! many concurrent sessions. The rest is verified TCP traffic: a sender that pushes a deterministic stream over M parallel TCP connections
//! for N bytes or S seconds, and a sink that checks every byte against the same stream.
//!
//! Each connection starts with a 40-byte header (magic `WSXT`, version, payload kind, flow number,
//! seed, the run's origin time, the byte count or 0 for a timed run). When the sender half-closes,
//! the sink answers with a 16-byte receipt (magic `WSXR`, verdict, bytes received), so both ends
//! know the transfer arrived whole: bytes sent equal bytes received and every byte matched.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, shared by all namespaces of the host: the sink
//! measures time to first byte and per-flow rates in 100 ms buckets from the sender's origin.

mod exchange;
mod payload;
mod probe;
mod send;
mod sessions;
mod sink;
mod tunnel;
mod udp;

pub use exchange::{AnswerReport, ExchangeOptions, ExchangeReport, answer, exchange};
pub use payload::{Payload, PayloadKind};
pub use probe::{ProbeOptions, ProbeReport, echo, probe};
pub use send::{SendOptions, SendReport, SentFlow, send};
pub use sessions::{
    SMB_FILE_LEN, SMB_READ_LEN, SessionTimes, SessionsOptions, SessionsReport, Speak, echo_server,
    sessions, smb_server,
};
pub use sink::{FlowReport, SinkOptions, SinkReport, sink};
pub use tunnel::{TunnelKeys, TunnelReport, tunnel_send, tunnel_sink};
pub use udp::send_paced;

/// Width of a rate bucket.
pub const BUCKET_NS: u64 = 100_000_000;

const MAGIC_HEADER: [u8; 4] = *b"WSXT";
const MAGIC_RECEIPT: [u8; 4] = *b"WSXR";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 40;
const RECEIPT_LEN: usize = 16;

/// The first bytes of every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: PayloadKind,
    flow: u16,
    seed: u64,
    origin_ns: u64,
    /// 0: as many as the sender sends before it half-closes.
    total_bytes: u64,
}

impl Header {
    fn emit(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC_HEADER);
        b[4] = VERSION;
        b[5] = self.kind.code();
        b[6..8].copy_from_slice(&self.flow.to_be_bytes());
        b[8..16].copy_from_slice(&self.seed.to_be_bytes());
        b[16..24].copy_from_slice(&self.origin_ns.to_be_bytes());
        b[24..32].copy_from_slice(&self.total_bytes.to_be_bytes());
        b
    }

    fn parse(b: &[u8; HEADER_LEN]) -> Result<Self, String> {
        if b[0..4] != MAGIC_HEADER {
            return Err(format!("not a wsx-lab stream (magic {:02x?})", &b[0..4]));
        }
        if b[4] != VERSION {
            return Err(format!("unsupported version {}", b[4]));
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Ok(Header {
            kind: PayloadKind::from_code(b[5])
                .ok_or_else(|| format!("unknown payload kind {}", b[5]))?,
            flow: u16::from_be_bytes([b[6], b[7]]),
            seed: u64_at(8),
            origin_ns: u64_at(16),
            total_bytes: u64_at(24),
        })
    }
}

/// The sink's answer after the sender half-closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Receipt {
    verified: bool,
    bytes: u64,
}

impl Receipt {
    fn emit(&self) -> [u8; RECEIPT_LEN] {
        let mut b = [0u8; RECEIPT_LEN];
        b[0..4].copy_from_slice(&MAGIC_RECEIPT);
        b[4] = u8::from(self.verified);
        b[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        b
    }

    fn parse(b: &[u8; RECEIPT_LEN]) -> Result<Self, String> {
        if b[0..4] != MAGIC_RECEIPT {
            return Err("malformed receipt".into());
        }
        Ok(Receipt {
            verified: b[4] == 1,
            bytes: u64::from_be_bytes(b[8..16].try_into().unwrap_or([0; 8])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_receipt_round_trip() {
        let h = Header {
            kind: PayloadKind::Text,
            flow: 9,
            seed: 77,
            origin_ns: 123,
            total_bytes: 1 << 40,
        };
        assert_eq!(Header::parse(&h.emit()), Ok(h));
        let r = Receipt {
            verified: true,
            bytes: 5,
        };
        assert_eq!(Receipt::parse(&r.emit()), Ok(r));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Header::parse(&[0xff; HEADER_LEN]).is_err());
        let mut h = Header {
            kind: PayloadKind::Random,
            flow: 0,
            seed: 0,
            origin_ns: 0,
            total_bytes: 0,
        }
        .emit();
        h[5] = 9;
        assert!(Header::parse(&h).is_err());
        assert!(Receipt::parse(&[0; RECEIPT_LEN]).is_err());
    }
}
