//! Stream compression: arbitrary bytes as a chunk stream must decode or fail cleanly, and
//! arbitrary plain bytes, cut into chunks at fuzzer-chosen sizes, must come back exactly.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wsx_compress::{Compressor, MAX_CHUNK, decode_all};

fuzz_target!(|data: &[u8]| {
    // As received from a peer: never a panic, never more than the declared lengths.
    if let Ok(plain) = decode_all(data) {
        assert!(plain.len() <= data.len().div_ceil(3) * MAX_CHUNK);
    }
    // As sent: level and cut sizes from the first bytes, the rest is the plain stream.
    let Some((&control, plain)) = data.split_first() else {
        return;
    };
    let mut compressor = Compressor::new(u32::from(control % 10));
    let mut wire = Vec::new();
    let mut at = 0;
    let mut step = usize::from(control) * 131 % MAX_CHUNK + 1;
    while at < plain.len() {
        let n = step.min(plain.len() - at);
        compressor.encode(&plain[at..at + n], &mut wire);
        at += n;
        step = step * 3 % MAX_CHUNK + 1;
    }
    assert_eq!(decode_all(&wire).expect("our own chunks decode"), plain);
});
