//! Ten thousand SMB sessions at once through both engine halves, far's read-ahead leased
//! from one gateway's relay budget: the simulated client and server of `wsx_smb::sim`,
//! the gateway's [`Engine`]s driven as `relay::copy_spliced` drives them (lease before
//! far is handed bytes, count and settle after each step), a WAN of 100 ms between the
//! halves, virtual time.

use super::{Engine, SmbTotals};
use crate::buffers::RelayBuffers;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use wsx_smb::sim::{Client, Server, framed, parties, pieces};
use wsx_smb::wire::framing::Frames;

/// Bytes on their way to one part of a session.
enum Hop {
    ToNear(Vec<u8>),
    NearToFar(Vec<u8>),
    FarToNear(Vec<u8>),
    ToFarFromServer(Vec<u8>),
    ToServer(Vec<u8>),
    ToClient(Vec<u8>),
}

/// One of a session's outputs: near's (or far's), to its end (or its peer), as which hop,
/// arriving when.
type Output = (bool, bool, fn(Vec<u8>) -> Hop, u64);

struct Session {
    client: Client,
    server: Server,
    near: Engine,
    far: Engine,
    to_client: Frames,
    to_server: Frames,
    cut: u64,
}

/// Events by time (µs), in the order they were scheduled within a time.
#[derive(Default)]
struct Wire {
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    hops: std::collections::HashMap<u64, (usize, Hop)>,
    seq: u64,
}

impl Wire {
    fn send(&mut self, at: u64, session: usize, hop: Hop) {
        self.seq += 1;
        self.hops.insert(self.seq, (session, hop));
        self.queue.push(Reverse((at, self.seq)));
    }

    fn next(&mut self) -> Option<(u64, usize, Hop)> {
        let Reverse((at, seq)) = self.queue.pop()?;
        let (session, hop) = self.hops.remove(&seq)?;
        Some((at, session, hop))
    }
}

const SESSIONS: usize = 10_000;
const FILE_BYTES: usize = 32 << 10;
const READ_BYTES: u32 = 4 << 10;
const ONE_WAY_US: u64 = 50_000;
/// The gateway's relay budget: read-ahead may take half of it, 8 MiB, which 10,000
/// sessions reading 28 KiB ahead each (280 MB) would outgrow 34 times.
const BUDGET: usize = 16 << 20;
/// What one session may hold at near besides the read-ahead: a frame in progress and one
/// answer on its way to the client.
const PER_SESSION: u64 = 2 * (READ_BYTES as u64 + 256);

/// What an idle session's halves may keep: the room of an emptied outbox each way
/// (`KEEP_ROOM` in `wsx_smb::engine::splice`).
const IDLE: u64 = 2 * (16 << 10);

