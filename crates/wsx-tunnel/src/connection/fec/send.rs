//! The sending half of FEC: blocks, parity, and when a protected packet may count as lost.

use super::{FecStats, PARITY_HEADER_LEN, REBUILT, shard_bytes, with_shard};
use crate::config::{FecMode, TransportConfig};
use crate::wire::header::DATA_HEADER_LEN;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use wsx_fec::Encoder;
use wsx_fec::policy::{self, LossMeter, ParityBudget, Policy};

/// A block closes at the latest this long after it opened, so that a trickle of data is
/// repaired well before a retransmission could be: a quarter of the RTT, within these
/// bounds. Long groups are what make parity cheap, so the bound is not tighter: at 100 ms and
/// 100 Mbit/s a block gathers about 220 packets of 1,400 bytes before it closes.
const FLUSH_MIN: Duration = Duration::from_millis(1);
const FLUSH_MAX: Duration = Duration::from_millis(50);
/// The loss rate FEC "on" assumes at least, and adaptive FEC until its meter has measured
/// the path.
const ON_MIN_LOSS: f64 = 0.01;

/// Whether a sent packet may be declared lost yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::connection) enum Repair {
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
pub(in crate::connection) struct FecSender {
    mode: FecMode,
    policy: Policy,
    encoder: Encoder,
    meter: LossMeter,
    /// Keeps the parity of short (flushed) blocks within the overhead cap, and the data
    /// packets of the open block, which earn it.
    budget: ParityBudget,
    block_data: usize,
    flush_at: Option<Instant>,
    closed: VecDeque<ClosedBlock>,
    /// Parity sent and packets the peer rebuilt; the encoder counts blocks and packets.
    stats: FecStats,
}

impl FecSender {
    /// The sending half for datagrams of at most `max_datagram` bytes.
    pub(in crate::connection) fn new(config: &TransportConfig, max_datagram: usize) -> Self {
        Self {
            mode: config.fec,
            policy: Self::policy(config.fec, config.fec_max_overhead),
            encoder: Encoder::new(shard_bytes(max_datagram)),
            meter: LossMeter::default(),
            budget: ParityBudget::default(),
            block_data: 0,
            flush_at: None,
            closed: VecDeque::new(),
            stats: FecStats::default(),
        }
    }

