//! Datagrams out. Each call to `poll_transmit` builds a burst of equal-size packets for one
//! GSO send, as many as the pacer, the congestion window and the burst limit allow. Frames
//! go in this order: RECOVERED and ACK (when one is due), stream credit and resets, control
//! messages, stream data chosen by the scheduler, PING. ACKs ride on data packets when
//! possible. A path MTU probe leaves alone, as a send of its own.

use super::recovery::{FrameList, SentFrame};
use super::{BASE_DATAGRAM, Connection, State};
use crate::congestion::bytes_in;
use crate::crypto::TAG_LEN;
use crate::pacing::Pacer;
use crate::streams::BurstMark;
use crate::wire::header::DATA_HEADER_LEN;
use crate::wire::{DataHeader, Frame, Header, Writer};
use std::net::SocketAddr;
use std::time::Instant;

/// Datagrams to send: `size` bytes at the start of the caller's buffer, cut into segments of
/// `segment_size` (the last may be shorter) when there are several (GSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub destination: SocketAddr,
    pub size: usize,
    pub segment_size: Option<usize>,
    /// When the pacer scheduled this burst to leave. A driver with kernel pacing
    /// (`SO_TXTIME`) can hand it down; others send at once, since `poll_transmit` releases a
    /// burst only when its time has come.
    pub departure: Instant,
    /// The DSCP to mark these datagrams with (0: unmarked): that of the streams whose data
    /// they carry (a burst carries one).
    pub dscp: u8,
}

/// The most one send carries: GSO cuts one UDP datagram's worth (65,507 bytes, IPv4's
/// largest UDP payload) into segments.
const MAX_SEND_BYTES: usize = 65_507;

/// A send buffer for `datagrams` datagrams of up to `max_datagram` bytes (the driver's GSO
/// buffer, the simulation's): no longer than one send carries ([`MAX_SEND_BYTES`]; the core
/// fills as many datagrams of the current size as fit), so that 64 of 9,000 bytes do not
/// take 576 KB of which one send uses 65,507.
#[cfg(any(test, feature = "driver", feature = "testing"))]
pub(crate) fn send_buffer_len(max_datagram: usize, datagrams: usize) -> usize {
    (max_datagram * datagrams).min(MAX_SEND_BYTES.max(max_datagram))
}

/// Leftover room in a packet below which it is padded to full size, so that a burst's packets
/// stay equal-sized for GSO.
const PAD_BELOW: usize = 32;

