//! Keys, the Noise IK handshake and packet protection (PROTOCOL.md §3).
//!
//! Peers are identified by static Curve25519 keys, configured as base64 strings the way
//! WireGuard does it. The handshake is `Noise_IK_25519_ChaChaPoly_BLAKE2s` (WireGuard's
//! pattern, through the `snow` crate): the initiator knows the responder's public key and
//! proves its own in the first message, so the responder can refuse an unknown peer before it
//! keeps any state or sends anything, and both sides have session keys after one round trip.
//!
//! Data packets are sealed under the keys the handshake split into, with the packet number as
//! the nonce (never reused: packet numbers only grow) and the cleartext header as associated
//! data, by the [`Cipher`] both sides agreed on: AES-256-GCM when both have AES and carry-less
//! multiply instructions, ChaCha20-Poly1305 otherwise. Both are ring's (the assembly BoringSSL
//! ships): on this project's machine, sealing 1,440 bytes, AES-256-GCM costs about a third of
//! ChaCha20-Poly1305, which costs a third of the portable `chacha20poly1305` crate
//! (`benches/aead.rs`). Each direction updates its key on its own after a bounded number
//! of packets or time ([`KEY_UPDATE_PACKETS`], [`KEY_UPDATE_INTERVAL`]) with the Noise `REKEY`
//! function, flipping the key-phase bit of the header; the old key is erased, so a key captured
//! later cannot open traffic sent before the update.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{
    AES_256_GCM, Aad, Algorithm, CHACHA20_POLY1305, LessSafeKey, Nonce, Tag, UnboundKey,
};
use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};
use std::fmt;
use std::mem::ManuallyDrop;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The Noise protocol name.
pub(crate) const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// Bound into the handshake hash, so that a handshake for another protocol or version of this
/// one can never complete.
const PROLOGUE: &[u8] = b"wsx tunnel 1";
/// Bytes of the AEAD tag.
pub(crate) const TAG_LEN: usize = 16;

/// Bytes Noise IK adds to the initiator's payload in message 1: its ephemeral key, its static
/// key (encrypted, with a tag) and the payload's tag.
pub(crate) const INITIATION_OVERHEAD: usize = KEY_LEN + (KEY_LEN + TAG_LEN) + TAG_LEN;
/// Bytes Noise IK adds to the responder's payload in message 2: its ephemeral key and the
/// payload's tag.
pub(crate) const RESPONSE_OVERHEAD: usize = KEY_LEN + TAG_LEN;
/// Bytes of a Curve25519 key.
pub const KEY_LEN: usize = 32;
/// A direction's key is updated after this many packets...
pub const KEY_UPDATE_PACKETS: u64 = 1 << 24;
/// ... or this much time, whichever comes first.
pub const KEY_UPDATE_INTERVAL: Duration = Duration::from_secs(120);

/// A peer's public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; KEY_LEN]);

/// This gateway's private key. It prints masked, and is erased when dropped.
#[derive(Clone)]
pub struct SecretKey([u8; KEY_LEN]);

/// A key string that is not a base64-encoded 32-byte key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not base64.
    #[error("not base64: {0}")]
    Base64(String),
    /// The key has the wrong length.
    #[error("a key is {KEY_LEN} bytes, this one is {0}")]
    Length(usize),
}

impl PublicKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl SecretKey {
    /// A new random key, from the operating system's generator.
    pub fn generate() -> Self {
        // The generator is the OS one (getrandom); building the key pair cannot fail for a
        // valid, built-in parameter string.
        let builder = snow::Builder::new(params());
        match builder.generate_keypair() {
            Ok(pair) => Self(to_key(&pair.private)),
            Err(e) => panic!("the operating system's random generator failed: {e}"),
        }
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The public key that belongs to this key.
    pub fn public_key(&self) -> PublicKey {
        let mut dh = DefaultResolver
            .resolve_dh(&DHChoice::Curve25519)
            .expect("snow's default resolver provides Curve25519");
        dh.set(&self.0);
        PublicKey(to_key(dh.pubkey()))
    }

    /// The key as base64, for writing a configuration file.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }

    pub(crate) fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

fn to_key(bytes: &[u8]) -> [u8; KEY_LEN] {
    let mut key = [0; KEY_LEN];
    key.copy_from_slice(&bytes[..KEY_LEN]);
    key
}

fn decode(s: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let bytes = BASE64
        .decode(s.trim())
        .map_err(|e| KeyError::Base64(e.to_string()))?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(bytes.len()))
}

impl FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode(s).map(Self)
    }
}