    /// Packets are built to `max_datagram` bytes from now on: the open block is coded as it
    /// is (its parity keeps its size) and the next ones fit the new size.
    pub(in crate::connection) fn set_max_datagram(&mut self, max_datagram: usize) {
        self.close_block();
        self.encoder.set_shard_bytes(shard_bytes(max_datagram));
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
    pub(in crate::connection) fn configure(&mut self, mode: FecMode, max_overhead: f64) {
        self.mode = mode;
        self.policy = Self::policy(mode, max_overhead);
    }

    pub(in crate::connection) fn stats(&self) -> FecStats {
        let e = self.encoder.stats();
        FecStats {
            blocks: e.blocks,
            packets_protected: e.packets,
            ..self.stats
        }
    }

    /// Whether the packet about to get number `pn` is protected, opening a block if the
    /// policy asks for one. Within one call of `poll_transmit` the answer can only go from
    /// yes to no (a block that fills closes; the loss estimate moves only with ACKs, and
    /// `flight_ending` is the caller's for the whole call), so a GSO batch is built to one
    /// size.
    ///
    /// `flight_ending`: what is queued to send would leave within half a round trip. In
    /// adaptive mode a block opens only then. Earlier in a flight (a bulk transfer, a long
    /// answer) a lost packet is resent while the rest of the flight is still leaving, so it
    /// costs the flight no time, and one resent packet costs the link less than the parity
    /// that would have spared it (2.9 % parity against 1 % loss; with bursts of three, 4.5 %
    /// against 1 %). The last half round trip is what parity saves a round trip for. FEC
    /// "on" protects every packet.
    pub(in crate::connection) fn protect_next(
        &mut self,
        now: Instant,
        pn: u64,
        srtt: Duration,
        flight_ending: bool,
    ) -> bool {
        if self.encoder.open_block().is_some() {
            return true;
        }
        let stats = self.meter.stats();
        match self.mode {
            FecMode::Off => return false,
            FecMode::Adaptive if !flight_ending => return false,
            FecMode::Adaptive | FecMode::On => {}
        }
        // Until the meter has seen enough packets to measure the path, adaptive FEC assumes
        // what "on" does: the first answers of a cold tunnel are the ones a loss would make
        // a round trip slower (a cold tunnel's first 64 KiB answer once took six).
        let policy = if self.meter.measured() {
            self.policy
        } else {
            Policy {
                min_loss: self.policy.min_loss.max(ON_MIN_LOSS),
                ..self.policy
            }
        };
        let Some(shape) = policy::shape(stats, &policy) else {
            return false;
        };
        self.encoder.open(pn, shape);
        self.flush_at = Some(now + (srtt / 4).clamp(FLUSH_MIN, FLUSH_MAX));
        true
    }

    /// Whether a block is open: the next packet must join it.
    pub(in crate::connection) fn is_open(&self) -> bool {
        self.encoder.open_block().is_some()
    }

    /// The longest packet a block can carry.
    pub(in crate::connection) fn max_protected(&self) -> usize {
        self.encoder.max_packet() + REBUILT
    }

    /// A protected packet was sealed: it joins the open block, which is coded once full.
    /// `data`: it carries more than ACKs (it earns parity).
    pub(in crate::connection) fn on_sealed(&mut self, pn: u64, packet: &mut [u8], data: bool) {
        if self.encoder.open_block().is_none() || packet.len() < DATA_HEADER_LEN {
            return;
        }
        self.block_data += usize::from(data);
        let encoder = &mut self.encoder;
        if with_shard(packet, |shard| encoder.add(pn, shard)) {
            self.close_block();
        }
    }

    /// Codes the open block now (the flush timer, or the connection is about to send
    /// something that must not wait for parity). A block the budget gives no parity is
    /// not protected after all: its packets are judged lost by the usual thresholds.
    pub(in crate::connection) fn close_block(&mut self) {
        self.flush_at = None;
        let before = self.encoder.pending_parity();
        let (stats, policy, budget) = (self.meter.stats(), self.policy, &mut self.budget);
        let Some(shape) = self.encoder.open_block().map(|b| b.shape) else {
            return;
        };
        budget.earn(std::mem::take(&mut self.block_data), policy.max_overhead);
        let Some(block) = self
            .encoder
            .close(|members| budget.spend(policy::parity_for(members, shape, stats, &policy)))
        else {
            return;
        };
        let parity_left = self.encoder.pending_parity() - before;
        if parity_left == 0 {
            return;
        }
        self.closed.push_back(ClosedBlock {
            first: block.first,
            end: block.end(),
            parity_left,
            repair: Repair::Pending,
        });
    }

    /// When the open block must be flushed.
    pub(in crate::connection) fn deadline(&self) -> Option<Instant> {
        self.flush_at
    }

    pub(in crate::connection) fn on_timeout(&mut self, now: Instant) {
        if self.flush_at.is_some_and(|t| now >= t) {
            self.close_block();
        }
    }

    pub(in crate::connection) fn has_parity(&self) -> bool {
        self.encoder.pending_parity() > 0
    }

    /// Writes the next parity shard (description and shard) into `out`; `next_pn` is the
    /// number the next data packet will get. Returns its length and the last packet of its
    /// block, with which its bytes are accounted (so that they count in flight and, once
    /// acknowledged, as delivered).
    pub(in crate::connection) fn pop_parity(
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

    /// The bytes of the next parity packet (all parity of a block has one size).
    pub(in crate::connection) fn parity_packet_len(&self) -> usize {
        PARITY_HEADER_LEN + self.encoder.parity_len()
    }

    /// Whether sent packet `pn` may be declared lost yet; see [`Repair`].
    pub(in crate::connection) fn repair(&self, pn: u64) -> Repair {
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
    pub(in crate::connection) fn forget_below(&mut self, base: u64) {
        while self
            .closed
            .front()
            .is_some_and(|b| b.end <= base && b.parity_left == 0)
        {
            self.closed.pop_front();
        }
    }

    /// A sent packet's fate, for the loss meter: delivered, or lost (rebuilt or not).
    pub(in crate::connection) fn on_outcome(&mut self, pn: u64, lost: bool) {
        self.meter.on_packet(pn, lost);
    }

    /// Congestion control took the latest losses for a queue overflowing: see
    /// [`LossMeter::on_overflow`].
    pub(in crate::connection) fn on_overflow(&mut self, sent_below: u64) {
        self.meter.on_overflow(sent_below);
    }

    pub(in crate::connection) fn on_peer_recovered(&mut self) {
        self.stats.recovered_by_peer += 1;
    }
}
