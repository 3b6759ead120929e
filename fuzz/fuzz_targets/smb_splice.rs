//! Both engine halves as the gateways run them, each in a `Splice`, on hostile bytes: any
//! bytes from the client, the server, or a peer gateway that is not one, cut anywhere, with
//! ends at any point; what one half sends the other reads, as on the tunnel stream.
//! Nothing may panic; an error ends the session (a fresh pair goes on). Each step is a
//! kind byte, a length byte and that many bytes (up to 255); one kind moves both halves'
//! clock on by the length in ms (far reads ahead files others may write, with a 200 ms
//! validity window, so held answers expire and are dropped).

#![no_main]

use libfuzzer_sys::fuzz_target;
use wsx_smb::engine::Splice;

fuzz_target!(|data: &[u8]| {
    let epoch = std::time::Instant::now();
    let mut now = epoch;
    let fresh = |now| {
        let (mut near, mut far) = (Splice::near(), Splice::far(1 << 20));
        far.set_validity(200);
        near.set_now(now);
        far.set_now(now);
        (near, far)
    };
    let (mut near, mut far) = fresh(now);
    let mut rest = data;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, tail) = tail.split_at(len);
        rest = tail;
        let result = match kind % 7 {
            0 => near.from_end(bytes),
            1 => far.from_end(bytes),
            2 => near.from_peer(bytes),
            3 => far.from_peer(bytes),
            4 => {
                near.end_finished();
                far.end_finished();
                Ok(())
            }
            5 => near.peer_finished().and_then(|()| far.peer_finished()),
            _ => {
                now += std::time::Duration::from_millis(len as u64);
                near.set_now(now);
                far.set_now(now);
                let _ = near.next_deadline();
                Ok(())
            }
        };
        // The stream between them, both ways, and the ends take everything.
        let result = result.and_then(|()| {
            let up = near.to_peer().to_vec();
            near.peer_written(up.len());
            far.from_peer(&up)?;
            let down = far.to_peer().to_vec();
            far.peer_written(down.len());
            near.from_peer(&down)
        });
        near.end_written(near.to_end().len());
        far.end_written(far.to_end().len());
        let _ = (near.held(), far.held(), near.stats(), far.held_for_end());
        if result.is_err() {
            (near, far) = fresh(now);
        }
    }
});