impl FromStr for SecretKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode(s).map(Self)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&BASE64.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(***)")
    }
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        // A volatile write, so the compiler cannot drop the erasure as a dead store.
        for b in &mut self.0 {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

fn params() -> snow::params::NoiseParams {
    NOISE_PARAMS
        .parse()
        .expect("the built-in Noise parameter string is valid")
}

/// Handshake failures. None of them is ever answered on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("handshake message did not decrypt: {0}")]
    Noise(String),
}

impl From<snow::Error> for HandshakeError {
    fn from(e: snow::Error) -> Self {
        Self::Noise(e.to_string())
    }
}

/// The prologue: the protocol's name, then the initiation's cleartext header, so that a
/// header changed in transit makes the handshake fail instead of misdirecting it.
fn prologue(header: &[u8]) -> Vec<u8> {
    [PROLOGUE, header].concat()
}

/// Starts a handshake as the initiator: writes message 1 carrying `payload` into `out`.
/// `header` is the initiation's cleartext header.
pub(crate) fn initiate(
    local: &SecretKey,
    peer: &PublicKey,
    header: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> Result<(snow::HandshakeState, usize), HandshakeError> {
    let mut hs = snow::Builder::new(params())
        .local_private_key(local.as_bytes())?
        .remote_public_key(peer.as_bytes())?
        .prologue(&prologue(header))?
        .build_initiator()?;
    let n = hs.write_message(payload, out)?;
    Ok((hs, n))
}

/// Reads message 1 as the responder. On success returns the handshake, the initiator's static
/// key and the payload length written to `payload`. The caller checks the key against its peers
/// before it answers.
pub(crate) fn accept(
    local: &SecretKey,
    header: &[u8],
    message: &[u8],
    payload: &mut [u8],
) -> Result<(snow::HandshakeState, PublicKey, usize), HandshakeError> {
    let mut hs = snow::Builder::new(params())
        .local_private_key(local.as_bytes())?
        .prologue(&prologue(header))?
        .build_responder()?;
    let n = hs.read_message(message, payload)?;
    let peer = hs
        .get_remote_static()
        .map(to_key)
        .map(PublicKey)
        .ok_or_else(|| HandshakeError::Noise("no static key in message 1".into()))?;
    Ok((hs, peer, n))
}

/// Writes message 2 (the responder's answer) and returns the session keys.
pub(crate) fn respond(
    mut hs: snow::HandshakeState,
    payload: &[u8],
    out: &mut [u8],
) -> Result<(Split, usize), HandshakeError> {
    let n = hs.write_message(payload, out)?;
    Ok((Split::new(hs), n))
}

/// Reads message 2 as the initiator and returns the session keys.
pub(crate) fn finish(
    mut hs: snow::HandshakeState,
    message: &[u8],
    payload: &mut [u8],
) -> Result<(Split, usize), HandshakeError> {
    let n = hs.read_message(message, payload)?;
    Ok((Split::new(hs), n))
}

/// The AEAD protecting a connection's data packets, agreed in the handshake: each side offers
/// what it can run (the `ciphers` transport parameter, PROTOCOL.md §3.3) and both take the same
/// one from the two offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cipher {
    /// ChaCha20-Poly1305: every peer offers it; fast without AES instructions.
    ChaCha20Poly1305,
    /// AES-256-GCM: used when both peers offer it, which they do only with hardware AES and
    /// carry-less multiplication (AES-NI and PCLMULQDQ, or the ARMv8 crypto extensions).
    Aes256Gcm,
}

impl Cipher {
    /// The bit of each cipher in the `ciphers` transport parameter.
    const CHACHA20_POLY1305_BIT: u64 = 1;
    const AES_256_GCM_BIT: u64 = 2;

