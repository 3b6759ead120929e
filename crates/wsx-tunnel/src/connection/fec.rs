//! Forward error correction in a connection (PROTOCOL.md §5.1).
//!
//! Sender: while the policy asks for parity, every packet sent joins the open block (and is
//! built small enough to fit a shard); a full block, or one open longer than the flush
//! interval, is coded and its parity queued for the pacer. A protected packet is not declared
//! lost before its block's parity has left and the receiver has had the time (or three later
//! packets) to use it.
//!
//! Receiver: protected packets are kept until their block is settled; parity rebuilds what is
//! missing, and the rebuilt packets are processed as if they had arrived. Their numbers go back
//! in RECOVERED frames, so that the sender counts them as losses (FEC must never hide a loss
//! pattern from congestion control) while not sending them again.

use crate::coding::Writer;
use crate::config::{FecMode, TransportConfig};
use crate::frame;
use crate::packet::PARITY_HEADER_LEN;
use crate::packet::{DATA_HEADER_LEN, DataHeader, Header};
use crate::range_set::RangeSet;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use wsx_fec::policy::{self, LossMeter, Policy};
use wsx_fec::{Decoder, Encoder, PARITY_INFO_LEN, ParityInfo};

/// A block closes at the latest this long after it opened, so that a trickle of data is
/// repaired well before a retransmission could be: a quarter of the RTT, within these
/// bounds. Long groups are what make parity cheap, so the bound is not tighter: at 100 ms and
/// 100 Mbit/s a block gathers about 220 packets of 1,400 bytes before it closes.
const FLUSH_MIN: Duration = Duration::from_millis(1);
const FLUSH_MAX: Duration = Duration::from_millis(50);
/// The loss rate FEC "on" assumes at least.
const ON_MIN_LOSS: f64 = 0.01;

/// Bytes of a sealed data packet that its shard leaves out: the receiver id and the packet
/// number (bytes 1..13), which the receiver knows (its own id; the number from the block).
/// A shard carries the type byte, then the ciphertext and tag; so a protected packet can be
/// this much longer than the shard holds.
const REBUILT: usize = DATA_HEADER_LEN - 1;

/// Calls `f` with the part of sealed data packet `packet` that its shard carries, made
/// contiguous in place (the type byte copied over the last byte of the packet number), and
/// puts the packet back as it was.
fn with_shard<R>(packet: &mut [u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let saved = packet[REBUILT];
    packet[REBUILT] = packet[0];
    let result = f(&packet[REBUILT..]);
    packet[REBUILT] = saved;
    result
}

/// FEC counters of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FecStats {
    /// Blocks coded and packets sent in them.
    pub blocks: u64,
    pub packets_protected: u64,
    /// Parity packets and bytes sent: the overhead.
    pub parity_sent: u64,
    pub parity_bytes_sent: u64,
    /// Packets the peer reported rebuilt from our parity: retransmissions avoided.
    pub recovered_by_peer: u64,
    /// Parity packets received, packets rebuilt from them, and groups that lost more than
    /// their parity could rebuild.
    pub parity_received: u64,
    pub recovered: u64,
    pub unrecoverable_groups: u64,
    /// Bytes held here for rebuilding the peer's losses: copies of its protected packets and
    /// its parity (about 2.8 MB once its FEC is in use).
    pub decoder_bytes: u64,
}

/// Whether a sent packet may be declared lost yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repair {
    /// Not protected: the usual thresholds apply.
    None,
    /// Its block's parity has not all left: not yet.
    Pending,
    /// Count and time from the first packet sent after the parity, and the parity's time.
    After { pn: u64, time: Instant },
}

#[derive(Debug)]
struct ClosedBlock {
    first: u64,
    end: u64,
    parity_left: usize,
    repair: Repair,
}

#[derive(Debug)]
pub(super) struct Fec {
    mode: FecMode,
    policy: Policy,
    encoder: Encoder,
    decoder: Decoder,
    meter: LossMeter,
    flush_at: Option<Instant>,
    closed: VecDeque<ClosedBlock>,
    /// Receiver: packets rebuilt and not yet reported, and those reported once (each is
    /// reported in two ACKs, so that one lost ACK loses nothing).
    recovered: RangeSet,
    reported: RangeSet,
    stats: FecStats,
}

