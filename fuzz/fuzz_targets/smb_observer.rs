//! The SMB observer on hostile bytes: both directions of a TCP 445 connection, cut into
//! reads where the input says. Nothing may panic, and a connection that passed through
//! stays passed through.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wsx_smb::{Direction, Observer, Verdict};

fuzz_target!(|data: &[u8]| {
    let mut o = Observer::new();
    let mut passed = None;
    // Each read: one byte of direction and length (bit 7: toward the client), then that many
    // bytes (up to 127).
    let mut rest = data;
    while let Some((&control, tail)) = rest.split_first() {
        let len = usize::from(control & 0x7f).min(tail.len());
        let (bytes, tail) = tail.split_at(len);
        rest = tail;
        let direction = if control & 0x80 != 0 {
            Direction::ToClient
        } else {
            Direction::ToServer
        };
        o.feed(direction, bytes);
        match passed {
            Some(v) => assert_eq!(o.verdict(), v),
            None if matches!(o.verdict(), Verdict::PassThrough(_)) => passed = Some(o.verdict()),
            None => {}
        }
    }
});