impl Connection {
    /// Builds the next datagrams to send into `buf`, if any are due. `buf` should hold
    /// [`TransportConfig::max_burst_packets`](crate::TransportConfig::max_burst_packets)
    /// datagrams of [`TransportConfig::max_datagram`](crate::TransportConfig::max_datagram)
    /// bytes (the most path MTU discovery tries); fewer are built when it is smaller.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        match &mut self.state {
            State::Drained | State::Draining { .. } => None,
            State::Handshake(init) => {
                let config = &self.config;
                match init.write(now, config, self.local_id, &self.peer, buf) {
                    Ok(Some(size)) => Some(self.single_datagram(now, size)),
                    Ok(None) => None,
                    Err(e) => {
                        // Only a malformed key can fail here, and keys are checked when parsed.
                        tracing::error!(error = %e, "cannot build a handshake initiation");
                        self.state = State::Drained;
                        None
                    }
                }
            }
            State::AwaitingConfirmation { response, sent_at } => {
                let response = response.take()?;
                *sent_at = Some(now);
                let size = response.len().min(buf.len());
                buf[..size].copy_from_slice(&response[..size]);
                Some(self.single_datagram(now, size))
            }
            State::Closing { .. } => {
                if !self.close_resend {
                    return None;
                }
                self.close_resend = false;
                self.transmit_close(now, buf)
            }
            State::Established => self.transmit_packets(now, buf),
        }
    }

    /// Whether anything that needs a data packet waits to be sent.
    pub(super) fn wants_to_send_data(&self) -> bool {
        self.recovery.fec.as_ref().is_some_and(|f| f.has_parity())
            || self.ping_pending
            || self.recovery.probes() > 0
            || self.recovery.mtu.wants_probe()
            || self.control.has_queued()
            || self.streams.has_pending()
    }

    /// Counts one unpaced datagram of `size` bytes, built at the start of the buffer, and
    /// describes it for the driver.
    fn single_datagram(&mut self, now: Instant, size: usize) -> Transmit {
        self.count_sent(now, size);
        Transmit {
            destination: self.remote,
            size,
            segment_size: None,
            departure: now,
            dscp: 0,
        }
    }

    fn count_sent(&mut self, now: Instant, size: usize) {
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += size as u64;
        self.last_sent = now;
    }

    fn transmit_close(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let (code, reason) = self.close_frame.clone()?;
        if let Some(fec) = &mut self.recovery.fec {
            // Blocks are runs of consecutive packets; the CLOSE is not one of them.
            fec.close_block();
        }
        let max = self.max_datagram().min(buf.len());
        let payload_len = {
            let mut w = Writer::new(&mut buf[DATA_HEADER_LEN..max - TAG_LEN]);
            Frame::Close {
                code,
                reason: &reason,
            }
            .encode_if_fits(&mut w);
            w.len()
        };
        if payload_len == 0 {
            return None;
        }
        let number = self.recovery.take_pn();
        let size = self.seal(now, number, buf, payload_len, false);
        Some(self.single_datagram(now, size))
    }

    /// Writes the header of packet `number` and encrypts the payload already in
    /// `buf[DATA_HEADER_LEN..][..payload_len]`. Returns the packet size.
    fn seal(
        &mut self,
        now: Instant,
        number: u64,
        buf: &mut [u8],
        payload_len: usize,
        protected: bool,
    ) -> usize {
        let keys = self
            .keys
            .as_mut()
            .expect("established connections have keys");
        let key_phase = keys.send_phase(now);
        Header::Data(DataHeader {
            receiver: self.remote_id,
            key_phase,
            protected,
            number,
        })
        .emit(&mut Writer::new(&mut buf[..DATA_HEADER_LEN]));
        let (header, rest) = buf.split_at_mut(DATA_HEADER_LEN);
        let tag = keys.seal(number, header, &mut rest[..payload_len]);
        rest[payload_len..payload_len + TAG_LEN].copy_from_slice(&tag);
        DATA_HEADER_LEN + payload_len + TAG_LEN
    }

    /// Until when the stream scheduler holds back everything waiting to be sent, if it does:
    /// only stream data waits, and the scheduler gives none of it a turn before then.
    fn held_until(&self, now: Instant) -> Option<Instant> {
        let other = self.recovery.fec.as_ref().is_some_and(|f| f.has_parity())
            || self.ping_pending
            || self.recovery.probes() > 0
            || self.recovery.mtu.wants_probe()
            || self.control.has_queued()
            || self.streams.has_control_pending();
        if other {
            return None;
        }
        self.streams.held_until(now)
    }

    /// How many data packets the pacer, the window and the burst limit let leave now, out
    /// of `slots` of `max` bytes.
    fn data_burst(&self, now: Instant, slots: usize, max: usize, rate: u64) -> usize {
        if self.recovery.probes() > 0 {
            return self.recovery.probes() as usize;
        }
        let held = self.held_until.is_some();
        if !self.wants_to_send_data() || held || self.pacer.delay(now).is_some() {
            return 0;
        }
        let room = self.recovery.window_room();
        let burst = Pacer::burst_bytes(rate, 2 * max as u64, (slots * max) as u64);
        let by_burst = burst.div_ceil(max as u64);
        let by_window = room.div_ceil(max as u64);
        (by_burst.min(by_window) as usize).min(slots)
    }

    fn transmit_packets(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.apply_datagram_size();
        // Full-size packets go unanswered: build small ones, whose acknowledgement shows a
        // black hole (and which get data through it).
        let max = if self.recovery.suspects_black_hole(now) {
            usize::from(BASE_DATAGRAM)
        } else {
            self.max_datagram()
        };
        let slots = self
            .config
            .max_burst_packets
            .min(buf.len().min(MAX_SEND_BYTES) / max);
        if slots == 0 {
            return None;
        }
        let has_parity = self.recovery.fec.as_ref().is_some_and(|f| f.has_parity());
        if has_parity && self.pacer.delay(now).is_none() {
            // Parity first: it repairs packets already on their way.
            return self.transmit_parity(now, buf);
        }
        if let Some(transmit) = self.transmit_mtu_probe(now, buf) {
            return Some(transmit);
        }
        let ack_due = self.acks.is_due(now);
        let probing = self.recovery.probes() > 0;
        let rate = self.recovery.pacing_rate(self.config.max_rate);
        self.held_until = self.held_until(now);
        let nothing_queued = !self.streams.has_pending() && !self.control.has_queued();
        if (nothing_queued || self.held_until.is_some()) && self.recovery.window_room() > 0 {
            // The application has nothing waiting (what leaves is a PING, a probe, parity or
            // an ACK), or the scheduler's rate holds it back: delivery samples of
            // what is sent now measure that, not what the path carries, and must not lower
            // the estimate of it. The handshake's confirming PING is such a packet.
            self.recovery.on_app_limited();
        }
        let data_packets = self.data_burst(now, slots, max, rate);
        if data_packets == 0 && !ack_due {
            return None;
        }
        let packets = data_packets.max(usize::from(ack_due)).min(slots);
        // While FEC protects, every packet joins a block and is built to fit a shard; the
        // whole burst has that size (GSO).
        let srtt = self.rtt().smoothed();
        let next_pn = self.recovery.next_pn();
        let flight_ending = self.streams.send_unsent() <= bytes_in(rate, srtt / 2);
        let batch_protected = self.recovery.fec.as_mut().is_some_and(|f| {
            (data_packets > 0 || f.is_open()) && f.protect_next(now, next_pn, srtt, flight_ending)
        });
        let cap = match &self.recovery.fec {
            Some(f) if batch_protected => f.max_protected().min(max),
            _ => max,
        };
        let (mut size, mut segment, mut count, mut eliciting_bytes) = (0, 0, 0, 0);
        let mut mark = BurstMark::default();
        for i in 0..packets {
            let next_pn = self.recovery.next_pn();
            let protected = batch_protected
                && self
                    .recovery
                    .fec
                    .as_mut()
                    .is_some_and(|f| f.protect_next(now, next_pn, srtt, flight_ending));
            let out = &mut buf[size..size + cap];
            let with_ack = i == 0 && (ack_due || self.acks.is_pending() && data_packets > 0);
            let with_data = i < data_packets;
            let Some((len, eliciting)) = self.build_packet(
                now,
                out,
                with_ack,
                with_data.then_some(&mut mark),
                protected,
            ) else {
                break;
            };
            if count > 0 && len > segment {
                // Cannot happen: packets are built full-size until the last.
                break;
            }
            if eliciting {
                eliciting_bytes += len as u64;
            }
            size += len;
            count += 1;
            if count == 1 {
                segment = len;
            }
            if len < segment || len < cap || mark.ended {
                break;
            }
        }
        if count == 0 {
            return None;
        }
        let departure = self.pacer.next().map_or(now, |t| t.min(now));
        if eliciting_bytes > 0 && !probing {
            self.pacer.on_sent(now, eliciting_bytes, rate);
        }
        self.recovery.on_probes_sent(count as u32);
        if !self.wants_to_send_data() {
            if self.recovery.window_room() > 0 {
                self.recovery.on_app_limited();
            }
            if eliciting_bytes > 0 {
                // The flight ends here: its block's parity follows it now, not when the
                // flush timer fires a quarter of an RTT later, so a loss among an answer's
                // last packets is rebuilt as soon as the answer could have arrived.
                if let Some(fec) = &mut self.recovery.fec {
                    fec.close_block();
                }
            }
        }
        Some(Transmit {
            destination: self.remote,
            size,
            segment_size: (count > 1).then_some(segment),
            departure,
            dscp: mark.dscp.unwrap_or(0),
        })
    }

    /// A burst of parity packets, paced like data. Their bytes count in flight with the last
    /// packet of their block, so that they take their share of the congestion window and
    /// the delivery rate sees the whole wire.
    fn transmit_parity(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let len = self.recovery.fec.as_ref()?.parity_packet_len();
        let slots = self
            .config
            .max_burst_packets
            .min(buf.len().min(MAX_SEND_BYTES) / len);
        let rate = self.recovery.pacing_rate(self.config.max_rate);
        let burst = Pacer::burst_bytes(rate, 2 * len as u64, (slots * len) as u64);
        let packets = (burst.div_ceil(len as u64) as usize).clamp(1, slots.max(1));
        let (mut size, mut count) = (0, 0);
        while count < packets && size + len <= buf.len() {
            if self.recovery.fec.as_ref()?.parity_packet_len() != len {
                // The next block was coded for another datagram size: a send of its own.
                break;
            }
            let out = &mut buf[size..size + len];
            let parity = Header::Parity {
                receiver: self.remote_id,
            };
            parity.emit(&mut Writer::new(&mut out[..parity.len()]));
            let next_pn = self.recovery.next_pn();
            let fec = self.recovery.fec.as_mut()?;
            let Some((_, owner)) = fec.pop_parity(now, next_pn, &mut out[parity.len()..]) else {
                break;
            };
            self.recovery.on_parity_sent(owner, len);
            self.count_sent(now, len);
            size += len;
            count += 1;
        }
        if count == 0 {
            return None;
        }
        let departure = self.pacer.next().map_or(now, |t| t.min(now));
        self.pacer.on_sent(now, size as u64, rate);
        self.recovery.on_parity_burst(now, size as u64);
        Some(Transmit {
            destination: self.remote,
            size,
            segment_size: (count > 1).then_some(len),
            departure,
            dscp: 0,
        })
    }

    /// A path MTU probe, if one is due: a PING padded to the size tried, alone in its
    /// datagram, outside the window and the pacer (see `mtu.rs`). An open FEC block is coded
    /// first (blocks are runs of consecutive packets, which the probe would break).
    fn transmit_mtu_probe(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let size = usize::from(self.recovery.mtu.probe_due(now)?);
        if size > buf.len() {
            return None;
        }
        if let Some(fec) = &mut self.recovery.fec {
            fec.close_block();
        }
        let payload_len = {
            let mut w = Writer::new(&mut buf[DATA_HEADER_LEN..size - TAG_LEN]);
            Frame::Ping.encode(&mut w);
            let pad = w.remaining();
            w.reserve(pad).fill(0);
            w.len()
        };
        let number = self.recovery.next_pn();
        let size = self.seal(now, number, buf, payload_len, false);
        self.recovery.on_mtu_probe_sent(now, size);
        Some(self.single_datagram(now, size))
    }

    /// Builds one packet into `out`; returns its size and whether it is ack-eliciting.
    /// With `data`, it carries data frames, of streams of the burst's DSCP. A `protected`
    /// packet joins the open FEC block.
    fn build_packet(
        &mut self,
        now: Instant,
        out: &mut [u8],
        with_ack: bool,
        data: Option<&mut BurstMark>,
        protected: bool,
    ) -> Option<(usize, bool)> {
        let max = out.len();
        let mut frames = FrameList::new();
        let mut acked = false;
        let mut eliciting = false;
        let payload_len = {
            let mut w = Writer::new(&mut out[DATA_HEADER_LEN..max - TAG_LEN]);
            if with_ack {
                acked = self.write_acks(now, &mut w);
            }
            if let Some(mark) = data {
                eliciting = self.write_data(now, &mut w, &mut frames, mark);
            }
            w.len()
        };
        if payload_len == 0 {
            return None;
        }
        if acked {
            self.stats.acks_sent += 1;
            self.acks.on_sent(now);
        }
        let number = self.recovery.next_pn();
        let size = self.seal(now, number, out, payload_len, protected);
        if protected {
            if let Some(fec) = &mut self.recovery.fec {
                fec.on_sealed(number, &mut out[..size], eliciting);
            }
        }
        self.count_sent(now, size);
        if eliciting {
            self.stats.eliciting_sent += 1;
        } else {
            self.stats.ack_only_sent += 1;
        }
        self.recovery.on_packet_sent(now, size, eliciting, frames);
        Some((size, eliciting))
    }

    /// Writes the RECOVERED and ACK frames, if anything was received; returns whether the
    /// ACK fit.
    fn write_acks(&mut self, now: Instant, w: &mut Writer<'_>) -> bool {
        if !self.acks.has_received() {
            return false;
        }
        if let Some(fec) = &mut self.fec_receiver {
            // Before the ACK, so that the sender marks them first.
            fec.write_recovered(w);
        }
        self.acks
            .frame(now, w.remaining())
            .is_some_and(|ack| Frame::Ack(ack).encode_if_fits(w))
    }

    /// Writes stream credit and resets, control messages, stream data and, if nothing else
    /// elicits an ACK, a due PING; pads a nearly full packet. Records what needs tracking in
    /// `frames`; returns whether the packet is ack-eliciting.
    fn write_data(
        &mut self,
        now: Instant,
        w: &mut Writer<'_>,
        frames: &mut FrameList,
        mark: &mut BurstMark,
    ) -> bool {
        let stream_frames = &mut self.stream_frames;
        self.streams.write_control_frames(w, stream_frames);
        let mut eliciting = self
            .control
            .write_frames(w, |seq| frames.push(SentFrame::Control(seq)));
        let before = w.len();
        let stream_bytes = self
            .streams
            .write_stream_frames(now, w, stream_frames, mark);
        self.stats.stream_bytes_sent += stream_bytes as u64;
        eliciting |= w.len() > before || !stream_frames.is_empty();
        frames.extend(stream_frames.drain(..).map(SentFrame::Stream));
        let ping = self.ping_pending || self.recovery.probes() > 0;
        if ping && !eliciting && w.remaining() > 0 {
            Frame::Ping.encode(w);
            eliciting = true;
        }
        if eliciting {
            self.ping_pending = false;
        }
        if w.len() > 0 && w.remaining() < PAD_BELOW {
            let pad = w.remaining();
            w.reserve(pad).fill(0);
        }
        eliciting
    }
}
