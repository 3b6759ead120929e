//! Every parser of the tunnel that sees bytes from the network, fed arbitrary input: any
//! panic (an out-of-bounds slice, an overflow, an unwrap) is a finding.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsx_tunnel::fuzzing::parse_all(data);
});
