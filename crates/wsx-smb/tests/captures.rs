//! The observer on real traffic: both directions of smbclient sessions against Samba 4.17,
//! recorded byte for byte (`tests/captures/NAME.to_server`, `.to_client`), each reading a
//! 3,000-byte file. Fed in reads of every size from 1 byte, the verdict is the same.
//!
//! - `guest21`: SMB 2.1, guest: nothing is signed.
//! - `user21`: SMB 2.1, a user, signing off on both sides: smbclient still signs TREE_CONNECT.
//! - `signed21`: SMB 2.1, a user, signing required by the client.
//! - `user311`: SMB 3.1.1, a user: TREE_CONNECT is signed (3.1.1 requires it).
//! - `enc311`: SMB 3.1.1, the client requires encryption: transform headers.
//! - `encshare311`: SMB 3.1.1 on a share that requires encryption: its signed TREE_CONNECT
//!   comes first, so the reason given is signing.

use wsx_smb::wire::messages::Dialect;
use wsx_smb::{Direction, Observer, Reason, Verdict};

fn capture(name: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/captures/");
    let read = |suffix: &str| {
        let path = format!("{dir}{name}.{suffix}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    (read("to_server"), read("to_client"))
}

/// The verdict after both directions were fed, in reads of `step` bytes, alternating
/// (requests first): for these sessions and small reads, each request comes before its
/// answer, the order the relay sees them in.
fn verdict(name: &str, step: usize) -> (Verdict, Option<Dialect>) {
    let (to_server, to_client) = capture(name);
    let mut o = Observer::new();
    let (mut s, mut c) = (to_server.chunks(step), to_client.chunks(step));
    loop {
        let request = s.next();
        if let Some(b) = request {
            o.feed(Direction::ToServer, b);
        }
        let response = c.next();
        if let Some(b) = response {
            o.feed(Direction::ToClient, b);
        }
        if request.is_none() && response.is_none() {
            return (o.verdict(), o.dialect());
        }
    }
}

#[test]
fn real_sessions_are_judged_as_they_are() {
    let cases = [
        ("guest21", Verdict::Unsigned, Dialect::SMB_2_1),
        (
            "user21",
            Verdict::PassThrough(Reason::Signed),
            Dialect::SMB_2_1,
        ),
        (
            "signed21",
            Verdict::PassThrough(Reason::Signed),
            Dialect::SMB_2_1,
        ),
        (
            "user311",
            Verdict::PassThrough(Reason::Signed),
            Dialect::SMB_3_1_1,
        ),
        (
            "enc311",
            Verdict::PassThrough(Reason::Encrypted),
            Dialect::SMB_3_1_1,
        ),
        (
            "encshare311",
            Verdict::PassThrough(Reason::Signed),
            Dialect::SMB_3_1_1,
        ),
    ];
    for (name, want, dialect) in cases {
        for step in [1, 2, 3, 7, 64, 100, 1500, 1 << 20] {
            let (got, agreed) = verdict(name, step);
            assert_eq!(got, want, "{name}, reads of {step}");
            // In large reads, a whole direction's requests can come before the NEGOTIATE
            // response, and a signed one ends the observation before the dialect is known.
            if step <= 100 {
                assert_eq!(agreed, Some(dialect), "{name}, reads of {step}");
            }
        }
    }
}