    /// The name operators see (API, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    fn algorithm(self) -> &'static Algorithm {
        match self {
            Cipher::ChaCha20Poly1305 => &CHACHA20_POLY1305,
            Cipher::Aes256Gcm => &AES_256_GCM,
        }
    }

    /// What this side offers: ChaCha20-Poly1305 always, AES-256-GCM too when `aes` allows it
    /// and the CPU runs it in hardware (without, it is slower than ChaCha20-Poly1305).
    pub(crate) fn offer(aes: bool) -> u64 {
        let mut offer = Self::CHACHA20_POLY1305_BIT;
        if aes && hardware_aes() {
            offer |= Self::AES_256_GCM_BIT;
        }
        offer
    }

    /// The cipher two offers agree on: AES-256-GCM if both offer it, else ChaCha20-Poly1305,
    /// which every peer has (an offer of 0, from a peer before this parameter, means it alone).
    pub(crate) fn agree(ours: u64, theirs: u64) -> Self {
        if ours & theirs & Self::AES_256_GCM_BIT != 0 {
            Cipher::Aes256Gcm
        } else {
            Cipher::ChaCha20Poly1305
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether this CPU has the instructions that make AES-GCM fast and constant-time.
pub fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// One direction's AEAD key.
struct PacketKey {
    /// The raw key, kept to derive the next one. Erased on drop, with `aead`.
    key: [u8; KEY_LEN],
    cipher: Cipher,
    /// ring's key state: the key itself (ChaCha20) or its schedule, whose first round keys
    /// are the key (AES). ring does not erase it, so `drop` does.
    aead: ManuallyDrop<LessSafeKey>,
}

impl PacketKey {
    fn new(cipher: Cipher, key: [u8; KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(cipher.algorithm(), &key)
            .expect("both ciphers take 32-byte keys, as KEY_LEN");
        Self {
            aead: ManuallyDrop::new(LessSafeKey::new(unbound)),
            cipher,
            key,
        }
    }

    /// Noise nonce layout: 32 zero bits, then the 64-bit counter little-endian. Packet
    /// numbers only grow, so a nonce is never used twice under one key.
    fn nonce(number: u64) -> Nonce {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&number.to_le_bytes());
        Nonce::assume_unique_for_key(nonce)
    }

    fn seal(&self, number: u64, header: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        // Sealing fails only for payloads over 2^38 bytes; datagrams are under 64 KiB.
        let tag = self
            .aead
            .seal_in_place_separate_tag(Self::nonce(number), Aad::from(header), payload)
            .expect("a datagram is far below the AEAD's length limit");
        let mut out = [0; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Authenticates and decrypts. On failure the payload is zeroed, not left as it was.
    fn open(&self, number: u64, header: &[u8], payload: &mut [u8], tag: &[u8]) -> bool {
        let Ok(tag) = Tag::try_from(tag) else {
            return false;
        };
        self.aead
            .open_in_place_separate_tag(Self::nonce(number), Aad::from(header), tag, payload, 0..)
            .is_ok()
    }

    /// Noise `REKEY(k)`: the first 32 bytes of `ENCRYPTWITHAD(k, 2^64-1, "", zeros(32))`
    /// (the nonce is all ones in either byte order, so this is Noise's for both ciphers).
    fn next(&self) -> Self {
        let mut block = [0u8; KEY_LEN];
        self.seal(u64::MAX, &[], &mut block);
        Self::new(self.cipher, block)
    }
}

impl Drop for PacketKey {
    fn drop(&mut self) {
        for b in &mut self.key {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        let aead: *mut LessSafeKey = &mut *self.aead;
        // SAFETY: `aead` is dropped once, here, and never used again (it is `ManuallyDrop`,
        // and this is `PacketKey`'s drop). Its storage is inline (no heap parts) and ours
        // alone: once its value is dropped, overwriting those dead bytes is sound.
        unsafe {
            std::ptr::drop_in_place(aead);
            let bytes = aead.cast::<u8>();
            for i in 0..std::mem::size_of::<LessSafeKey>() {
                std::ptr::write_volatile(bytes.add(i), 0);
            }
        }
    }
}

/// The two keys a finished handshake splits into, before the cipher is known (the initiator
/// learns the responder's offer from the message that finishes it). Erased when dropped.
pub(crate) struct Split {
    send: [u8; KEY_LEN],
    recv: [u8; KEY_LEN],
}

impl Split {
    fn new(mut hs: snow::HandshakeState) -> Self {
        let initiator = hs.is_initiator();
        let (i_to_r, r_to_i) = hs.dangerously_get_raw_split();
        let (send, recv) = if initiator {
            (i_to_r, r_to_i)
        } else {
            (r_to_i, i_to_r)
        };
        Self { send, recv }
    }

    /// The connection's keys under `cipher`.
    pub(crate) fn keys(&self, cipher: Cipher) -> Keys {
        Keys::new(cipher, self.send, self.recv)
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        for b in self.send.iter_mut().chain(&mut self.recv) {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// The session keys of a connection, both directions, with key phases.
pub(crate) struct Keys {
    send: PacketKey,
    send_phase: bool,
    send_packets: u64,
    send_since: Option<Instant>,
    recv: PacketKey,
    recv_phase: bool,
    /// The key the peer will use after its next update, precomputed.
    recv_next: PacketKey,
    /// The key before the peer's last update, for packets reordered across it, and when to
    /// forget it.
    recv_previous: Option<(PacketKey, Instant)>,
    /// A packet of the other key phase, kept while one key is tried: a failed attempt zeroes
    /// the bytes, and the other key needs them.
    trial: Vec<u8>,
}

/// How long the previous receive key is kept after the peer updates: packets sent before the
/// update may still be in flight, reordered or retransmitted late.
const PREVIOUS_KEY_GRACE: Duration = Duration::from_secs(5);

impl Keys {
    fn new(cipher: Cipher, send: [u8; KEY_LEN], recv: [u8; KEY_LEN]) -> Self {
        let recv = PacketKey::new(cipher, recv);
        Self {
            send: PacketKey::new(cipher, send),
            send_phase: false,
            send_packets: 0,
            send_since: None,
            recv_next: recv.next(),
            recv,
            recv_phase: false,
            recv_previous: None,
            trial: Vec::new(),
        }
    }

    /// The cipher sealing this connection's packets.
    pub(crate) fn cipher(&self) -> Cipher {
        self.send.cipher
    }

    /// The key phase the next sealed packet carries. Updates the send key first when the
    /// current one has sealed enough packets or is old enough.
    pub(crate) fn send_phase(&mut self, now: Instant) -> bool {
        let since = *self.send_since.get_or_insert(now);
        if self.send_packets >= KEY_UPDATE_PACKETS
            || now.saturating_duration_since(since) >= KEY_UPDATE_INTERVAL
        {
            self.send = self.send.next();
            self.send_phase = !self.send_phase;
            self.send_packets = 0;
            self.send_since = Some(now);
        }
        self.send_phase
    }

    /// Encrypts `payload` in place and returns the tag to append.
    pub(crate) fn seal(&mut self, number: u64, header: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        self.send_packets += 1;
        self.send.seal(number, header, payload)
    }

    /// Authenticates and decrypts `payload` in place. On failure the payload is garbage and the
    /// packet must be dropped silently.
    pub(crate) fn open(
        &mut self,
        now: Instant,
        phase: bool,
        number: u64,
        header: &[u8],
        payload: &mut [u8],
        tag: &[u8],
    ) -> bool {
        if self
            .recv_previous
            .as_ref()
            .is_some_and(|(_, until)| now >= *until)
        {
            self.recv_previous = None;
        }
        if phase == self.recv_phase {
            return self.recv.open(number, header, payload, tag);
        }
        // A packet of the other phase: reordered from before the peer's last update, or the
        // first of its next one. A failed attempt zeroes the bytes, so the second works on
        // a copy.
        if let Some((previous, _)) = &self.recv_previous {
            self.trial.clear();
            self.trial.extend_from_slice(payload);
            if previous.open(number, header, payload, tag) {
                return true;
            }
            payload.copy_from_slice(&self.trial);
        }
        if !self.recv_next.open(number, header, payload, tag) {
            return false;
        }
        let next = self.recv_next.next();
        let current = std::mem::replace(&mut self.recv_next, next);
        let old = std::mem::replace(&mut self.recv, current);
        self.recv_previous = Some((old, now + PREVIOUS_KEY_GRACE));
        self.recv_phase = phase;
        true
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("send_phase", &self.send_phase)
            .field("send_packets", &self.send_packets)
            .field("recv_phase", &self.recv_phase)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CIPHERS: [Cipher; 2] = [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm];

    fn pair(cipher: Cipher) -> (Keys, Keys) {
        let (i, r) = splits();
        (i.keys(cipher), r.keys(cipher))
    }

    /// A finished handshake: the initiator's and the responder's keys.
    fn splits() -> (Split, Split) {
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let mut m1 = [0u8; 256];
        let (hs, n1) = initiate(&a, &b.public_key(), b"hdr", b"hello", &mut m1).unwrap();
        let mut payload = [0u8; 64];
        assert!(accept(&b, b"hdR", &m1[..n1], &mut payload).is_err());
        let (rhs, peer, n) = accept(&b, b"hdr", &m1[..n1], &mut payload).unwrap();
        assert_eq!(peer, a.public_key());
        assert_eq!(&payload[..n], b"hello");
        let mut m2 = [0u8; 256];
        let (rsplit, n2) = respond(rhs, b"", &mut m2).unwrap();
        assert!(n2 <= n1, "the answer is never larger than the request");
        let (isplit, _) = finish(hs, &m2[..n2], &mut payload).unwrap();
        (isplit, rsplit)
    }

    #[test]
    fn keys_parse_and_print_as_base64() {
        let secret = SecretKey::generate();
        let again: SecretKey = secret.to_base64().parse().unwrap();
        assert_eq!(again.public_key(), secret.public_key());
        let public = secret.public_key();
        assert_eq!(public.to_string().parse::<PublicKey>(), Ok(public));
        assert_eq!(format!("{secret:?}"), "SecretKey(***)");
        assert_eq!("AAAA".parse::<PublicKey>(), Err(KeyError::Length(3)));
        assert!(matches!(
            "!!".parse::<PublicKey>(),
            Err(KeyError::Base64(_))
        ));
    }

    #[test]
    fn a_handshake_with_the_wrong_responder_key_fails() {
        let (a, b, c) = (
            SecretKey::generate(),
            SecretKey::generate(),
            SecretKey::generate(),
        );
        let mut m1 = [0u8; 256];
        let (_, n1) = initiate(&a, &c.public_key(), b"", b"", &mut m1).unwrap();
        assert!(accept(&b, b"", &m1[..n1], &mut [0u8; 64]).is_err());
    }

    #[test]
    fn ciphers_are_agreed_from_both_offers() {
        let (chacha, both) = (
            Cipher::CHACHA20_POLY1305_BIT,
            Cipher::CHACHA20_POLY1305_BIT | Cipher::AES_256_GCM_BIT,
        );
        assert_eq!(Cipher::agree(both, both), Cipher::Aes256Gcm);
        assert_eq!(Cipher::agree(both, chacha), Cipher::ChaCha20Poly1305);
        assert_eq!(Cipher::agree(chacha, both), Cipher::ChaCha20Poly1305);
        // A peer before the parameter existed reads as 0.
        assert_eq!(Cipher::agree(both, 0), Cipher::ChaCha20Poly1305);
        assert_eq!(Cipher::offer(false), chacha);
        assert_eq!(Cipher::offer(true) == both, hardware_aes());
    }

    #[test]
    fn the_ciphers_do_not_open_each_others_packets() {
        // One handshake's keys under both ciphers: only the cipher differs.
        let (i, r) = splits();
        let now = crate::test_epoch();
        for (send, recv) in [
            (Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm),
            (Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305),
        ] {
            let (mut sender, mut receiver) = (i.keys(send), r.keys(recv));
            assert_eq!((sender.cipher(), receiver.cipher()), (send, recv));
            let phase = sender.send_phase(now);
            let mut data = *b"same keys, other cipher";
            let tag = sender.seal(1, b"h", &mut data);
            assert!(!receiver.open(now, phase, 1, b"h", &mut data.clone(), &tag));
            assert!(r.keys(send).open(now, phase, 1, b"h", &mut data, &tag));
            assert_eq!(&data, b"same keys, other cipher");
        }
    }

    #[test]
    fn sealed_packets_open_only_unmodified() {
        for cipher in CIPHERS {
            sealed_packets_open_only_unmodified_with(cipher);
        }
    }

    fn sealed_packets_open_only_unmodified_with(cipher: Cipher) {
        let (mut i, mut r) = pair(cipher);
        let now = crate::test_epoch();
        let header = [3u8, 0, 0, 0, 1];
        let mut data = *b"stream bytes";
        let phase = i.send_phase(now);
        let tag = i.seal(7, &header, &mut data);
        assert_ne!(&data, b"stream bytes");
        let mut copy = data;
        assert!(r.open(now, phase, 7, &header, &mut copy, &tag));
        assert_eq!(&copy, b"stream bytes");
        // A different nonce, header, or ciphertext fails.
        let mut copy = data;
        assert!(!r.open(now, phase, 8, &header, &mut copy, &tag));
        let mut copy = data;
        assert!(!r.open(now, phase, 7, &[3, 0, 0, 0, 2], &mut copy, &tag));
        let mut copy = data;
        copy[0] ^= 1;
        assert!(!r.open(now, phase, 7, &header, &mut copy, &tag));
    }

    #[test]
    fn key_updates_are_followed_and_old_packets_still_open_for_a_while() {
        for cipher in CIPHERS {
            key_updates_are_followed_with(cipher);
        }
    }

    fn key_updates_are_followed_with(cipher: Cipher) {
        let (mut i, mut r) = pair(cipher);
        let t0 = crate::test_epoch();
        let seal = |keys: &mut Keys, now: Instant, n: u64| {
            let phase = keys.send_phase(now);
            let mut data = n.to_be_bytes();
            let tag = keys.seal(n, &[], &mut data);
            (phase, data, tag)
        };
        let early = seal(&mut i, t0, 1);
        let t1 = t0 + KEY_UPDATE_INTERVAL;
        let late = seal(&mut i, t1, 2);
        assert_ne!(early.0, late.0, "the phase flips after the interval");
        let (phase, mut data, tag) = late;
        assert!(r.open(t1, phase, 2, &[], &mut data, &tag));
        // The packet sealed before the update arrives afterwards, within the grace period.
        let (phase, mut data, tag) = early;
        assert!(r.open(t1, phase, 1, &[], &mut data, &tag));
        assert_eq!(data, 1u64.to_be_bytes());
        // After the grace period the previous key is gone.
        let (phase, mut data, tag) = seal(&mut i, t1, 3);
        assert!(r.open(t1 + PREVIOUS_KEY_GRACE, phase, 3, &[], &mut data, &tag));
        let (_, mut data, tag) = early;
        assert!(!r.open(t1 + PREVIOUS_KEY_GRACE, !phase, 1, &[], &mut data, &tag));
    }

    #[test]
    fn a_second_update_within_the_grace_period_opens_after_the_previous_key_fails() {
        for cipher in CIPHERS {
            second_update_with(cipher);
        }
    }

    fn second_update_with(cipher: Cipher) {
        let (mut i, mut r) = pair(cipher);
        let now = crate::test_epoch();
        let mut seal_next = |n: u64| {
            // Enough packets under the current key: the next seal updates it.
            i.send_packets = KEY_UPDATE_PACKETS;
            let phase = i.send_phase(now);
            let mut data = n.to_be_bytes();
            let tag = i.seal(n, b"h", &mut data);
            (phase, data, tag)
        };
        let (phase, mut data, tag) = seal_next(1);
        assert!(r.open(now, phase, 1, b"h", &mut data, &tag));
        // Phase flips back: the previous key (two updates old now) is tried first and fails,
        // zeroing the bytes; the next key must still see the packet as sent.
        let (phase, mut data, tag) = seal_next(2);
        assert!(r.open(now, phase, 2, b"h", &mut data, &tag));
        assert_eq!(data, 2u64.to_be_bytes());
    }
}
