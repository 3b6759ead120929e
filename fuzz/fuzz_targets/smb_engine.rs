//! The read-ahead engine's two halves on hostile bytes: any frames from the client and the
//! server, any records between the gateways (parsed as the stream would be), in any order.
//! Nothing may panic. Seeded with nothing: each step is a kind byte, a length byte and that
//! many bytes (up to 255); one kind moves both halves' clock on by the length in ms (far
//! has a 200 ms validity window for files others may write).

#![no_main]

use libfuzzer_sys::fuzz_target;
use wsx_smb::engine::{Far, Near, Record};

fuzz_target!(|data: &[u8]| {
    let (mut near, mut far) = (Near::new(), Far::new(1 << 20));
    far.set_validity(200);
    let mut now = std::time::Instant::now();
    near.set_now(now);
    far.set_now(now);
    let mut rest = data;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, tail) = tail.split_at(len);
        rest = tail;
        match kind % 5 {
            0 => near.from_client(bytes.to_vec()),
            1 => {
                if let Some((&k, payload)) = bytes.split_first()
                    && let Ok(record) = Record::parse(k % 7, payload)
                {
                    near.from_far(record);
                }
            }
            2 => {
                if let Some((&k, payload)) = bytes.split_first()
                    && let Ok(record) = Record::parse(k % 7, payload)
                {
                    far.from_near(record);
                }
            }
            3 => far.from_server(bytes.to_vec()),
            _ => {
                now += std::time::Duration::from_millis(len as u64);
                near.set_now(now);
                far.set_now(now);
            }
        }
        // What each half hands out goes where it would.
        while let Some(record) = near.poll_to_far() {
            far.from_near(record);
        }
        while let Some(record) = far.poll_to_near() {
            near.from_far(record);
        }
        while near.poll_to_client().is_some() {}
        while far.poll_to_server().is_some() {}
    }
});