impl Fec {
    /// FEC for a connection whose datagrams are at most `max_datagram` bytes (both sides
    /// agree on it, so both derive the same shard size).
    pub(super) fn new(config: &TransportConfig, max_datagram: usize) -> Self {
        let shard = Self::shard_bytes(max_datagram);
        Self {
            mode: config.fec,
            policy: Self::policy(config.fec, config.fec_max_overhead),
            encoder: Encoder::new(shard),
            decoder: Decoder::new(shard),
            meter: LossMeter::default(),
            flush_at: None,
            closed: VecDeque::new(),
            recovered: RangeSet::new(),
            reported: RangeSet::new(),
            stats: FecStats::default(),
        }
    }

    fn policy(mode: FecMode, max_overhead: f64) -> Policy {
        Policy {
            max_overhead,
            min_loss: if mode == FecMode::On {
                ON_MIN_LOSS
            } else {
                0.0
            },
            ..Policy::default()
        }
    }

    /// Changes the mode and the overhead cap from the next block on (an open block is
    /// finished as it was shaped).
    pub(super) fn configure(&mut self, mode: FecMode, max_overhead: f64) {
        self.mode = mode;
        self.policy = Self::policy(mode, max_overhead);
    }

    /// A parity packet is exactly `max_datagram`: its header, the description, the shard.
    fn shard_bytes(max_datagram: usize) -> usize {
        (max_datagram - PARITY_HEADER_LEN - PARITY_INFO_LEN) & !1
    }

    pub(super) fn stats(&self) -> FecStats {
        let d = self.decoder.stats();
        let e = self.encoder.stats();
        FecStats {
            blocks: e.blocks,
            packets_protected: e.packets,
            parity_received: d.parity,
            recovered: d.recovered,
            unrecoverable_groups: d.unrecoverable,
            decoder_bytes: self.decoder.memory() as u64,
            ..self.stats
        }
    }

    // ---- Sender -------------------------------------------------------------------------

    /// Whether the packet about to get number `pn` is protected, opening a block if the
    /// policy asks for one. Within one call of `poll_transmit` the answer does not change
    /// (the loss estimate moves only with ACKs), so a GSO batch keeps one packet size.
    pub(super) fn protect_next(&mut self, now: Instant, pn: u64, srtt: Duration) -> bool {
        if self.encoder.open_block().is_some() {
            return true;
        }
        if self.mode == FecMode::Off {
            return false;
        }
        let Some(shape) = policy::shape(self.meter.stats(), &self.policy) else {
            return false;
        };
        self.encoder.open(pn, shape);
        self.flush_at = Some(now + (srtt / 4).clamp(FLUSH_MIN, FLUSH_MAX));
        true
    }

    /// Whether a block is open: the next packet must join it.
    pub(super) fn is_open(&self) -> bool {
        self.encoder.open_block().is_some()
    }

    /// The longest packet a block can carry.
    pub(super) fn max_protected(&self) -> usize {
        self.encoder.max_packet() + REBUILT
    }

    /// A protected packet was sealed: it joins the open block, which is coded once full.
    pub(super) fn on_sealed(&mut self, pn: u64, packet: &mut [u8]) {
        if self.encoder.open_block().is_none() || packet.len() < DATA_HEADER_LEN {
            return;
        }
        let encoder = &mut self.encoder;
        if with_shard(packet, |shard| encoder.add(pn, shard)) {
            self.close_block();
        }
    }

    /// Codes the open block now (the flush timer, or the connection is about to send
    /// something that must not wait for parity).
    pub(super) fn close_block(&mut self) {
        self.flush_at = None;
        let before = self.encoder.pending_parity();
        let (stats, policy) = (self.meter.stats(), self.policy);
        let Some(shape) = self.encoder.open_block().map(|b| b.shape) else {
            return;
        };
        let Some(block) = self
            .encoder
            .close(|members| policy::parity_for(members, shape, stats, &policy))
        else {
            return;
        };
        self.closed.push_back(ClosedBlock {
            first: block.first,
            end: block.end(),
            parity_left: self.encoder.pending_parity() - before,
            repair: Repair::Pending,
        });
    }

