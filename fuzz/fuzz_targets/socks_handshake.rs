//! The SOCKS5 server's handshake fed whatever a client might send: it must end in a
//! destination or an error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsx_proxy::fuzzing::socks_handshake(data);
});