/// Ten thousand sessions, each reading a 32 KiB file in 4 KiB READs with one outstanding,
/// all at once: far's leases never exceed the read-ahead half of the budget, near never
/// holds more than those leases cover plus a frame or two per session, the budget runs
/// out and sessions go on without read-ahead, every session reads its file byte for byte
/// with the server seeing no id twice and none skipped, and every byte leased comes back.
#[test]
fn ten_thousand_sessions_read_ahead_within_one_gateway_budget() {
    let budget = RelayBuffers::new(BUDGET);
    let (near_totals, far_totals) = (
        Arc::new(SmbTotals::default()),
        Arc::new(SmbTotals::default()),
    );
    let mut sessions: Vec<Session> = (0..SESSIONS)
        .map(|i| {
            let (client, server) = parties(FILE_BYTES, READ_BYTES);
            Session {
                client,
                server,
                near: Engine::near(near_totals.clone()),
                far: Engine::far(
                    crate::smb::DEFAULT_READ_AHEAD,
                    far_totals.clone(),
                    budget.clone(),
                ),
                to_client: Frames::new(),
                to_server: Frames::new(),
                cut: i as u64,
            }
        })
        .collect();
    let file = sessions[0].server.file.clone();
    let mut wire = Wire::default();
    for (i, session) in sessions.iter_mut().enumerate() {
        // The sessions start within a millisecond.
        let at = (i as u64 * 1000) / SESSIONS as u64;
        wire.send(at, i, Hop::ToNear(framed(&session.client.start())));
    }
    let (mut peak_lent, mut peak_near_held) = (0, 0);
    let mut events = 0u64;
    while let Some((now, i, hop)) = wire.next() {
        events += 1;
        let s = &mut sessions[i];
        match hop {
            Hop::ToNear(bytes) => s.near.splice.from_end(&bytes).unwrap(),
            Hop::FarToNear(bytes) => s.near.splice.from_peer(&bytes).unwrap(),
            Hop::NearToFar(bytes) => {
                s.far.lease();
                s.far.splice.from_peer(&bytes).unwrap();
            }
            Hop::ToFarFromServer(bytes) => {
                s.far.lease();
                s.far.splice.from_end(&bytes).unwrap();
            }
            Hop::ToServer(bytes) => {
                let mut frames = Vec::new();
                s.to_server
                    .feed(&bytes, |k| k == 0, |_, f| frames.push(f))
                    .unwrap();
                for frame in frames {
                    for answer in s.server.answer(&frame) {
                        wire.send(now, i, Hop::ToFarFromServer(framed(&answer)));
                    }
                }
            }
            Hop::ToClient(bytes) => {
                let mut frames = Vec::new();
                s.to_client
                    .feed(&bytes, |k| k == 0, |_, f| frames.push(f))
                    .unwrap();
                for frame in frames {
                    for next in s.client.answered_all(&frame, now) {
                        wire.send(now, i, Hop::ToNear(framed(&next)));
                    }
                }
            }
        }
        // What each half has to write, as the relays write it, cut as TCP would.
        let mut out = Vec::new();
        let outputs: [Output; 4] = [
            (true, true, Hop::ToClient, now),
            (true, false, Hop::NearToFar, now + ONE_WAY_US),
            (false, false, Hop::FarToNear, now + ONE_WAY_US),
            (false, true, Hop::ToServer, now),
        ];
        for (near, end, hop, at) in outputs {
            let splice = if near {
                &mut s.near.splice
            } else {
                &mut s.far.splice
            };
            let bytes = if end {
                splice.to_end().to_vec()
            } else {
                splice.to_peer().to_vec()
            };
            if end {
                splice.end_written(bytes.len());
            } else {
                splice.peer_written(bytes.len());
            }
            for piece in pieces(&bytes, &mut s.cut) {
                out.push((at, hop(piece)));
            }
        }
        for (at, hop) in out {
            wire.send(at, i, hop);
        }
        s.near.count();
        s.far.count();
        peak_lent = peak_lent.max(budget.lent());
        peak_near_held = peak_near_held.max(near_totals.snapshot().held_bytes);
        assert!(events < 50_000_000, "the simulation does not end");
    }

    let (near, far) = (near_totals.snapshot(), far_totals.snapshot());
    eprintln!(
        "{events} events; peak leased {peak_lent} of {BUDGET}, peak held at near \
         {peak_near_held}; refused {}; near {near:?}; far {far:?}",
        budget.refused()
    );
    for (i, s) in sessions.iter().enumerate() {
        assert!(s.client.finished_at.is_some(), "session {i} did not finish");
        assert!(s.client.data == file, "session {i} read the file as it is");
        assert!(
            s.client.violations.is_empty(),
            "{i}: {:?}",
            s.client.violations
        );
        assert!(
            s.server.violations.is_empty(),
            "{i}: {:?}",
            s.server.violations
        );
        assert!(s.server.holes().is_empty(), "{i}: ids never used");
    }
    assert!(
        peak_lent <= BUDGET / 2,
        "read-ahead takes at most half the budget"
    );
    assert!(
        peak_near_held <= (BUDGET / 2) as u64 + SESSIONS as u64 * PER_SESSION,
        "near holds what far leased, and a frame or two per session"
    );
    assert!(budget.refused() > 0, "the budget ran out");
    assert!(
        near.answered_locally > SESSIONS as u64,
        "sessions read ahead: {near:?}"
    );
    assert!(
        near.answered_locally < (SESSIONS * FILE_BYTES / READ_BYTES as usize) as u64,
        "not every session could: {near:?}"
    );
    assert_eq!(budget.lent(), 0, "finished sessions hold no lease");
    assert!(
        near.held_bytes <= SESSIONS as u64 * IDLE && far.held_bytes <= SESSIONS as u64 * IDLE,
        "an idle session keeps little: {} and {} bytes per session",
        near.held_bytes / SESSIONS as u64,
        far.held_bytes / SESSIONS as u64
    );
    drop(sessions);
    assert_eq!(budget.lent(), 0);
    assert_eq!(
        near_totals.snapshot().held_bytes,
        0,
        "the engines gave back all they held"
    );
    assert_eq!(far_totals.snapshot().held_bytes, 0);
}
