//! The handshake, both sides (PROTOCOL.md §3): a Noise IK exchange whose payloads carry the
//! transport parameters, an initiation timestamp against replays, and padding to the data
//! packets' size, so that a path which cannot carry full-size datagrams fails the handshake
//! instead of establishing a tunnel whose data vanishes (the socket sets don't-fragment).
//!
//! - The initiator's state is an [`Initiation`], held by its connection until the response.
//! - The responder's work is [`Incoming`]: the endpoint reads an initiation with it, decides
//!   whether to accept (known key, fresh timestamp, no collision), and then has it write the
//!   response, which becomes the new connection's first datagram ([`Accepted`]).

use super::error::TransportError;
use super::mtu::BASE_DATAGRAM;
use super::params::{self, ParamsError, TransportParams};
use crate::config::TransportConfig;
use crate::crypto::{self, Cipher, HandshakeError, Keys, PublicKey, SecretKey};
use crate::wire::header::{INITIATION_HEADER_LEN, RESPONSE_HEADER_LEN};
use crate::wire::{Header, Packet, Reader, Writer};
use std::time::{Duration, Instant};

/// The first handshake retry waits this long; each further one twice as long.
const HANDSHAKE_RETRY: Duration = Duration::from_secs(1);

/// The initiator's side until the response arrives.
pub(super) struct Initiation {
    secret: SecretKey,
    handshake: Option<snow::HandshakeState>,
    unix_base: Duration,
    created: Instant,
    attempts: u32,
    next_attempt: Option<Instant>,
    sent_at: Option<Instant>,
    /// The ciphers the initiation in flight offered.
    offered: u64,
}

/// What a valid response gives the initiator.
#[derive(Debug)]
pub(super) struct Response {
    pub(super) remote_id: u32,
    pub(super) keys: Keys,
    pub(super) params: TransportParams,
    /// The round trip from the initiation that was answered.
    pub(super) rtt: Option<Duration>,
}

impl Initiation {
    /// `unix_time` is the wall-clock time at `now` (since the Unix epoch): the responder
    /// refuses initiations that are not newer than the last one it accepted from this peer.
    pub(super) fn new(secret: SecretKey, now: Instant, unix_time: Duration) -> Self {
        Self {
            secret,
            handshake: None,
            unix_base: unix_time,
            created: now,
            attempts: 0,
            next_attempt: None,
            sent_at: None,
            offered: 0,
        }
    }

    /// When an initiation is (next) due.
    pub(super) fn deadline(&self) -> Instant {
        self.next_attempt.unwrap_or(self.created)
    }

    /// The retry timer fired: prepare a fresh initiation (new ephemeral key, new timestamp),
    /// or give up (`false`) after `max_attempts`.
    pub(super) fn on_timeout(&mut self, now: Instant, max_attempts: u32) -> bool {
        if self.next_attempt.is_none_or(|t| now < t) {
            // The first initiation is not out yet.
            return true;
        }
        if self.attempts >= max_attempts {
            return false;
        }
        self.next_attempt = Some(now);
        self.handshake = None;
        true
    }

    /// Writes the initiation into `buf` if one is due: `Ok(Some(size))`. An error means no
    /// initiation can ever be built (a malformed key; keys are checked when parsed).
    pub(super) fn write(
        &mut self,
        now: Instant,
        config: &TransportConfig,
        local_id: u32,
        peer: &PublicKey,
        buf: &mut [u8],
    ) -> Result<Option<usize>, HandshakeError> {
        if self.handshake.is_some() || self.next_attempt.is_some_and(|t| now < t) {
            return Ok(None);
        }
        // Payload: the wall-clock timestamp (replay protection), then our parameters, then
        // zeros to make the initiation as long as the base datagram size, which every path
        // must carry (path MTU discovery looks for more once the connection is up).
        let padded = usize::from(BASE_DATAGRAM.min(config.max_datagram))
            .saturating_sub(INITIATION_HEADER_LEN + crypto::INITIATION_OVERHEAD);
        let mut payload = vec![0u8; padded.max(8 + params::MAX_LEN)];
        let mut w = Writer::new(&mut payload);
        let elapsed = now.saturating_duration_since(self.created);
        w.u64((self.unix_base + elapsed).as_nanos() as u64);
        let params = TransportParams::from_config(config);
        params.emit(&mut w);
        self.offered = params.ciphers;
        let payload_len = w.len().max(padded);
        let mut header = [0u8; INITIATION_HEADER_LEN];
        Header::Initiation { sender: local_id }.emit(&mut Writer::new(&mut header));
        buf[..INITIATION_HEADER_LEN].copy_from_slice(&header);
        let noise = &mut buf[INITIATION_HEADER_LEN..];
        let (hs, n) =
            crypto::initiate(&self.secret, peer, &header, &payload[..payload_len], noise)?;
        self.handshake = Some(hs);
        self.sent_at = Some(now);
        self.next_attempt = Some(now + HANDSHAKE_RETRY * (1 << self.attempts.min(16)));
        self.attempts += 1;
        Ok(Some(INITIATION_HEADER_LEN + n))
    }

