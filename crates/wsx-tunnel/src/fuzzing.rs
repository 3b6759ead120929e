//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): every parser that sees
//! bytes from the network, reachable without a key. Not a stable API.

use crate::connection::{self, params::TransportParams};
use crate::wire::{Frames, Header, Reader};

/// Runs `data` through every parser that handles untrusted input: the cleartext packet
/// header, the frames of a decrypted payload, the handshake payload and the transport
/// parameters. Parsing must return errors, never panic; the caller only checks that.
pub fn parse_all(data: &[u8]) {
    let _ = Header::parse(data);
    for frame in Frames::new(data) {
        if frame.is_err() {
            break;
        }
    }
    let _ = connection::parse_initiation_payload(data);
    let _ = TransportParams::parse(&mut Reader::new(data));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_inputs_do_not_panic() {
        for data in [&[][..], &[0xff; 64], &[0x03; 13], &[0x10, 0xc0, 0xff, 0xff]] {
            parse_all(data);
        }
    }
}
