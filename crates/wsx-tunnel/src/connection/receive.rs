//! A datagram in: the handshake response, or a data packet checked against replays,
//! staged for FEC, opened, and its frames handed to their owners; parity rebuilds lost
//! packets, which then go the same way.

use super::ack::ACK_RANGES_KEPT;
use super::handshake::ResponseError;
use super::{Connection, ConnectionError, Event, FrameOwners, State, TransportError};
use crate::wire::{DataHeader, Frame, Frames, Header, Packet};
use std::net::SocketAddr;
use std::time::Instant;

impl Connection {
    /// Processes one datagram addressed to this connection. Datagrams that fail
    /// authentication or replay checks are dropped silently.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &mut [u8]) {
        let Ok(packet) = Packet::new_checked(datagram) else {
            return;
        };
        match packet.header() {
            Header::Initiation { .. } => {}
            Header::Response { .. } => self.handle_response(now, &packet),
            Header::Data(h) => {
                self.handle_data(now, from, h, packet);
                if h.protected {
                    self.handle_recovered(now);
                }
            }
            Header::Parity { .. } => {
                if !self.is_established() {
                    return;
                }
                if let Some(fec) = &mut self.fec_receiver {
                    fec.on_parity(packet.body());
                    self.handle_recovered(now);
                }
            }
        }
    }

    fn handle_response(&mut self, now: Instant, packet: &Packet<&mut [u8]>) {
        let State::Handshake(init) = &mut self.state else {
            return;
        };
        let response = match init.on_response(now, packet) {
            Ok(Some(response)) => response,
            Ok(None) => return,
            Err(ResponseError::Forged) => {
                self.stats.auth_failures += 1;
                return;
            }
            Err(ResponseError::Violation(error)) => {
                tracing::debug!(%error, "peer sent bad transport parameters");
                self.state = State::Drained;
                let lost = ConnectionError::ProtocolViolation(error);
                self.events.push_back(Event::ConnectionLost(lost));
                return;
            }
        };
        if let Some(rtt) = response.rtt {
            self.recovery.on_rtt_sample(rtt);
        }
        self.remote_id = response.remote_id;
        self.keys = Some(response.keys);
        self.apply_peer_params(response.params);
        self.last_heard = now;
        self.become_established(now);
    }

    /// Processes a data packet; returns whether it authenticated.
    fn handle_data(
        &mut self,
        now: Instant,
        from: SocketAddr,
        h: DataHeader,
        mut packet: Packet<&mut [u8]>,
    ) -> bool {
        if !self.open(now, h, &mut packet) {
            return false;
        }
        self.on_authenticated(now, from, h.number, packet.len());
        if let State::Closing { .. } = self.state {
            // Answer whatever the peer still sends with the CLOSE again.
            self.close_resend = true;
            return true;
        }
        self.handle_frames(now, h.number, packet.payload());
        true
    }

    /// Checks a data packet against replays and opens it in place (keeping a sealed copy
    /// for FEC first if it is protected). Returns whether it authenticated.
    fn open(&mut self, now: Instant, h: DataHeader, packet: &mut Packet<&mut [u8]>) -> bool {
        if matches!(self.state, State::Drained | State::Handshake(_)) {
            return false;
        }
        let Some(keys) = &mut self.keys else {
            return false;
        };
        if !self.replay.check(h.number) {
            self.stats.replays += 1;
            return false;
        }
        if h.protected {
            // Decryption works in place: keep the sealed packet for the block's repair.
            if let Some(fec) = &mut self.fec_receiver {
                fec.stage(h.number, packet.buffer_mut());
            }
        }
        let (header, payload, tag) = packet.sealed_mut();
        if !keys.open(now, h.key_phase, h.number, header, payload, tag) {
            self.stats.auth_failures += 1;
            return false;
        }
        self.replay.accept(h.number);
        if h.protected {
            if let Some(fec) = &mut self.fec_receiver {
                fec.commit(h.number);
            }
        }
        true
    }

    /// An authenticated packet `number` of `len` bytes came from `from`: the peer is alive,
    /// may have moved, and (for a responder) has confirmed the keys.
    fn on_authenticated(&mut self, now: Instant, from: SocketAddr, number: u64, len: usize) {
        self.stats.packets_received += 1;
        self.stats.bytes_received += len as u64;
        // Heard again after a silence longer than the peer's pings leave: what vanished
        // meanwhile was lost to the outage, not to a path that drops full-size packets.
        if now.saturating_duration_since(self.last_heard) > self.config.keepalive * 2 {
            self.recovery.on_peer_back(now);
        }
        self.last_heard = now;
        if self.acks.is_newest(number) && from != self.remote {
            // The peer moved (NAT rebinding, failover); it proved itself by authenticating.
            tracing::debug!(old = %self.remote, new = %from, "peer address changed");
            self.remote = from;
        }
        if let State::AwaitingConfirmation { sent_at, .. } = self.state {
            if let Some(sent) = sent_at {
                self.recovery
                    .on_rtt_sample(now.saturating_duration_since(sent));
            }
            self.become_established(now);
            self.ping_pending = false;
        }
    }

    /// Hands each frame of packet `number` to its owner, then records the packet for
    /// acknowledgement. A frame that breaks the protocol closes the connection.
    fn handle_frames(&mut self, now: Instant, number: u64, payload: &[u8]) {
        let mut eliciting = false;
        for frame in Frames::new(payload) {
            let handled = frame.map_err(TransportError::from).and_then(|frame| {
                eliciting |= frame.is_ack_eliciting();
                self.handle_frame(now, frame)
            });
            if let Err(error) = handled {
                return self.protocol_violation(now, error);
            }
            if matches!(self.state, State::Draining { .. }) {
                return;
            }
        }
        self.acks
            .on_packet(now, number, eliciting, self.recovery.rtt());
    }

    fn handle_frame(&mut self, now: Instant, frame: Frame<'_>) -> Result<(), TransportError> {
        let ty = frame.ty();
        let mut owners = FrameOwners {
            streams: &mut self.streams,
            control: &mut self.control,
        };
        match frame {
            Frame::Padding | Frame::Ping => {}
            Frame::Ack(ack) => self.recovery.on_ack_frame(now, &ack, &mut owners)?,
            Frame::Recovered(ranges) => self.recovery.on_recovered_frame(&ranges)?,
            Frame::Close { code, reason } => {
                self.state = State::Draining {
                    until: now + self.recovery.rtt().pto_base() * 3,
                };
                let reason = String::from_utf8_lossy(reason).into_owned();
                let lost = ConnectionError::PeerClosed { code, reason };
                self.events.push_back(Event::ConnectionLost(lost));
            }
            Frame::MaxData(max) => self.streams.on_max_data(max),
            Frame::MaxStreamData { id, max } => self
                .streams
                .on_max_stream_data(id, max)
                .map_err(|e| e.in_frame(ty))?,
            Frame::MaxStreams(max) => self.streams.on_max_streams(max),
            Frame::Control { seq, data } => {
                let events = &mut self.events;
                self.control
                    .on_frame(seq, data, |m| events.push_back(Event::Control(m)))?;
            }
            Frame::Open { id, meta } => self
                .streams
                .on_open(id, meta.into_owned())
                .map_err(|e| e.in_frame(ty))?,
            Frame::Reset {
                id,
                code,
                final_size,
            } => self
                .streams
                .on_reset(id, code, final_size)
                .map_err(|e| e.in_frame(ty))?,
            Frame::Stream(f) => self.streams.on_stream(&f).map_err(|e| e.in_frame(ty))?,
        }
        Ok(())
    }

    /// Processes the packets FEC rebuilt as if they had arrived, and reports those that
    /// authenticate.
    fn handle_recovered(&mut self, now: Instant) {
        let mut buf = std::mem::take(&mut self.recovered_buf);
        buf.resize(self.datagram_cap(), 0);
        let local_id = self.local_id;
        while let Some((pn, len)) = self
            .fec_receiver
            .as_mut()
            .and_then(|f| f.pop_recovered(local_id, &mut buf))
        {
            let Ok(packet) = Packet::new_checked(&mut buf[..len]) else {
                continue;
            };
            let Header::Data(h) = packet.header() else {
                continue;
            };
            if h.number != pn || h.receiver != self.local_id {
                continue;
            }
            let remote = self.remote;
            if self.handle_data(now, remote, h, packet) {
                if let Some(fec) = &mut self.fec_receiver {
                    fec.on_recovered(pn, ACK_RANGES_KEPT);
                }
                // Acknowledge at once: the sender holds the packet's loss verdict for about
                // one RTT after the parity, no longer.
                self.acks.ack_now(now);
            }
        }
        self.recovered_buf = buf;
    }
}