    /// Reads a response. `Ok(None)`: no initiation is in flight (a duplicate); errors say
    /// whether it was forged (dropped: the real one may still come) or broke the protocol.
    pub(super) fn on_response(
        &mut self,
        now: Instant,
        packet: &Packet<&mut [u8]>,
    ) -> Result<Option<Response>, ResponseError> {
        let Some(hs) = self.handshake.take() else {
            return Ok(None);
        };
        let message = packet.body();
        // Padded (see `write`): as long as the message.
        let mut payload = vec![0u8; message.len()];
        let (split, n) = match crypto::finish(hs, message, &mut payload) {
            Ok(done) => done,
            Err(e) => {
                tracing::trace!(error = %e, "handshake response rejected");
                return Err(ResponseError::Forged);
            }
        };
        // The responder's id is taken from the authenticated payload, not the cleartext header.
        let mut r = Reader::new(&payload[..n]);
        let (remote_id, params) = r
            .u32()
            .map_err(ParamsError::from)
            .and_then(|id| Ok((id, TransportParams::parse(&mut r)?)))
            .map_err(|e| ResponseError::Violation(TransportError::violation(None, e)))?;
        let rtt = self.sent_at.map(|sent| now.saturating_duration_since(sent));
        let keys = split.keys(Cipher::agree(self.offered, params.ciphers));
        Ok(Some(Response {
            remote_id,
            keys,
            params,
            rtt,
        }))
    }
}

/// A response the initiator cannot use.
#[derive(Debug)]
pub(super) enum ResponseError {
    /// It does not authenticate.
    Forged,
    /// It authenticates, but its parameters break the protocol.
    Violation(TransportError),
}

impl std::fmt::Debug for Initiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiation")
            .field("attempts", &self.attempts)
            .field("next_attempt", &self.next_attempt)
            .finish_non_exhaustive()
    }
}

/// A handshake initiation that decrypted, read by the responder.
pub(crate) struct Incoming {
    handshake: snow::HandshakeState,
    /// The initiator's static key: the endpoint checks it against its peers.
    pub(crate) peer: PublicKey,
    /// The initiator's connection id.
    pub(crate) sender: u32,
    /// The initiation's wall-clock timestamp (Unix nanoseconds): the endpoint refuses one not
    /// newer than the last it accepted from the same peer.
    pub(crate) timestamp: u64,
    params: TransportParams,
    /// The initiation's length: the response is never longer.
    request_len: usize,
}

/// What accepting an initiation gives the new connection.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub(crate) remote_id: u32,
    pub(crate) keys: Keys,
    pub(crate) params: TransportParams,
    /// The response datagram, the connection's first transmit.
    pub(crate) response: Vec<u8>,
}

/// Why an initiation gets no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Rejected {
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error("not an initiation")]
    NotInitiation,
}