    /// When the open block must be flushed.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.flush_at
    }

    pub(super) fn on_timeout(&mut self, now: Instant) {
        if self.flush_at.is_some_and(|t| now >= t) {
            self.close_block();
        }
    }

    pub(super) fn has_parity(&self) -> bool {
        self.encoder.pending_parity() > 0
    }

    /// Writes the next parity shard (description and shard) into `out`; `next_pn` is the
    /// number the next data packet will get. Returns its length and the last packet of its
    /// block, with which its bytes are accounted (so that they count in flight and, once
    /// acknowledged, as delivered).
    pub(super) fn pop_parity(
        &mut self,
        now: Instant,
        next_pn: u64,
        out: &mut [u8],
    ) -> Option<(usize, Option<u64>)> {
        let len = self.encoder.pop_parity(out)?;
        self.stats.parity_sent += 1;
        self.stats.parity_bytes_sent += (PARITY_HEADER_LEN + len) as u64;
        let block = self.closed.iter_mut().find(|b| b.parity_left > 0);
        let owner = block.map(|block| {
            block.parity_left -= 1;
            if block.parity_left == 0 {
                block.repair = Repair::After {
                    pn: next_pn,
                    time: now,
                };
            }
            block.end - 1
        });
        Some((len, owner))
    }

    /// The bytes of a parity packet.
    pub(super) fn parity_packet_len(&self) -> usize {
        PARITY_HEADER_LEN + self.encoder.parity_len()
    }

    /// Whether sent packet `pn` may be declared lost yet; see [`Repair`].
    pub(super) fn repair(&self, pn: u64) -> Repair {
        if let Some(open) = self.encoder.open_block() {
            if pn >= open.first {
                return Repair::Pending;
            }
        }
        let i = self.closed.partition_point(|b| b.end <= pn);
        match self.closed.get(i) {
            Some(b) if b.first <= pn => b.repair,
            _ => Repair::None,
        }
    }

    /// Forgets blocks wholly below `base` (every packet acknowledged or declared lost).
    pub(super) fn forget_below(&mut self, base: u64) {
        while self
            .closed
            .front()
            .is_some_and(|b| b.end <= base && b.parity_left == 0)
        {
            self.closed.pop_front();
        }
    }

    /// A sent packet's fate, for the loss meter: delivered, or lost (rebuilt or not).
    pub(super) fn on_outcome(&mut self, pn: u64, lost: bool) {
        self.meter.on_packet(pn, lost);
    }

    /// Congestion control took the latest losses for a queue overflowing: see
    /// [`LossMeter::on_overflow`].
    pub(super) fn on_overflow(&mut self, sent_below: u64) {
        self.meter.on_overflow(sent_below);
    }

    pub(super) fn on_peer_recovered(&mut self) {
        self.stats.recovered_by_peer += 1;
    }

    // ---- Receiver -----------------------------------------------------------------------

    /// Keeps a copy of a protected packet (of at least a data header) before it is
    /// decrypted in place.
    pub(super) fn stage(&mut self, pn: u64, packet: &mut [u8]) {
        if packet.len() >= DATA_HEADER_LEN {
            let decoder = &mut self.decoder;
            with_shard(packet, |shard| decoder.stage(pn, shard));
        }
    }

    pub(super) fn commit(&mut self, pn: u64) {
        self.decoder.commit(pn);
    }

    /// A parity packet's body (after its header). Malformed ones are ignored.
    pub(super) fn on_parity(&mut self, body: &[u8]) {
        let Ok(info) = ParityInfo::parse(body) else {
            return;
        };
        self.decoder.on_parity(info, &body[PARITY_INFO_LEN..]);
    }

    /// The next rebuilt packet, still sealed, into `out` (at least a data header long),
    /// with the header the sender gave it: `receiver` (this side's id), the number, and the
    /// type byte the shard carried.
    pub(super) fn pop_recovered(&mut self, receiver: u32, out: &mut [u8]) -> Option<(u64, usize)> {
        if out.len() < DATA_HEADER_LEN {
            return None;
        }
        loop {
            let (pn, len) = self.decoder.pop_recovered(&mut out[REBUILT..])?;
            if len == 0 {
                continue;
            }
            let header = Header::Data(DataHeader {
                receiver,
                key_phase: DataHeader::key_phase_of(out[REBUILT]),
                protected: true,
                number: pn,
            });
            header.emit(&mut Writer::new(&mut out[..DATA_HEADER_LEN]));
            return Some((pn, REBUILT + len));
        }
    }

    /// A rebuilt packet authenticated: report it.
    pub(super) fn on_recovered(&mut self, pn: u64, keep: usize) {
        self.recovered.insert(pn..pn + 1);
        self.recovered.keep_highest(keep);
    }

    /// Writes a RECOVERED frame for the packets rebuilt since the last ACK but one.
    pub(super) fn write_recovered(&mut self, w: &mut Writer<'_>) {
        if self.recovered.is_empty() && self.reported.is_empty() {
            return;
        }
        let mut all = self.reported.clone();
        for range in self.recovered.iter() {
            all.insert(range);
        }
        if frame::emit_recovered(w, all.iter()) {
            self.reported = std::mem::take(&mut self.recovered);
        }
    }
}
