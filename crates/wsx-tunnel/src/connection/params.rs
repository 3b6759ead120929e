//! Transport parameters: the limits each side declares in its handshake message
//! (PROTOCOL.md §3.3), encrypted inside the Noise payload.

use crate::config::TransportConfig;
use crate::crypto::Cipher;
use crate::wire::coding::{Reader, Truncated, Writer};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TransportParams {
    pub(crate) max_streams: u64,
    pub(crate) stream_window: u64,
    pub(crate) connection_window: u64,
    pub(crate) max_datagram: u64,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_ack_delay: Duration,
    /// The packet ciphers the sender can run (bits: 1 ChaCha20-Poly1305, 2 AES-256-GCM);
    /// both sides pick the same one from the two offers ([`Cipher::agree`]).
    pub(crate) ciphers: u64,
    /// What the sender understands beyond version 1 as first specified: the low half the
    /// tunnel's in bits 0-15 ([`EXTENSION_PUSH`]), its application's in bits 16-47
    /// ([`TransportConfig::app_extensions`], at [`APP_EXTENSIONS_SHIFT`]).
    pub(crate) extensions: u64,
}

/// In `extensions`: the sender parses STREAM frames with the PUSH bit, so the peer may set it.
pub(crate) const EXTENSION_PUSH: u64 = 1;
/// Where the application's bits start in `extensions` (all 32 stay inside a varint).
pub(crate) const APP_EXTENSIONS_SHIFT: u32 = 16;

/// Encoded size bound: eight varints.
pub(crate) const MAX_LEN: usize = 8 * 8;

/// The smallest datagram a peer may declare; below it no useful packet fits.
const MIN_DATAGRAM: u64 = 1200;

impl TransportParams {
    pub(crate) fn from_config(config: &TransportConfig) -> Self {
        Self {
            max_streams: config.max_concurrent_streams,
            stream_window: config.stream_window,
            connection_window: config.connection_window,
            max_datagram: u64::from(config.max_datagram),
            idle_timeout: config.idle_timeout,
            max_ack_delay: config.max_ack_delay,
            ciphers: Cipher::offer(config.aes_gcm),
            extensions: EXTENSION_PUSH | u64::from(config.app_extensions) << APP_EXTENSIONS_SHIFT,
        }
    }

    pub(crate) fn emit(&self, w: &mut Writer<'_>) {
        w.varint(self.max_streams);
        w.varint(self.stream_window);
        w.varint(self.connection_window);
        w.varint(self.max_datagram);
        w.varint(self.idle_timeout.as_millis() as u64);
        w.varint(self.max_ack_delay.as_micros() as u64);
        w.varint(self.ciphers);
        w.varint(self.extensions);
    }

    /// Parses the peer's parameters; values outside what the protocol allows are errors.
    pub(crate) fn parse(r: &mut Reader<'_>) -> Result<Self, ParamsError> {
        let params = Self {
            max_streams: r.varint()?,
            stream_window: r.varint()?,
            connection_window: r.varint()?,
            max_datagram: r.varint()?,
            idle_timeout: Duration::from_millis(r.varint()?),
            max_ack_delay: Duration::from_micros(r.varint()?),
            // Added after the first six: a peer that predates them leaves the padding's
            // zeros here (or nothing), which offers no cipher but the one every peer has and
            // no extension.
            ciphers: if r.is_empty() { 0 } else { r.varint()? },
            extensions: if r.is_empty() { 0 } else { r.varint()? },
        };
        if !(MIN_DATAGRAM..=65_527).contains(&params.max_datagram) {
            return Err(ParamsError::Invalid("max_datagram"));
        }
        if params.max_ack_delay > Duration::from_secs(1) {
            return Err(ParamsError::Invalid("max_ack_delay"));
        }
        Ok(params)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParamsError {
    #[error("truncated transport parameters")]
    Truncated,
    #[error("invalid transport parameter {0}")]
    Invalid(&'static str),
}

impl From<Truncated> for ParamsError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_validation() {
        let params = TransportParams::from_config(&TransportConfig::default());
        let mut buf = [0u8; MAX_LEN];
        let mut w = Writer::new(&mut buf);
        params.emit(&mut w);
        let n = w.len();
        assert_eq!(
            TransportParams::parse(&mut Reader::new(&buf[..n])),
            Ok(params)
        );
        // Without the last two parameters (a peer from before `ciphers` and `extensions`,
        // with or without its padding's zeros) the offer is ChaCha20-Poly1305 alone and no
        // extension; without the last, no extension; cut shorter, it is truncated.
        let older = TransportParams {
            ciphers: 0,
            extensions: 0,
            ..params
        };
        assert_eq!(
            TransportParams::parse(&mut Reader::new(&buf[..n - 2])),
            Ok(older)
        );
        assert_eq!(
            TransportParams::parse(&mut Reader::new(&buf[..n - 1])),
            Ok(TransportParams {
                extensions: 0,
                ..params
            })
        );
        let mut padded = buf;
        padded[n - 2..].fill(0);
        assert_eq!(TransportParams::parse(&mut Reader::new(&padded)), Ok(older));
        assert_eq!(
            TransportParams::parse(&mut Reader::new(&buf[..n - 3])),
            Err(ParamsError::Truncated)
        );
        // The application's bits travel above the tunnel's.
        let app = TransportParams::from_config(&TransportConfig {
            app_extensions: u32::MAX,
            ..TransportConfig::default()
        });
        let mut w = Writer::new(&mut buf);
        app.emit(&mut w);
        let n = w.len();
        let back = TransportParams::parse(&mut Reader::new(&buf[..n]));
        assert_eq!(back, Ok(app));
        assert_eq!(app.extensions >> APP_EXTENSIONS_SHIFT, u64::from(u32::MAX));
        assert_eq!(app.extensions & 0xffff, EXTENSION_PUSH);
        let small = TransportParams {
            max_datagram: 100,
            ..params
        };
        let mut w = Writer::new(&mut buf);
        small.emit(&mut w);
        let n = w.len();
        assert_eq!(
            TransportParams::parse(&mut Reader::new(&buf[..n])),
            Err(ParamsError::Invalid("max_datagram"))
        );
    }
}