impl Incoming {
    /// Reads an initiation with this side's static key.
    pub(crate) fn read(secret: &SecretKey, datagram: &[u8]) -> Result<Self, Rejected> {
        let packet = Packet::new_checked(datagram).map_err(|_| Rejected::NotInitiation)?;
        let Header::Initiation { sender } = packet.header() else {
            return Err(Rejected::NotInitiation);
        };
        let message = packet.body();
        // Initiations are padded to the initiator's datagram size.
        let mut payload = vec![0u8; message.len()];
        let (handshake, peer, n) =
            crypto::accept(secret, packet.header_bytes(), message, &mut payload)?;
        let (timestamp, params) = parse_initiation_payload(&payload[..n])?;
        Ok(Self {
            handshake,
            peer,
            sender,
            timestamp,
            params,
            request_len: datagram.len(),
        })
    }

    /// Writes the response for a connection with id `local_id`. It is padded like the
    /// initiation, to the initiation's length or the base datagram size if smaller (never
    /// larger than the request, so the handshake amplifies nothing): a path that cannot carry
    /// base-size datagrams back fails the handshake too.
    pub(crate) fn respond(
        self,
        config: &TransportConfig,
        local_id: u32,
    ) -> Result<Accepted, HandshakeError> {
        let target = self
            .request_len
            .min(usize::from(BASE_DATAGRAM.min(config.max_datagram)));
        let padded = target.saturating_sub(RESPONSE_HEADER_LEN + crypto::RESPONSE_OVERHEAD);
        let mut payload = vec![0u8; padded.max(4 + params::MAX_LEN)];
        let ours = TransportParams::from_config(config);
        let payload_len = {
            let mut w = Writer::new(&mut payload);
            w.u32(local_id);
            ours.emit(&mut w);
            w.len().max(padded)
        };
        let mut response = vec![0u8; RESPONSE_HEADER_LEN + crypto::RESPONSE_OVERHEAD + payload_len];
        Header::Response {
            sender: local_id,
            receiver: self.sender,
        }
        .emit(&mut Writer::new(&mut response));
        let out = &mut response[RESPONSE_HEADER_LEN..];
        let (split, n) = crypto::respond(self.handshake, &payload[..payload_len], out)?;
        let keys = split.keys(Cipher::agree(ours.ciphers, self.params.ciphers));
        response.truncate(RESPONSE_HEADER_LEN + n);
        debug_assert!(
            response.len() <= self.request_len,
            "the answer is never larger than the request"
        );
        Ok(Accepted {
            remote_id: self.sender,
            keys,
            params: self.params,
            response,
        })
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("peer", &self.peer)
            .field("sender", &self.sender)
            .finish_non_exhaustive()
    }
}

