//! The receiving half of FEC: staged copies of protected packets, rebuilding from parity,
//! and the RECOVERED frames that tell the sender what was rebuilt.

use super::{DATA_HEADER_LEN, FecStats, PARITY_INFO_LEN, REBUILT, shard_bytes, with_shard};
use crate::range_set::RangeSet;
use crate::wire::frame::{Ack, Frame};
use crate::wire::{DataHeader, Header, Writer};
use wsx_fec::{Decoder, ParityInfo};

#[derive(Debug)]
pub(in crate::connection) struct FecReceiver {
    decoder: Decoder,
    /// Packets rebuilt and not yet reported, and those reported once (each is reported in
    /// two ACKs, so that one lost ACK loses nothing).
    recovered: RangeSet,
    reported: RangeSet,
}

impl FecReceiver {
    /// The receiving half for datagrams of at most `max_datagram` bytes. The decoder takes
    /// memory only once the first protected packet arrives.
    pub(in crate::connection) fn new(max_datagram: usize) -> Self {
        Self {
            decoder: Decoder::new(shard_bytes(max_datagram)),
            recovered: RangeSet::new(),
            reported: RangeSet::new(),
        }
    }

    pub(in crate::connection) fn stats(&self) -> FecStats {
        let d = self.decoder.stats();
        FecStats {
            parity_received: d.parity,
            recovered: d.recovered,
            unrecoverable_groups: d.unrecoverable,
            decoder_bytes: self.decoder.memory() as u64,
            ..FecStats::default()
        }
    }

    /// Keeps a copy of a protected packet (of at least a data header) before it is
    /// decrypted in place.
    pub(in crate::connection) fn stage(&mut self, pn: u64, packet: &mut [u8]) {
        if packet.len() >= DATA_HEADER_LEN {
            let decoder = &mut self.decoder;
            with_shard(packet, |shard| decoder.stage(pn, shard));
        }
    }

    pub(in crate::connection) fn commit(&mut self, pn: u64) {
        self.decoder.commit(pn);
    }

    /// A parity packet's body (after its header). Malformed ones are ignored.
    pub(in crate::connection) fn on_parity(&mut self, body: &[u8]) {
        let Ok(info) = ParityInfo::parse(body) else {
            return;
        };
        self.decoder.on_parity(info, &body[PARITY_INFO_LEN..]);
    }

    /// The next rebuilt packet, still sealed, into `out` (at least a data header long),
    /// with the header the sender gave it: `receiver` (this side's id), the number, and the
    /// type byte the shard carried.
    pub(in crate::connection) fn pop_recovered(
        &mut self,
        receiver: u32,
        out: &mut [u8],
    ) -> Option<(u64, usize)> {
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
    pub(in crate::connection) fn on_recovered(&mut self, pn: u64, keep: usize) {
        self.recovered.insert(pn..pn + 1);
        self.recovered.keep_highest(keep);
    }

    /// Writes a RECOVERED frame for the packets rebuilt since the last ACK but one.
    pub(in crate::connection) fn write_recovered(&mut self, w: &mut Writer<'_>) {
        if self.recovered.is_empty() && self.reported.is_empty() {
            return;
        }
        let mut all = self.reported.clone();
        for range in self.recovered.iter() {
            all.insert(range);
        }
        let written = Ack::recovering(all.iter(), w.remaining())
            .is_some_and(|ranges| Frame::Recovered(ranges).encode_if_fits(w));
        if written {
            self.reported = std::mem::take(&mut self.recovered);
        }
    }
}