/// Parses an initiation's payload: the timestamp (Unix nanoseconds) and the parameters.
pub(crate) fn parse_initiation_payload(
    payload: &[u8],
) -> Result<(u64, TransportParams), ParamsError> {
    let mut r = Reader::new(payload);
    let timestamp = r.u64()?;
    let params = TransportParams::parse(&mut r)?;
    Ok((timestamp, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_datagram: u16) -> TransportConfig {
        TransportConfig {
            max_datagram,
            ..TransportConfig::default()
        }
    }

    /// An initiation from `a` to `b` and back: both sides end with keys, the responder learns
    /// the initiator's id and key, the initiator the responder's id and an RTT sample.
    #[test]
    fn initiation_and_response_agree_and_are_padded_to_the_base_datagram_size() {
        let t0 = crate::test_epoch();
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let mut init = Initiation::new(a.clone(), t0, Duration::from_secs(1_700_000_000));
        let mut buf = vec![0u8; 1500];
        let n = init
            .write(t0, &config(1400), 7, &b.public_key(), &mut buf)
            .unwrap()
            .expect("due at once");
        assert_eq!(
            n,
            usize::from(BASE_DATAGRAM),
            "padded to the base size, not max_datagram"
        );
        assert_eq!(
            init.write(t0, &config(1400), 7, &b.public_key(), &mut buf)
                .unwrap(),
            None
        );
        assert_eq!(init.deadline(), t0 + HANDSHAKE_RETRY);

        let incoming = Incoming::read(&b, &buf[..n]).unwrap();
        assert_eq!((incoming.peer, incoming.sender), (a.public_key(), 7));
        // As long as the request, whatever the responder's own max_datagram.
        let mut accepted = incoming.respond(&config(1300), 9).unwrap();
        assert_eq!(accepted.response.len(), usize::from(BASE_DATAGRAM));
        assert_eq!(accepted.remote_id, 7);

        let t1 = t0 + Duration::from_millis(40);
        let packet = Packet::new_checked(&mut accepted.response[..]).unwrap();
        let response = init.on_response(t1, &packet).unwrap().expect("accepted");
        assert_eq!(response.remote_id, 9);
        assert_eq!(response.params.max_datagram, 1300);
        assert_eq!(response.rtt, Some(Duration::from_millis(40)));
        // The same response again finds no initiation in flight.
        assert!(init.on_response(t1, &packet).unwrap().is_none());
    }

    /// Both sides pick the same cipher from the two offers, and it seals and opens.
    #[test]
    fn both_sides_agree_on_the_cipher() {
        let t0 = crate::test_epoch();
        let aes = crypto::hardware_aes();
        for (initiator_aes, responder_aes, expected) in [
            (
                true,
                true,
                if aes {
                    Cipher::Aes256Gcm
                } else {
                    Cipher::ChaCha20Poly1305
                },
            ),
            (true, false, Cipher::ChaCha20Poly1305),
            (false, true, Cipher::ChaCha20Poly1305),
        ] {
            let (a, b) = (SecretKey::generate(), SecretKey::generate());
            let with = |aes_gcm| TransportConfig {
                aes_gcm,
                ..TransportConfig::default()
            };
            let mut init = Initiation::new(a, t0, Duration::from_secs(1_700_000_000));
            let mut buf = vec![0u8; 1500];
            let n = init
                .write(t0, &with(initiator_aes), 7, &b.public_key(), &mut buf)
                .unwrap()
                .unwrap();
            let incoming = Incoming::read(&b, &buf[..n]).unwrap();
            let mut accepted = incoming.respond(&with(responder_aes), 9).unwrap();
            let packet = Packet::new_checked(&mut accepted.response[..]).unwrap();
            let mut response = init.on_response(t0, &packet).unwrap().unwrap();
            assert_eq!(
                (response.keys.cipher(), accepted.keys.cipher()),
                (expected, expected)
            );
            let phase = response.keys.send_phase(t0);
            let mut data = *b"agreed";
            let tag = response.keys.seal(1, b"h", &mut data);
            assert!(accepted.keys.open(t0, phase, 1, b"h", &mut data, &tag));
            assert_eq!(&data, b"agreed");
        }
    }

    #[test]
    fn an_initiation_for_another_key_or_a_garbled_one_is_rejected() {
        let t0 = crate::test_epoch();
        let (a, b, c) = (
            SecretKey::generate(),
            SecretKey::generate(),
            SecretKey::generate(),
        );
        let mut init = Initiation::new(a, t0, Duration::ZERO);
        let mut buf = vec![0u8; 1500];
        let n = init
            .write(t0, &config(1400), 7, &b.public_key(), &mut buf)
            .unwrap()
            .unwrap();
        assert!(matches!(
            Incoming::read(&c, &buf[..n]),
            Err(Rejected::Handshake(_))
        ));
        buf[n - 1] ^= 1;
        assert!(Incoming::read(&b, &buf[..n]).is_err());
        assert!(matches!(
            Incoming::read(&b, &buf[..3]),
            Err(Rejected::NotInitiation)
        ));
    }

    #[test]
    fn retries_back_off_and_end() {
        let t0 = crate::test_epoch();
        let peer = SecretKey::generate().public_key();
        let mut init = Initiation::new(SecretKey::generate(), t0, Duration::ZERO);
        let mut buf = vec![0u8; 1500];
        let mut now = t0;
        for attempt in 0..3 {
            assert!(
                init.write(now, &config(1400), 1, &peer, &mut buf)
                    .unwrap()
                    .is_some()
            );
            assert_eq!(init.deadline(), now + HANDSHAKE_RETRY * (1 << attempt));
            now = init.deadline();
            assert!(init.on_timeout(now, 3) || attempt == 2);
        }
        assert!(!init.on_timeout(now, 3));
    }
}
