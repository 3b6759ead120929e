//! The engine in simulation: a client that keeps one READ outstanding, near, a WAN of
//! `rtt`, far, and a strict server that refuses any MessageId outside its credit window or
//! used twice (as Samba does, which drops the connection). The halves run as the gateways
//! run them, each in a [`Splice`] fed byte streams cut at pseudo-random places. Virtual
//! time, no I/O. Every file read is compared with the server's.

use super::{Far, Near, Record, Splice};
use crate::sim::*;
use crate::wire::framing::Frames;
use crate::wire::header::{Command, HEADER_LEN, Header, Messages, TreeOrAsync, flags, status};
use crate::wire::messages::{
    CloseRequest, FileId, QueryInfoRequest, ReadRequest, ReadResponse, lease,
};
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Bytes on their way, as the gateways' relays would carry them.
#[derive(Debug)]
enum Hop {
    ToNear(Vec<u8>),
    NearToFar(Vec<u8>),
    FarToNear(Vec<u8>),
    ToServer(Vec<u8>),
    ToFarFromServer(Vec<u8>),
    ToClient(Vec<u8>),
}

struct Run {
    /// When the client had the whole file, in ms.
    finished_ms: u64,
    data: Vec<u8>,
    file: Vec<u8>,
    server_violations: Vec<String>,
    client_violations: Vec<String>,
    far: super::EngineStats,
    near: super::EngineStats,
    /// Far still judged the session unsigned at the end.
    far_acts: bool,
}

/// Reads a file of `len` bytes in READs of `read_len` across a WAN of `rtt_ms`, with far's
/// window `window` (0: no read-ahead).
fn run(
    len: usize,
    read_len: u32,
    rtt_ms: u64,
    window: u64,
    tweak: impl FnOnce(&mut Client, &mut Server),
) -> Run {
    run_valid(len, read_len, rtt_ms, window, 0, tweak)
}

/// [`run`], far reading ahead files others may write with a validity window of
/// `validity_ms` (0: it does not).
fn run_valid(
    len: usize,
    read_len: u32,
    rtt_ms: u64,
    window: u64,
    validity_ms: u32,
    tweak: impl FnOnce(&mut Client, &mut Server),
) -> Run {
    run_on(len, read_len, rtt_ms, 0, window, validity_ms, tweak)
}

/// [`run_valid`] across a WAN that carries `rate` bytes a second each way (0: any
/// number at once): what the gateways send to each other waits its turn there.
fn run_on(
    len: usize,
    read_len: u32,
    rtt_ms: u64,
    rate: u64,
    window: u64,
    validity_ms: u32,
    tweak: impl FnOnce(&mut Client, &mut Server),
) -> Run {
    let (mut client, mut server) = parties(len, read_len);
    tweak(&mut client, &mut server);
    // What the client should read: each file's bytes, one after another (a directory has
    // none to read).
    let file: Vec<u8> = (0..client.files)
        .filter(|&k| !server.is_directory(k))
        .flat_map(|k| {
            let size = server.sizes.get(k % server.sizes.len().max(1));
            &server.file[..size.copied().unwrap_or(server.file.len())]
        })
        .copied()
        .collect();
    // The two halves as the gateways run them: byte streams both ways, cut anywhere.
    let (mut near, mut far) = (Splice::near(), Splice::far(window));
    far.set_validity(validity_ms);
    #[allow(clippy::disallowed_methods)] // one real instant; virtual time from there
    let epoch = std::time::Instant::now();
    let (mut to_client, mut to_server) = (Frames::new(), Frames::new());
    let mut cut = window ^ u64::from(read_len);
    // Events by time (µs), in order of scheduling within a time.
    let mut queue: BinaryHeap<std::cmp::Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut hops: HashMap<u64, Hop> = HashMap::new();
    let mut seq = 0u64;
    let one_way = rtt_ms * 1000 / 2;
    // When the WAN is free again each way (µs): near to far, far to near.
    let (mut to_far_free, mut to_near_free) = (0u64, 0u64);
    let mut schedule =
        |queue: &mut BinaryHeap<_>, hops: &mut HashMap<u64, Hop>, at: u64, hop: Hop| {
            seq += 1;
            hops.insert(seq, hop);
            queue.push(std::cmp::Reverse((at, seq)));
        };
    let first = framed(&client.start());
    schedule(&mut queue, &mut hops, 0, Hop::ToNear(first));
    let mut pending_out: VecDeque<(u64, Hop)> = VecDeque::new();
    while let Some(std::cmp::Reverse((now, id))) = queue.pop() {
        let hop = hops.remove(&id).unwrap();
        near.set_now(epoch + std::time::Duration::from_micros(now));
        far.set_now(epoch + std::time::Duration::from_micros(now));
        match hop {
            Hop::ToNear(bytes) => near.from_end(&bytes).unwrap(),
            Hop::FarToNear(bytes) => near.from_peer(&bytes).unwrap(),
            Hop::NearToFar(bytes) => far.from_peer(&bytes).unwrap(),
            Hop::ToFarFromServer(bytes) => far.from_end(&bytes).unwrap(),
            Hop::ToServer(bytes) => {
                let mut frames = Vec::new();
                to_server
                    .feed(&bytes, |k| k == 0, |_, f| frames.push(f))
                    .unwrap();
                for frame in frames {
                    for answer in server.answer(&frame) {
                        pending_out.push_back((now, Hop::ToFarFromServer(framed(&answer))));
                    }
                }
            }
            Hop::ToClient(bytes) => {
                let mut frames = Vec::new();
                to_client
                    .feed(&bytes, |k| k == 0, |_, f| frames.push(f))
                    .unwrap();
                for frame in frames {
                    // An answer carries the id of the request it answers: the one waiting.
                    let id = Messages::new(&frame).next().map(|(h, _)| h.message_id);
                    let pipelined = client.depth > 1 && client.step == Step::Read;
                    if !pipelined && id != Some(client.last_id) {
                        client
                            .violations
                            .push(format!("answer {id:?} while waiting on {}", client.last_id));
                    }
                    for next in client.answered_all(&frame, now) {
                        let at = now + client.wait_us();
                        pending_out.push_back((at, Hop::ToNear(framed(&next))));
                    }
                }
            }
        }
        // `wan`: when the WAN that way is free, if the bytes cross it.
        let mut out =
            |splice: &mut Splice, end: bool, hop: fn(Vec<u8>) -> Hop, mut wan: Option<&mut u64>| {
                let bytes = if end {
                    splice.to_end()
                } else {
                    splice.to_peer()
                }
                .to_vec();
                if end {
                    splice.end_written(bytes.len());
                } else {
                    splice.peer_written(bytes.len());
                }
                for piece in pieces(&bytes, &mut cut) {
                    let at = match wan.as_deref_mut() {
                        None => now,
                        Some(_) if rate == 0 => now + one_way,
                        Some(free) => {
                            *free = (*free).max(now) + piece.len() as u64 * 1_000_000 / rate;
                            *free + one_way
                        }
                    };
                    pending_out.push_back((at, hop(piece)));
                }
            };
        out(&mut near, true, Hop::ToClient, None);
        out(&mut near, false, Hop::NearToFar, Some(&mut to_far_free));
        out(&mut far, false, Hop::FarToNear, Some(&mut to_near_free));
        out(&mut far, true, Hop::ToServer, None);
        while let Some((at, hop)) = pending_out.pop_front() {
            schedule(&mut queue, &mut hops, at, hop);
        }
        assert!(
            hops.len() < 1_000_000 && now < 3_600_000_000,
            "the simulation does not end"
        );
    }
    let holes = server.holes();
    if !holes.is_empty() {
        server.violations.push(format!("ids never used: {holes:?}"));
    }
    Run {
        finished_ms: client.finished_at.unwrap_or(u64::MAX) / 1000,
        data: client.data,
        file,
        server_violations: server.violations,
        client_violations: client.violations,
        far: far.stats(),
        near: near.stats(),
        far_acts: far.may_act(),
    }
}

/// Neither the server nor the client saw the protocol broken.
fn no_violations(run: &Run) {
    assert!(
        run.server_violations.is_empty(),
        "server: {:?}",
        run.server_violations
    );
    assert!(
        run.client_violations.is_empty(),
        "client: {:?}",
        run.client_violations
    );
}

fn check(run: &Run) {
    eprintln!(
        "finished at {} ms; far {:?}; near {:?}",
        run.finished_ms, run.far, run.near
    );
    no_violations(run);
    assert!(
        run.data == run.file,
        "the client read the file as the server has it"
    );
    assert!(
        run.far_acts,
        "far's observer read every frame as it was: the session stays unsigned"
    );
}

#[test]
fn a_client_with_one_read_outstanding_reads_at_the_window_not_the_round_trip() {
    // 4 MiB in 64 KiB READs across 100 ms: 64 round trips without read-ahead.
    let plain = run(4 << 20, 64 << 10, 100, 0, |_, _| {});
    check(&plain);
    assert_eq!(plain.far.prefetched, 0);
    assert!(plain.finished_ms >= 64 * 100, "{} ms", plain.finished_ms);
    let ahead = run(4 << 20, 64 << 10, 100, 8 << 20, |_, _| {});
    check(&ahead);
    // 63 READs and the CLOSE.
    assert_eq!(ahead.near.answered_locally, 64, "{:?}", ahead.near);
    assert_eq!(ahead.far.missed, 0);
    // The setup's four round trips, the first READ's, and the window's worth of credit
    // round trips: the client holds 64 credits, so far can be 63 READs ahead.
    assert!(ahead.finished_ms <= 7 * 100, "{} ms", ahead.finished_ms);
}

/// The server answers every READ with an interim answer (the credits) and then the data.
/// The client never sees the interim of a prediction: the answer near gives it must carry
/// those credits, or a client holding few would run out.
#[test]
fn asynchronous_answers_reach_the_client_whole_with_their_credits() {
    let ahead = run(1 << 20, 64 << 10, 100, 8 << 20, |c, s| {
        s.async_reads = true;
        c.setup_credits = 4;
    });
    check(&ahead);
    assert!(ahead.near.answered_locally >= 10, "{:?}", ahead.near);
}

#[test]
fn a_request_that_takes_a_predicted_id_is_given_a_fresh_one_and_read_ahead_stops() {
    let run = run(2 << 20, 64 << 10, 100, 8 << 20, |c, _| {
        c.echo_after = Some(3)
    });
    check(&run);
    assert!(run.far.missed > 0, "{:?}", run.far);
    assert!(run.far.remapped > 0, "{:?}", run.far);
}

/// A client that asks for just the file's rest in its last READ gets it from the
/// prediction, cut to that length, without a miss.
#[test]
fn a_shorter_last_read_is_answered_from_the_prediction_cut_to_its_length() {
    let len = (1 << 20) + 12_345;
    let run = run(len, 64 << 10, 100, 8 << 20, |c, _| c.trim_last = true);
    check(&run);
    assert_eq!(run.far.missed, 0, "{:?}", run.far);
    // 17 READs, the first sent by the client itself, and the CLOSE.
    assert_eq!(run.near.answered_locally, 17, "{:?}", run.near);
}

#[test]
fn a_write_ends_read_ahead_and_the_rest_is_read_from_the_server() {
    let run = run(2 << 20, 64 << 10, 100, 8 << 20, |c, _| {
        c.write_after = Some(2)
    });
    check(&run);
    assert!(run.near.answered_locally < 31, "{:?}", run.near);
}

/// Small files one after another, as a file client reads them (CREATE, QUERY_INFO, READ,
/// CLOSE): far learns what the client does after the first CREATE and plays it for every
/// later one, so each later file takes one round trip (its CREATE) instead of four.
#[test]
fn small_files_take_one_round_trip_each_once_far_has_learnt_the_client() {
    let files = |window| {
        run(64 << 10, 64 << 10, 100, window, |c, _| {
            c.files = 20;
            c.queries = vec![FILE_ALL_INFORMATION];
        })
    };
    let plain = files(0);
    check(&plain);
    assert_eq!(plain.near.answered_locally, 0, "{:?}", plain.near);
    // The setup's three round trips, then four per file (CREATE, QUERY_INFO, READ, CLOSE).
    assert!(
        plain.finished_ms >= (3 + 20 * 4) * 100,
        "{} ms",
        plain.finished_ms
    );
    let ahead = files(8 << 20);
    check(&ahead);
    // Each file after the first: its QUERY_INFO, its READ and its CLOSE.
    one_round_trip_a_file_after_the_first(&ahead, 19 * 3, 19 * 2);
    // A first file that is empty (opened, queried, closed) teaches no READ: the next file,
    // opened ahead with the query alone, teaches it.
    let run = run(5000, 64 << 10, 100, 8 << 20, |c, s| {
        c.files = 10;
        c.queries = vec![FILE_ALL_INFORMATION];
        s.sizes = vec![0, 5000];
    });
    check(&run);
    // Nine queries, the READs of the four files with data after the second, nine CLOSEs.
    assert_eq!(run.near.answered_locally, 9 + 4 + 9, "{:?}", run.near);
    assert_eq!(run.far.missed, 0, "{:?}", run.far);
}

/// Files of two READs each: far plays what the client read of the last file, both blocks,
/// with each CREATE's answer, so that every file after the first takes one round trip.
#[test]
fn files_of_several_reads_are_opened_ahead_as_far_as_the_client_read_the_last() {
    let ahead = run(128 << 10, 64 << 10, 100, 8 << 20, |c, _| {
        c.files = 20;
        c.queries = vec![FILE_ALL_INFORMATION];
    });
    check(&ahead);
    // The first file's second READ (read ahead) and CLOSE; each file after it: its
    // QUERY_INFO, both READs and its CLOSE.
    one_round_trip_a_file_after_the_first(&ahead, 2 + 19 * 4, 1 + 19 * 3);
}

/// A run of 20 files at 100 ms had `answered` requests answered at near and `prefetched`
/// predictions, none missed, and took the setup's three round trips, the first file's
/// four, then one per file.
fn one_round_trip_a_file_after_the_first(run: &Run, answered: u64, prefetched: u64) {
    assert_eq!(run.near.answered_locally, answered, "{:?}", run.near);
    assert_eq!(
        (run.far.missed, run.far.prefetched),
        (0, prefetched),
        "{:?}",
        run.far
    );
    assert!(
        run.finished_ms <= (3 + 4 + 19) * 100 + 50,
        "{} ms",
        run.finished_ms
    );
}

/// A client that reads the first file whole and only the first block of each later one:
/// the second file's played READ beyond its first is a miss (its id goes to the CLOSE),
/// one block wasted, and far learns the new habit from the third file.
#[test]
fn a_client_that_reads_less_of_the_next_file_costs_one_miss() {
    let block = 64 << 10;
    let run = run(128 << 10, block, 100, 8 << 20, |c, _| {
        c.files = 20;
        c.queries = vec![FILE_ALL_INFORMATION];
        c.read_limit = Some((2, u64::from(block)));
    });
    no_violations(&run);
    let (whole, start) = (&run.file[..128 << 10], &run.file[..block as usize]);
    let mut expected = whole.to_vec();
    for _ in 1..20 {
        expected.extend_from_slice(start);
    }
    assert!(run.data == expected, "every byte read as the server has it");
    assert!(run.far_acts);
    assert_eq!(
        (run.far.missed, run.far.missed_bytes),
        (1, u64::from(block)),
        "{:?}",
        run.far
    );
    // Files 4 to 20 (the third teaches after the miss): one round trip each.
    assert!(
        run.finished_ms <= (3 + 4 + 3 + 4 + 17) * 100 + 50,
        "{} ms",
        run.finished_ms
    );
}

/// Files of sizes that are not a multiple of the client's READ, read by a client that
/// asks only for each file's rest at its end, and one that queries only the first files:
/// every byte right, ids and credits right, and the change of habit costs one miss.
#[test]
fn open_ahead_follows_each_file_and_a_change_of_habit() {
    let run = run(3 << 20, 1 << 20, 100, 8 << 20, |c, s| {
        c.files = 12;
        c.trim_last = true;
        c.queries = vec![FILE_ALL_INFORMATION];
        c.query_files = 5;
        s.sizes = vec![100, 1 << 20, (1 << 20) + 1, 2_500_000, 0, 65_536];
    });
    check(&run);
    assert!(run.far.missed >= 1, "{:?}", run.far);
    // After the miss far reads the next file on only once the client has asked for its
    // second block itself: one READ more reaches the server.
    assert!(run.near.answered_locally >= 19, "{:?}", run.near);
}

use proptest::prelude::Strategy as _;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Any mix of READs (sequential runs, jumps, lengths that change, multi-credit ones,
    /// past the end), ECHOs and WRITEs that change the file, one at a time, with
    /// read-ahead on, and answers synchronous or not: the server sees no id twice and none
    /// outside its window, the client never runs out of credits, and every READ gets
    /// exactly the file's bytes as last written (or END_OF_FILE past it): never stale.
    #[test]
    fn any_client_behaviour_keeps_ids_credits_and_data_right(
        ops in proptest::collection::vec(
            proptest::prop_oneof![
                6 => proptest::prelude::Just(None),
                2 => (0u64..300_000, 1u32..70_000).prop_map(|(o, l)| Some(Op::Read { offset: o, len: l })),
                1 => proptest::prelude::Just(Some(Op::Echo)),
                1 => (0u64..300_000, proptest::sample::select(vec![64u32, 40_000, 100_000]))
                    .prop_map(|(offset, len)| Some(Op::Write { offset, len })),
            ],
            1..60,
        ),
        read_len in proptest::sample::select(vec![4096u32, 65536, 131_072]),
        async_reads in proptest::bool::ANY,
        setup_credits in 2u16..100,
        window in proptest::sample::select(vec![0u64, 65536, 131_072, 196_608, 1 << 20]),
        (shared, validity_ms, think_ms) in (
            proptest::bool::ANY,
            proptest::sample::select(vec![0u32, 20, 1000]),
            proptest::sample::select(vec![0u64, 10, 30]),
        ),
    ) {
        // None continues the current run: the next block after the last READ.
        let len = 256 << 10;
        let run = run_valid(len, read_len, 40, window, validity_ms, |c, s| {
            s.async_reads = async_reads;
            c.setup_credits = setup_credits;
            c.share_access = if shared { 3 } else { 1 };
            c.think_us = think_ms * 1000;
            let mut at = 0u64;
            let mut script = VecDeque::new();
            for op in &ops {
                let op = match op {
                    None => Op::Read { offset: at, len: read_len },
                    Some(op) => *op,
                };
                if let Op::Read { offset, len } = op {
                    at = offset + u64::from(len);
                }
                script.push_back(op);
            }
            c.script = Some((script, s.file.clone()));
        });
        proptest::prop_assert!(run.server_violations.is_empty(), "server: {:?}", run.server_violations);
        proptest::prop_assert!(run.client_violations.is_empty(), "client: {:?}", run.client_violations);
        proptest::prop_assert!(run.finished_ms < u64::MAX / 1000, "the client finished");
        proptest::prop_assert!(run.far_acts, "far's observer kept in step: still unsigned");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Files of any sizes one after another, read in blocks of any length by a client that
    /// clips its last READ or not, queries each file or only the first ones, with any
    /// credit window, synchronous or async answers and any read-ahead window: every byte
    /// of every file right, no id twice or outside the server's window, no request on a
    /// file that is not open, and the client never short of credits.
    #[test]
    fn any_run_of_files_reads_every_byte_right(
        sizes in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::prelude::Just(0usize),
                1usize..70_000,
                60_000usize..300_000,
            ],
            1..6,
        ),
        files in 1usize..8,
        read_len in proptest::sample::select(vec![4096u32, 65536, 100_000, 131_072]),
        trim_last in proptest::bool::ANY,
        query in proptest::bool::ANY,
        query_files in 0usize..8,
        async_reads in proptest::bool::ANY,
        setup_credits in 2u16..100,
        window in proptest::sample::select(vec![0u64, 65536, 196_608, 1 << 20]),
        (shared, validity_ms, think_ms) in (
            proptest::bool::ANY,
            proptest::sample::select(vec![0u32, 20, 1000]),
            proptest::sample::select(vec![0u64, 10, 30]),
        ),
    ) {
        let run = run_valid(300_000, read_len, 40, window, validity_ms, |c, s| {
            s.sizes = sizes.clone();
            s.async_reads = async_reads;
            c.share_access = if shared { 3 } else { 1 };
            c.think_us = think_ms * 1000;
            c.files = files;
            c.trim_last = trim_last;
            c.setup_credits = setup_credits;
            if query {
                c.queries = vec![FILE_ALL_INFORMATION];
                c.query_files = query_files;
            }
        });
        proptest::prop_assert!(run.server_violations.is_empty(), "server: {:?}", run.server_violations);
        proptest::prop_assert!(run.client_violations.is_empty(), "client: {:?}", run.client_violations);
        proptest::prop_assert!(run.data == run.file, "the client read every file as the server has it");
    }
}

/// Frames far cannot read (an encrypted message, SMB1, bytes that are not SMB2) pass
/// through both halves unchanged, both ways: the engine relays what it does not act on.
#[test]
fn frames_the_engine_cannot_read_pass_through_unchanged() {
    let (mut near, mut far) = (Near::new(), Far::new(1 << 20));
    let frames: [&[u8]; 3] = [b"\xfdSMB encrypted", b"\xffSMBr", b"not smb at all"];
    for frame in frames {
        far.from_server(frame.to_vec());
        let Some(Record::Smb(relayed)) = far.poll_to_near() else {
            panic!("far kept {frame:?}");
        };
        near.from_far(Record::Smb(relayed));
        assert_eq!(near.poll_to_client().as_deref(), Some(frame));
        near.from_client(frame.to_vec());
        let Some(Record::Smb(relayed)) = near.poll_to_far() else {
            panic!("near kept {frame:?}");
        };
        far.from_near(Record::Smb(relayed));
        assert_eq!(far.poll_to_server().as_deref(), Some(frame));
    }
}

/// Hands what far has for the server to the server, and the server's answers back to far.
fn serve(far: &mut Splice, server: &mut Server, to_server: &mut Frames) {
    let bytes = far.to_end().to_vec();
    far.end_written(bytes.len());
    let mut frames = Vec::new();
    to_server
        .feed(&bytes, |k| k == 0, |_, f| frames.push(f))
        .unwrap();
    for frame in frames {
        for answer in server.answer(&frame) {
            far.from_end(&framed(&answer)).unwrap();
        }
    }
}

/// Runs a session through far alone (near's part played by hand: far's SMB records go
/// straight to the client) until `stop` holds; far's records so far are returned.
fn drive_far(far: &mut Splice, stop: impl Fn(&[Record]) -> bool) -> (Client, Server, Vec<Record>) {
    let (mut client, mut server) = parties(1 << 20, 64 << 10);
    let (mut to_server, mut to_near) = (Frames::new(), Frames::new());
    let mut records = Vec::new();
    far.from_peer(&framed(&client.start())).unwrap();
    for _ in 0..100 {
        if stop(&records) {
            return (client, server, records);
        }
        serve(far, &mut server, &mut to_server);
        let bytes = far.to_peer().to_vec();
        far.peer_written(bytes.len());
        let mut got = Vec::new();
        to_near
            .feed(
                &bytes,
                |_| true,
                |k, p| got.push(Record::parse(k, &p).unwrap()),
            )
            .unwrap();
        for record in got {
            if let Record::Smb(frame) = &record
                && let Some(next) = client.answered(frame, 0)
            {
                far.from_peer(&framed(&next)).unwrap();
            }
            records.push(record);
        }
    }
    panic!("the session never reached the point: {records:?}");
}

/// A session that is not SMB2 at all (an HTTP server on port 445, say) crosses both halves
/// byte for byte, both ways, each direction turned opaque by its first byte.
#[test]
fn bytes_that_are_not_smb_cross_both_halves_as_they_came() {
    let (mut near, mut far) = (Splice::near(), Splice::far(1 << 20));
    let request = b"GET / HTTP/1.1\r\nHost: files\r\n\r\n".repeat(100);
    let reply = b"\x85\x00\x00\x00HTTP/1.1 200 OK\r\n\r\nhello".repeat(100);
    let mut seed = 7;
    // One end's bytes through its half, the stream, and the other half to its end.
    let cross = |from: &mut Splice, to: &mut Splice, piece: &[u8], out: &mut Vec<u8>| {
        from.from_end(piece).unwrap();
        let wire = from.to_peer().to_vec();
        from.peer_written(wire.len());
        to.from_peer(&wire).unwrap();
        out.extend_from_slice(to.to_end());
        to.end_written(to.to_end().len());
    };
    let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
    for piece in pieces(&request, &mut seed) {
        cross(&mut near, &mut far, &piece, &mut at_server);
    }
    for piece in pieces(&reply, &mut seed) {
        cross(&mut far, &mut near, &piece, &mut at_client);
    }
    assert!(at_server == request, "the server got the client's bytes");
    assert!(at_client == reply, "the client got the server's bytes");
}

/// A server that stops speaking SMB2 before read-ahead began: its bytes go on as they came,
/// and far lets the client's frames through untouched from then on. After read-ahead began
/// (a prediction's id is spent at the server), the same fails the session instead.
#[test]
fn an_end_may_stop_framing_only_while_far_translates_nothing() {
    let mut far = Splice::far(1 << 20);
    let (mut client, _, _) = drive_far(&mut far, |records| {
        records
            .iter()
            .any(|r| matches!(r, Record::Smb(f) if Messages::new(f).any(|(h, _)| h.command == Command::NEGOTIATE)))
    });
    far.from_end(b"\x85\x00\x00\x00keepalive").unwrap();
    let wire = far.to_peer().to_vec();
    assert!(
        wire.ends_with(b"\x04\x00\x00\x00\x85\x00\x00\x00keepalive"),
        "{wire:?}"
    );
    let mut later = framed(&client.request(Command::ECHO, 1, &[4, 0, 0, 0]));
    later.extend(framed(&client.request(Command::ECHO, 1, &[4, 0, 0, 0])));
    far.end_written(far.to_end().len());
    far.from_peer(&later).unwrap();
    assert_eq!(far.to_end(), &later[..], "client frames pass as they came");

    let mut far = Splice::far(1 << 20);
    drive_far(&mut far, |records| {
        records.iter().any(|r| matches!(r, Record::Announce { .. }))
    });
    assert_eq!(
        far.from_end(b"\x85\x00\x00\x00"),
        Err(super::SpliceError::Unframed("server"))
    );
    let mut far = Splice::far(1 << 20);
    drive_far(&mut far, |records| {
        records.iter().any(|r| matches!(r, Record::Announce { .. }))
    });
    assert_eq!(
        far.from_peer(&[super::link::OPAQUE, 0, 0, 0, b'x']),
        Err(super::SpliceError::Unframed("client"))
    );
}

/// A record far cannot have sent fails the session; a stream cut inside an SMB frame hands
/// the piece on as it came.
#[test]
fn a_bad_record_fails_and_a_cut_frame_goes_on_as_it_came() {
    let mut near = Splice::near();
    assert_eq!(
        near.from_peer(&[0x07, 0, 0, 0]),
        Err(super::SpliceError::Record(super::RecordError::Type(0x07)))
    );
    let mut near = Splice::near();
    assert_eq!(
        near.from_peer(&[0x01, 0, 0, 2, 0, 0]),
        Err(super::SpliceError::Record(super::RecordError::Truncated(
            0x01
        )))
    );
    let mut near = Splice::near();
    near.from_end(&[0, 0, 0, 9, 0xfe, b'S']).unwrap();
    assert!(near.to_peer().is_empty());
    near.end_finished();
    assert_eq!(near.to_peer(), &[0, 0, 0, 9, 0xfe, b'S']);
    near.from_peer(&[0, 0, 1]).unwrap();
    near.peer_finished().unwrap();
    assert_eq!(near.to_end(), &[0, 0, 1]);
    // An engine record cut by the stream's end is an error, not bytes for the client.
    let mut near = Splice::near();
    near.from_peer(&[0x02, 0, 0, 40, 1, 2]).unwrap();
    assert_eq!(near.peer_finished(), Err(super::SpliceError::CutRecord));
    assert!(near.to_end().is_empty());
}

/// A READ shorter than its prediction gets the server's answer cut to its length (what
/// the server gives it); a longer one is not the prediction's to answer and goes on to far.
#[test]
fn a_read_shorter_than_its_prediction_gets_the_answer_cut_to_its_length() {
    let read = |length| read_at(4096, length);
    let request = |length| read_message(&header(Command::READ, 9, 1, 1), &read(length));
    let h = header(Command::READ, 9, 1, 1);
    let mut body = vec![0; ReadResponse::LEN];
    ReadResponse {
        data_offset: 0x50,
        data_length: 65536,
        data_remaining: 0,
        flags: 0,
    }
    .emit(&mut body)
    .unwrap();
    body.extend((0..65536u32).map(|i| (i * 7) as u8));
    let answer = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..h
        },
        &body,
    );
    for (asked, answered_here) in [(100, true), (65536, true), (65537, false)] {
        let mut near = Near::new();
        near.from_far(Record::Announce {
            message_id: 9,
            key: super::Key::Read(super::ReadKey::of(&h, &read(65536))),
            valid_ms: 0,
        });
        near.from_far(Record::Prefetched {
            message_id: 9,
            at: super::link::NO_CLOCK,
            answer: answer.clone(),
        });
        near.from_client(request(asked));
        if !answered_here {
            assert!(near.poll_to_client().is_none());
            assert_eq!(near.poll_to_far(), Some(Record::Smb(request(asked))));
            continue;
        }
        let got = near.poll_to_client().unwrap();
        let r = ReadResponse::parse(&got[HEADER_LEN..]).unwrap();
        assert_eq!(r.data_length, asked);
        assert_eq!(got.len(), 0x50 + asked as usize);
        assert_eq!(got[..HEADER_LEN], answer[..HEADER_LEN]);
        assert_eq!(got[0x50..], answer[0x50..0x50 + asked as usize]);
        assert_eq!(near.poll_to_far(), Some(Record::Consumed { message_id: 9 }));
    }
}

/// An answer announced with a validity window is given only within it of its arrival at
/// near, and never if near has no clock; past it, far is told (DROPPED) before the
/// client's request goes on. An answer the client asked for before it came goes at once.
#[test]
fn near_gives_an_answer_held_with_a_validity_window_only_within_it() {
    let h = header(Command::READ, 9, 1, 1);
    let read = read_at(0, 65536);
    let request = read_message(&h, &read);
    let answer = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..h
        },
        &[17, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    #[allow(clippy::disallowed_methods)] // one real instant; virtual time from there
    let t0 = std::time::Instant::now();
    let ms = std::time::Duration::from_millis;
    let announce = |valid_ms| Record::Announce {
        message_id: 9,
        key: super::Key::Read(super::ReadKey::of(&h, &read)),
        valid_ms,
    };
    let prefetched = |at| Record::Prefetched {
        message_id: 9,
        at,
        answer: answer.clone(),
    };
    // (clock when the answer came, when the client asked; answered here?)
    for (came, asked, here) in [
        (Some(t0), t0 + ms(49), true),
        (Some(t0), t0 + ms(50), false),
        (None, t0, false),
    ] {
        let mut near = Near::new();
        near.from_far(announce(50));
        if let Some(came) = came {
            near.set_now(came);
        }
        near.from_far(prefetched(super::link::NO_CLOCK));
        near.set_now(asked);
        near.from_client(request.clone());
        if here {
            assert_eq!(near.poll_to_client(), Some(answer.clone()));
            assert_eq!(near.poll_to_far(), Some(Record::Consumed { message_id: 9 }));
        } else {
            assert_eq!(near.poll_to_client(), None);
            assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 9 }));
            assert_eq!(near.poll_to_far(), Some(Record::Smb(request.clone())));
            assert!(near.stats().expired == 1);
        }
        assert_eq!(near.held_bytes(), 0);
    }
    // Asked first: the answer goes when it comes, however late.
    let mut near = Near::new();
    near.set_now(t0);
    near.from_far(announce(50));
    near.from_client(request.clone());
    near.set_now(t0 + ms(500));
    near.from_far(prefetched(super::link::NO_CLOCK));
    assert_eq!(near.poll_to_client(), Some(answer.clone()));

    // The time an answer queued on its way counts: far stamps each answer with its clock;
    // the first crossed in 20 ms by near's (no queue), the second left far at 100 and came
    // at 150 (30 ms queued), so it has 20 ms of its 50 left.
    let mut near = Near::new();
    near.set_now(t0);
    near.from_far(Record::Announce {
        message_id: 8,
        key: super::Key::Read(super::ReadKey::of(&h, &read_at(65536, 65536))),
        valid_ms: 0,
    });
    near.set_now(t0 + ms(20));
    near.from_far(Record::Prefetched {
        message_id: 8,
        at: 0,
        answer: answer.clone(),
    });
    near.from_far(announce(50));
    near.set_now(t0 + ms(150));
    near.from_far(prefetched(100));
    assert_eq!(near.next_expiry(), Some(t0 + ms(170)));
    near.set_now(t0 + ms(169));
    assert_eq!(near.held_bytes(), 2 * answer.len());
    // Nobody asks: at its end near drops it, tells far and gives its memory back.
    near.set_now(t0 + ms(170));
    assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 9 }));
    assert_eq!(near.held_bytes(), answer.len());
    assert_eq!(near.next_expiry(), None);
}

/// A request that waits at near for its answer gets it only if the answer did not queue
/// past its window on the way; if it did, the request goes to the server after all, far
/// told first. Predictions the client went past without asking (ids out of order), and
/// announcements of ids it has already used, are dropped with far told too: a request
/// on such an id later must not be taken as the prediction's.
#[test]
fn near_tells_far_of_every_prediction_it_ends_unused() {
    let read = |id| {
        let h = header(Command::READ, id, 1, 1);
        let read = read_at(0, 65536);
        (
            Record::Announce {
                message_id: id,
                key: super::Key::Read(super::ReadKey::of(&h, &read)),
                valid_ms: 50,
            },
            read_message(&h, &read),
        )
    };
    let answer = |id, at| Record::Prefetched {
        message_id: id,
        at,
        answer: message(
            &Header {
                flags: flags::SERVER_TO_REDIR,
                ..header(Command::READ, id, 1, 1)
            },
            &[17, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
    };
    #[allow(clippy::disallowed_methods)] // one real instant; virtual time from there
    let t0 = std::time::Instant::now();
    let ms = std::time::Duration::from_millis;
    let mut near = Near::new();
    near.set_now(t0);
    // The quickest crossing: sent at 0, in at 10.
    let (announce, _) = read(8);
    near.from_far(announce);
    near.set_now(t0 + ms(10));
    near.from_far(answer(8, 0));
    // The client asks 9 before its answer, which left far at 20 and comes at 90: 60 ms
    // queued, past its 50.
    let (announce, request) = read(9);
    near.from_far(announce);
    near.from_client(request.clone());
    assert_eq!(near.poll_to_far(), None, "the request waits for its answer");
    near.set_now(t0 + ms(90));
    // 8, held since 10 and never asked for, ended at 60.
    assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 8 }));
    near.from_far(answer(9, 20));
    assert_eq!(near.poll_to_client(), None);
    assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 9 }));
    assert_eq!(near.poll_to_far(), Some(Record::Smb(request)));
    // 11 announced; the client sends 12 before it: 11 is dropped, far told, and so is an
    // announcement of 10 that comes after.
    let (announce, _) = read(11);
    near.from_far(announce);
    let echo = message(&header(Command::ECHO, 12, 1, 1), &[4, 0, 0, 0]);
    near.from_client(echo.clone());
    assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 11 }));
    assert_eq!(near.poll_to_far(), Some(Record::Smb(echo)));
    let (announce, _) = read(10);
    near.from_far(announce);
    assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 10 }));
    assert_eq!(near.poll_to_far(), None);
}

/// An oplock break, or a lease break (a file's or a directory's: the notification names a
/// lease key, not a file), ends every prediction the client has not asked for, and far is
/// told of each: the client's next READ on such an id must reach the server (far takes it
/// as a miss, not as the prediction's, whose answer near no longer has).
#[test]
fn an_oplock_or_lease_break_drops_the_unasked_predictions_and_far_is_told() {
    // An oplock break notification (StructureSize 24, the FileId's start), and a lease
    // break notification (StructureSize 44: epoch, flags, key, states, reason, hints).
    let mut lease_break = vec![0; 44];
    lease_break[0] = 44;
    lease_break[8..24].fill(0x5A);
    lease_break[24..28]
        .copy_from_slice(&(lease::READ_CACHING | lease::HANDLE_CACHING).to_le_bytes());
    for body in [vec![24, 0, 0, 0, 0, 0, 0, 0], lease_break] {
        let h = header(Command::READ, 9, 1, 1);
        let read = read_at(0, 65536);
        let mut near = Near::new();
        near.from_far(Record::Announce {
            message_id: 9,
            key: super::Key::Read(super::ReadKey::of(&h, &read)),
            valid_ms: 0,
        });
        let brk = message(
            &Header {
                flags: flags::SERVER_TO_REDIR,
                message_id: u64::MAX,
                ..header(Command::OPLOCK_BREAK, 0, 0, 0)
            },
            &body,
        );
        near.from_far(Record::Smb(brk.clone()));
        assert_eq!(near.poll_to_client(), Some(brk));
        assert_eq!(near.poll_to_far(), Some(Record::Dropped { message_id: 9 }));
        near.from_client(read_message(&h, &read));
        assert_eq!(
            near.poll_to_far(),
            Some(Record::Smb(read_message(&h, &read)))
        );
    }
    // Far takes DROPPED as a miss (the simulated slow client below goes through it).
}

/// A file others may write (smbclient opens so, asking no oplock) is read ahead only when
/// far has a validity window. A client that asks within it is answered at near; one
/// slower than the window has its READs go to the server, with fresh ids (the
/// predictions spent theirs), and reads every byte right.
#[test]
fn files_others_may_write_are_read_ahead_only_within_the_validity_window() {
    let none = others_may_write(0, 0, None);
    check(&none);
    assert_eq!(none.far.prefetched, 0, "{:?}", none.far);
    let quick = others_may_write(1000, 0, None);
    check(&quick);
    all_answered_at_near(&quick);
    // A 100 ms window: a READ of 64 KiB ahead (a kibibyte per millisecond of it); the
    // client takes 150 ms to ask.
    let slow = others_may_write(100, 150_000, None);
    check(&slow);
    assert!(slow.near.expired >= 1, "{:?}", slow.near);
    assert!(slow.far.missed >= 1, "{:?}", slow.far);
    assert!(slow.far.remapped >= 14, "{:?}", slow.far);
    // The CLOSE alone.
    assert_eq!(slow.near.answered_locally, 1, "{:?}", slow.near);
}

/// A file others may write, read by the one-READ client across 100 ms and 400 Mbit/s,
/// far with the default window (8 MiB) and validity (1 s): far keeps ahead what the client
/// takes in half the validity at the rate it takes answers (growing at most twofold a
/// quarter of the window), not only the kibibyte per millisecond it starts from (1 MiB a
/// round trip: 3.7 s for 32 MiB). Nothing expires on
/// its way or is missed, there, at 40 Mbit/s, or on a path of 16 Mbit/s, where the floor
/// holds.
#[test]
fn files_others_may_write_are_read_ahead_at_the_rate_the_client_takes_them() {
    let others = |c: &mut Client, _: &mut Server| c.share_access = 3;
    let fast = run_on(32 << 20, 64 << 10, 100, 50_000_000, 8 << 20, 1000, others);
    check(&fast);
    nothing_missed_or_expired(&fast);
    assert!(fast.finished_ms < 2000, "{} ms", fast.finished_ms);
    // 40 Mbit/s: what is ahead follows the rate (2.5 MB), below the window far was given.
    let middle = run_on(16 << 20, 64 << 10, 100, 5_000_000, 8 << 20, 1000, others);
    check(&middle);
    nothing_missed_or_expired(&middle);
    assert!(middle.finished_ms < 4500, "{} ms", middle.finished_ms);
    let slow = run_on(4 << 20, 64 << 10, 100, 2_000_000, 8 << 20, 1000, others);
    check(&slow);
    nothing_missed_or_expired(&slow);
    assert!(slow.near.answered_locally >= 60, "{:?}", slow.near);
}

/// The same reader pausing 1.5 s (longer than the validity window) a fifth of the way
/// through: what far had read ahead expires at near, a miss, and the client's next READs
/// go to the server; from the second of them in a row far reads ahead again (before, the
/// miss stopped the file for good: 400 READs of one round trip each, 40 s).
#[test]
fn read_ahead_resumes_after_a_miss_once_the_client_reads_on() {
    let run = run_on(
        32 << 20,
        64 << 10,
        100,
        50_000_000,
        8 << 20,
        1000,
        |c, _| {
            c.share_access = 3;
            c.pause = Some((100, 1_500_000));
        },
    );
    check(&run);
    assert!(run.near.expired >= 1, "{:?}", run.near);
    assert!(run.far.missed >= 1, "{:?}", run.far);
    assert_eq!(run.far.resumed, 1, "{:?}", run.far);
    assert!(run.near.answered_locally >= 450, "{:?}", run.near);
    assert!(run.finished_ms < 4500, "{} ms", run.finished_ms);
}

/// A client reading at random, each time two blocks in a row, on a protected file: each
/// jump takes a predicted id for another READ (a miss), each pair would resume
/// read-ahead; it resumes at most [`super::far::MAX_RESUMES`] times, and every answer
/// the client gets is the server's.
#[test]
fn read_ahead_resumes_a_bounded_number_of_times() {
    let block = 64u32 << 10;
    let run = run(4 << 20, block, 100, 1 << 20, |c, s| {
        let mut script = VecDeque::new();
        for k in [0u64, 40, 8, 30, 16, 50, 2, 24, 44, 12] {
            for i in 0..2 {
                let offset = (k + i) * u64::from(block);
                script.push_back(Op::Read { offset, len: block });
            }
        }
        c.script = Some((script, s.file.clone()));
    });
    no_violations(&run);
    assert!(run.finished_ms < u64::MAX / 1000, "the client finished");
    assert!(run.far.missed > 3, "{:?}", run.far);
    assert_eq!(
        run.far.resumed,
        u64::from(super::far::MAX_RESUMES),
        "{:?}",
        run.far
    );
}

/// A file others may write, opened with a lease that caches reads (as Windows clients open
/// files), is read ahead as one under an oplock: without a validity window, its answers
/// given at near whenever the client asks. A lease without read caching protects nothing.
#[test]
fn a_lease_that_caches_reads_protects_the_file() {
    let read = others_may_write(0, 0, Some(lease::READ_CACHING | lease::HANDLE_CACHING));
    check(&read);
    all_answered_at_near(&read);
    let handle = others_may_write(0, 0, Some(lease::HANDLE_CACHING));
    check(&handle);
    assert_eq!(handle.far.prefetched, 0, "{:?}", handle.far);
}

/// Files and directories opened in turn (CREATE, QUERY_INFO, READs for a file, CLOSE),
/// shared with writers as clients open them. Under a lease that caches reads (Windows
/// servers grant R or RH on a directory; Samba grants none) far opens each ahead: a file
/// with its QUERY_INFO and READ, a directory with its QUERY_INFO alone, though the READ it
/// learnt from the files would fit in the end of file the directory reports; near answers
/// them and the CLOSEs. A lease that caches only handles protects nothing: each takes its
/// round trips.
#[test]
fn a_directory_lease_that_caches_reads_protects_its_queries_and_nothing_is_read() {
    let opened = |lease| {
        // A directory's end of file is 0 on NTFS, a block on some servers: 4096 here (as
        // each file's), so that only its attributes keep far from reading it.
        run(4096, 64 << 10, 100, 8 << 20, |c, s| {
            c.files = 10;
            c.queries = vec![FILE_ALL_INFORMATION];
            c.share_access = 7;
            s.directories = vec![false, true];
            s.lease = Some(lease);
        })
    };
    let cached = opened(lease::READ_CACHING | lease::HANDLE_CACHING);
    check(&cached);
    // The first file teaches the query and the READ; each later file has its query, READ
    // and CLOSE answered at near, each directory its query and CLOSE.
    assert_eq!(
        cached.near.answered_locally,
        4 * 3 + 5 * 2,
        "{:?}",
        cached.near
    );
    assert_eq!(cached.far.prefetched, 4 * 2 + 5, "{:?}", cached.far);
    nothing_missed_or_expired(&cached);
    // The setup, the first file's four round trips, then one for each open.
    assert!(
        cached.finished_ms <= (3 + 4 + 9) * 100 + 50,
        "{} ms",
        cached.finished_ms
    );
    let handles = opened(lease::HANDLE_CACHING);
    check(&handles);
    assert_eq!(handles.near.answered_locally, 0, "{:?}", handles.near);
    assert_eq!(handles.far.prefetched, 0, "{:?}", handles.far);
    assert!(
        handles.finished_ms >= (3 + 5 * 4 + 5 * 3) * 100,
        "{} ms",
        handles.finished_ms
    );
}

/// A client reading a 1 MiB file others may write (share mode 3, as Samba's smbclient
/// opens) in 64 KiB READs at 100 ms, far with a validity window of `validity_ms`, the
/// client taking `think_us` to ask again, the server granting `lease` (a lease state) or no
/// oplock.
fn others_may_write(validity_ms: u32, think_us: u64, lease: Option<u32>) -> Run {
    run_valid(1 << 20, 64 << 10, 100, 8 << 20, validity_ms, |c, s| {
        c.share_access = 3;
        c.think_us = think_us;
        s.lease = lease;
    })
}

/// [`others_may_write`]'s client had 15 READs and its CLOSE answered at near, nothing
/// missed or expired.
fn all_answered_at_near(run: &Run) {
    assert_eq!(run.near.answered_locally, 16, "{:?}", run.near);
    nothing_missed_or_expired(run);
}

/// Far missed no prediction and near let no answer expire.
fn nothing_missed_or_expired(run: &Run) {
    assert_eq!(
        (run.far.missed, run.near.expired),
        (0, 0),
        "{:?} {:?}",
        run.far,
        run.near
    );
}

/// A window smaller than the path holds: far predicts the next READ just as the client,
/// its predictions used up, asks for it itself; both cross on the WAN. The client's READ
/// is the prediction (the same in every field), so nothing is missed, and nothing waits
/// for an answer that will not come.
#[test]
fn a_read_that_crosses_its_own_prediction_is_not_a_miss() {
    let run = run(4 << 20, 64 << 10, 100, 256 << 10, |_, _| {});
    check(&run);
    assert!(run.finished_ms < u64::MAX / 1000, "the client finished");
    assert_eq!(run.far.missed, 0, "{:?}", run.far);
    assert!(run.near.answered_locally >= 40, "{:?}", run.near);
}

/// A miss while the window is used up: far withdraws the predictions near holds, and a
/// client READ near kept for one of them goes to the server after all; nothing hangs.
#[test]
fn a_miss_withdraws_what_near_holds_and_nothing_waits_forever() {
    for echo_after in [3, 5, 8, 13] {
        let run = run(4 << 20, 64 << 10, 100, 256 << 10, |c, _| {
            c.echo_after = Some(echo_after)
        });
        check(&run);
        assert!(run.finished_ms < u64::MAX / 1000, "the client finished");
        assert!(run.far.missed > 0, "{:?}", run.far);
    }
}

/// Near's side of the races with far, record by record: a READ waiting here for a
/// prediction far then withdraws goes on to far; a READ near passed on that crosses its
/// prediction's announcement is answered once, by whichever answer far sends for it.
#[test]
fn near_resolves_its_races_with_far_once() {
    let read = read_at(0, 4096);
    let h = header(Command::READ, 5, 1, 1);
    let request = read_message(&h, &read);
    let key = super::ReadKey::of(&h, &read);
    let answer = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..h
        },
        &[9, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    let announce = Record::Announce {
        message_id: 5,
        key: super::Key::Read(key),
        valid_ms: 0,
    };
    let prefetched = Record::Prefetched {
        message_id: 5,
        at: super::link::NO_CLOCK,
        answer: answer.clone(),
    };

    // Asked here, then withdrawn: the READ goes to far after all, and its answer through.
    let mut near = Near::new();
    near.from_far(announce.clone());
    near.from_client(request.clone());
    assert_eq!(near.poll_to_far(), None);
    near.from_far(Record::Withdrawn { message_id: 5 });
    assert_eq!(near.poll_to_far(), Some(Record::Smb(request.clone())));
    near.from_far(Record::Smb(answer.clone()));
    assert_eq!(near.poll_to_client(), Some(answer.clone()));
    assert_eq!(near.poll_to_client(), None);

    // Passed on before the announcement came; far answers with the prediction's answer
    // (it had sent it before the READ reached it), or as the server's answer to the READ.
    for far_sends in [prefetched.clone(), Record::Smb(answer.clone())] {
        let mut near = Near::new();
        near.from_client(request.clone());
        assert_eq!(near.poll_to_far(), Some(Record::Smb(request.clone())));
        near.from_far(announce.clone());
        near.from_far(far_sends.clone());
        assert_eq!(near.poll_to_client(), Some(answer.clone()), "{far_sends:?}");
        // Nothing more: a stray record for the id does not answer it twice.
        near.from_far(prefetched.clone());
        near.from_far(Record::Withdrawn { message_id: 5 });
        assert_eq!(near.poll_to_client(), None);
        assert_eq!(near.held_bytes(), 0);
    }

    // Passed on, answered from PREFETCHED, then withdrawn: far had not taken the READ
    // as the prediction's and sends it to the server, whose answer the client has had.
    let mut near = Near::new();
    near.from_client(request.clone());
    near.from_far(announce.clone());
    near.from_far(prefetched.clone());
    assert_eq!(near.poll_to_client(), Some(answer.clone()));
    near.from_far(Record::Withdrawn { message_id: 5 });
    near.from_far(Record::Smb(answer.clone()));
    assert_eq!(near.poll_to_client(), None, "answered once");
}

/// While a large answer streams through near to the client, an answer near gives from a
/// prediction meanwhile waits for the frame's end: the client's stream stays whole frames.
#[test]
fn nothing_cuts_into_a_frame_streaming_through() {
    let read = read_at(0, 4096);
    let h = header(Command::READ, 9, 1, 1);
    let request = read_message(&h, &read);
    let small = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..h
        },
        &[9, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    let big = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..header(Command::READ, 3, 1, 1)
        },
        &vec![0x5a; 40_000],
    );
    let mut records = Vec::new();
    for r in [
        Record::Announce {
            message_id: 9,
            key: super::Key::Read(super::ReadKey::of(&h, &read)),
            valid_ms: 0,
        },
        Record::Prefetched {
            message_id: 9,
            at: super::link::NO_CLOCK,
            answer: small.clone(),
        },
        Record::Smb(big.clone()),
    ] {
        r.emit(&mut records).unwrap();
    }
    let mut near = Splice::near();
    let cut = records.len() - 30_000;
    near.from_peer(&records[..cut]).unwrap();
    near.from_end(&framed(&request)).unwrap();
    near.from_peer(&records[cut..]).unwrap();
    let mut frames = Vec::new();
    Frames::new()
        .feed(near.to_end(), |k| k == 0, |_, f| frames.push(f))
        .unwrap();
    assert_eq!(frames.len(), 2);
    assert!(frames[0] == big, "the streaming answer, whole");
    assert!(frames[1] == small, "then near's own");
}

/// A pipelining client: near holds its READ for prediction k+1 while its ECHO, sent
/// next with id k+2, reaches far and misses. Far withdraws k+1 and near sends the READ on:
/// it must get a server id no request has had, and so must every request after it.
#[test]
fn a_withdrawn_read_sent_on_late_gets_a_fresh_id() {
    let mut far = Splice::far(1 << 20);
    let (client, mut server, _) = drive_far(&mut far, |records| {
        records.iter().any(|r| matches!(r, Record::Announce { .. }))
    });
    let k = client.last_id;
    let mut to_server = Frames::new();
    let mut pass = |far: &mut Splice, server: &mut Server| serve(far, server, &mut to_server);
    pass(&mut far, &mut server);
    let echo = message(&header(Command::ECHO, k + 2, 1, 1), &[4, 0, 0, 0]);
    far.from_peer(&framed(&echo)).unwrap();
    pass(&mut far, &mut server);
    let read = read_message(
        &header(Command::READ, k + 1, 1, 1),
        &read_at(64 << 10, 64 << 10),
    );
    far.from_peer(&framed(&read)).unwrap();
    pass(&mut far, &mut server);
    // The client goes on after both: every request gets an id the server has not seen.
    for id in k + 3..k + 6 {
        let echo = message(&header(Command::ECHO, id, 1, 1), &[4, 0, 0, 0]);
        far.from_peer(&framed(&echo)).unwrap();
        pass(&mut far, &mut server);
    }
    assert!(server.violations.is_empty(), "{:?}", server.violations);
    // A CANCEL for a request already answered names, at the server, another request's
    // id now: it is not sent.
    far.end_written(far.to_end().len());
    let cancel = message(&header(Command::CANCEL, k + 3, 0, 0), &[4, 0, 0, 0]);
    far.from_peer(&framed(&cancel)).unwrap();
    assert!(far.to_end().is_empty(), "{:?}", far.to_end());
    // And its answer reaches near with the client's id.
    let mut answers = Vec::new();
    Frames::new()
        .feed(
            far.to_peer(),
            |_| true,
            |kind, p| {
                if kind == 0 {
                    answers.extend(Messages::new(&p).map(|(h, _)| (h.command, h.message_id)));
                }
            },
        )
        .unwrap();
    assert!(answers.contains(&(Command::ECHO, k + 2)), "{answers:?}");
    assert!(answers.contains(&(Command::READ, k + 1)), "{answers:?}");
}

/// A client with several READs outstanding (as smbclient and Windows keep), with read-ahead
/// windows that the path outruns and ones it does not, and an ECHO among its READs or
/// not: its READs cross predictions on the WAN, near answers some, far claims others, the
/// ECHO misses and far withdraws what near holds. Every id once and inside the server's
/// window, every answer to the READ that asked, every byte at its offset.
#[test]
fn a_pipelining_client_reads_every_byte_right_through_the_races() {
    for depth in [2, 3, 8] {
        for window in [0, 128 << 10, 256 << 10, 1 << 20, 8 << 20] {
            for async_reads in [false, true] {
                for echo_after in [None, Some(5)] {
                    let run = run(2 << 20, 64 << 10, 60, window, |c, s| {
                        c.depth = depth;
                        c.echo_after = echo_after;
                        s.async_reads = async_reads;
                    });
                    assert!(
                        run.finished_ms < u64::MAX / 1000,
                        "depth {depth}, window {window}: the client finished"
                    );
                    eprintln!(
                        "depth {depth} window {window} async {async_reads} echo {echo_after:?}:"
                    );
                    check(&run);
                }
            }
        }
    }
}

/// Near answers a CLOSE itself only once far acts on the session, and only for a file it
/// saw opened (without DELETE access or DELETE_ON_CLOSE) in a session and tree still
/// there, that nothing may have changed, with no request on it outstanding or waiting for
/// its prediction, and no attributes asked; the server's own answer (interim or final) is
/// dropped but for its credits, which the client gets on its next answer (fewer, if the
/// server granted fewer than near did).
#[test]
fn near_answers_a_close_only_when_it_is_safe_and_settles_its_credits() {
    let mut near = Near::new();
    let response = |command: Command, id: u64, credits: u16, body: &[u8]| {
        Record::Smb(message(
            &Header {
                flags: flags::SERVER_TO_REDIR,
                ..header(command, id, 1, credits)
            },
            body,
        ))
    };
    let file = |n: u64| FileId {
        persistent: 1,
        volatile: n,
    };
    // The client opens file `n` with a CREATE of id `id` (access and options as given),
    // and the server answers it.
    let open = |near: &mut Near, n: u64, id: u64, access: u32, options: u32| {
        let mut create = vec![0; 57];
        create[0] = 57;
        create[24..28].copy_from_slice(&access.to_le_bytes());
        create[40..44].copy_from_slice(&options.to_le_bytes());
        near.from_client(message(&header(Command::CREATE, id, 1, 1), &create));
        near.poll_to_far().unwrap();
        let mut body = vec![0; 88];
        body[0] = 89;
        body[64..80].copy_from_slice(&[1u64.to_le_bytes(), n.to_le_bytes()].concat());
        near.from_far(response(Command::CREATE, id, 1, &body));
        near.poll_to_client().unwrap();
    };
    let close = |n: u64, id: u64, flags: u16| {
        let mut body = vec![0; CloseRequest::LEN];
        CloseRequest {
            flags,
            file_id: file(n),
        }
        .emit(&mut body)
        .unwrap();
        message(&header(Command::CLOSE, id, 1, 1), &body)
    };
    let query = |n: u64, id: u64| {
        let mut body = vec![0; QueryInfoRequest::LEN];
        QueryInfoRequest {
            file_id: file(n),
            ..FILE_ALL_INFORMATION
        }
        .emit(&mut body)
        .unwrap();
        message(&header(Command::QUERY_INFO, id, 1, 1), &body)
    };
    let answered_here = |near: &mut Near| {
        let local = near.poll_to_client();
        let passed = near.poll_to_far();
        assert!(near.poll_to_client().is_none() && near.poll_to_far().is_none());
        (local, passed)
    };
    let goes_on = |near: &mut Near| matches!(answered_here(near), (None, Some(Record::Smb(_))));
    let credits_of = |frame: Vec<u8>| Messages::new(&frame).next().unwrap().0.credits;
    // Far has announced nothing: a CLOSE goes the whole way.
    open(&mut near, 1, 1, 0, 0);
    near.from_client(close(1, 2, 0));
    assert!(goes_on(&mut near));
    let key = super::Key::Read(super::ReadKey::of(
        &header(Command::READ, 100, 1, 1),
        &read_at(0, 10),
    ));
    near.from_far(Record::Announce {
        message_id: 100,
        key,
        valid_ms: 0,
    });
    near.from_far(response(
        Command::CLOSE,
        2,
        1,
        &CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES,
    ));
    near.poll_to_client().unwrap();
    // A file opened, queried: the CLOSE goes on while the QUERY_INFO is outstanding.
    open(&mut near, 2, 3, 0, 0);
    near.from_client(query(2, 4));
    near.poll_to_far().unwrap();
    near.from_client(close(2, 5, 0));
    // The CLOSE ends the prediction nobody asked for; far is told first.
    assert_eq!(
        near.poll_to_far(),
        Some(Record::Dropped { message_id: 100 })
    );
    assert!(goes_on(&mut near));
    // Attributes asked, or a file never seen opened: the whole way.
    open(&mut near, 3, 6, 0, 0);
    near.from_client(close(3, 7, CloseRequest::POSTQUERY_ATTRIB));
    assert!(goes_on(&mut near));
    near.from_client(close(9, 8, 0));
    assert!(goes_on(&mut near));
    // A file written: the whole way.
    open(&mut near, 4, 9, 0, 0);
    let mut write = vec![0; 49];
    write[0] = 49;
    write[16..32].copy_from_slice(&[1u64.to_le_bytes(), 4u64.to_le_bytes()].concat());
    near.from_client(message(&header(Command::WRITE, 10, 1, 1), &write));
    near.poll_to_far().unwrap();
    near.from_far(response(Command::WRITE, 10, 1, &[17, 0]));
    near.poll_to_client().unwrap();
    near.from_client(close(4, 11, 0));
    assert!(goes_on(&mut near));
    // Opened to be deleted at its CLOSE, or with DELETE access: the whole way.
    open(&mut near, 7, 30, 0, 0x1000);
    near.from_client(close(7, 31, 0));
    assert!(goes_on(&mut near));
    open(&mut near, 8, 32, 0x0001_0000, 0);
    near.from_client(close(8, 33, 0));
    assert!(goes_on(&mut near));
    // The tree disconnected: its handles are gone, a CLOSE of one is the server's to answer.
    open(&mut near, 10, 34, 0, 0);
    near.from_client(message(
        &header(Command::TREE_DISCONNECT, 35, 1, 1),
        &[4, 0, 0, 0],
    ));
    near.poll_to_far().unwrap();
    near.from_client(close(10, 36, 0));
    assert!(goes_on(&mut near));
    // Far announces a READ of file `n` with id `id` and the client sends it: near holds it.
    let held_read = |near: &mut Near, n: u64, id: u64| {
        let read = ReadRequest {
            file_id: file(n),
            ..read_at(0, 10)
        };
        let h = header(Command::READ, id, 1, 1);
        near.from_far(Record::Announce {
            message_id: id,
            key: super::Key::Read(super::ReadKey::of(&h, &read)),
            valid_ms: 0,
        });
        near.from_client(read_message(&h, &read));
    };
    // A READ of the file waits here for its prediction's answer: the CLOSE goes on.
    open(&mut near, 11, 37, 0, 0);
    held_read(&mut near, 11, 38);
    assert!(
        near.poll_to_far().is_none(),
        "the READ waits for its answer"
    );
    near.from_client(close(11, 39, 0));
    assert!(goes_on(&mut near));
    // A file only read: answered here with the credits it spends; the CLOSE goes on.
    open(&mut near, 5, 12, 0, 0);
    near.from_client(close(5, 13, 0));
    let (Some(local), Some(Record::Smb(passed))) = answered_here(&mut near) else {
        panic!("the CLOSE was not answered here");
    };
    assert_eq!(passed, close(5, 13, 0));
    let (h, body) = Messages::new(&local).next().unwrap();
    assert_eq!((h.message_id, h.status, h.credits), (13, 0, 1));
    assert!(h.is_response());
    assert_eq!(
        &body[HEADER_LEN..],
        &CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES
    );
    assert_eq!(near.stats().answered_locally, 1);
    // The server answers it first with an interim granting 2, then finally with 3: both
    // dropped, and the 4 near did not give go with the next answer.
    let interim = Header {
        status: status::PENDING,
        flags: flags::SERVER_TO_REDIR | flags::ASYNC_COMMAND,
        tree_or_async: TreeOrAsync::Async(5),
        ..header(Command::CLOSE, 13, 1, 2)
    };
    near.from_far(Record::Smb(message(&interim, &[9, 0, 0, 0, 0, 0, 0, 0, 0])));
    near.from_far(response(
        Command::CLOSE,
        13,
        3,
        &CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES,
    ));
    assert!(near.poll_to_client().is_none());
    near.from_far(response(Command::ECHO, 14, 1, &[4, 0, 0, 0]));
    assert_eq!(credits_of(near.poll_to_client().unwrap()), 5);
    // One that grants none: the next answer gives one credit less; an oplock break or a
    // signed answer in between is left as it is.
    open(&mut near, 6, 15, 0, 0);
    near.from_client(close(6, 16, 0));
    answered_here(&mut near);
    near.from_far(response(
        Command::CLOSE,
        16,
        0,
        &CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES,
    ));
    let brk = Header {
        message_id: u64::MAX,
        flags: flags::SERVER_TO_REDIR,
        ..header(Command::OPLOCK_BREAK, 0, 0, 3)
    };
    near.from_far(Record::Smb(message(&brk, &[24, 0])));
    assert_eq!(credits_of(near.poll_to_client().unwrap()), 3);
    let signed = Header {
        flags: flags::SERVER_TO_REDIR | flags::SIGNED,
        ..header(Command::ECHO, 17, 1, 3)
    };
    near.from_far(Record::Smb(message(&signed, &[4, 0, 0, 0])));
    assert_eq!(credits_of(near.poll_to_client().unwrap()), 3);
    near.from_far(response(Command::ECHO, 18, 3, &[4, 0, 0, 0]));
    assert_eq!(credits_of(near.poll_to_client().unwrap()), 2);
    // A READ held for its prediction, then withdrawn and sent on: outstanding on its
    // file until answered, so the CLOSE after it goes on.
    open(&mut near, 12, 40, 0, 0);
    held_read(&mut near, 12, 41);
    near.from_far(Record::Withdrawn { message_id: 41 });
    assert!(
        matches!(near.poll_to_far(), Some(Record::Smb(_))),
        "sent on"
    );
    near.from_client(close(12, 42, 0));
    assert!(goes_on(&mut near));
}

/// Far's window bounds the bytes its predictions may bring that near has not handed out,
/// and the gateway may change it as the session goes: a window made smaller issues nothing
/// more, one made larger again issues at once.
#[test]
fn far_reads_ahead_within_the_window_it_is_given() {
    let mut far = Splice::far(256 << 10);
    let (_, mut server, records) = drive_far(&mut far, |records| {
        records.iter().any(|r| matches!(r, Record::Announce { .. }))
    });
    let announced = |records: &[Record]| {
        records
            .iter()
            .filter(|r| matches!(r, Record::Announce { .. }))
            .count()
    };
    // 64 KiB READs: four fit in 256 KiB.
    assert_eq!(announced(&records), 4, "{records:?}");
    assert_eq!(far.ahead_bytes(), 256 << 10);
    far.peer_written(far.to_peer().len());
    far.set_window(64 << 10);
    serve(&mut far, &mut server, &mut Frames::new());
    let mut to_near = Frames::new();
    let mut more = Vec::new();
    let bytes = far.to_peer().to_vec();
    far.peer_written(bytes.len());
    to_near
        .feed(
            &bytes,
            |_| true,
            |k, p| more.push(Record::parse(k, &p).unwrap()),
        )
        .unwrap();
    assert_eq!(
        announced(&more),
        0,
        "nothing beyond a smaller window: {more:?}"
    );
    far.set_window(512 << 10);
    assert_eq!(far.ahead_bytes(), 512 << 10, "a larger one is used at once");
}

/// A session that has passed a large answer on keeps little once it is written: an idle
/// session's splice holds a few KiB, whatever it carried before.
#[test]
fn a_written_burst_s_room_is_given_back() {
    let mut near = Splice::near();
    let idle = near.held();
    let answer = message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..header(Command::ECHO, 1, 1, 1)
        },
        &vec![7; 1 << 20],
    );
    near.from_peer(&framed(&answer)).unwrap();
    assert!(near.held() > 1 << 20);
    near.end_written(near.to_end().len());
    assert!(
        near.held() <= idle + (16 << 10),
        "{} bytes held",
        near.held()
    );
}

/// A WRITE request of `data` at `offset` of `file_id`, its charge one credit per 64 KiB.
fn write_message(id: u64, file_id: FileId, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut body = vec![0; 48];
    body[0] = 49;
    body[2..4].copy_from_slice(&((HEADER_LEN + 48) as u16).to_le_bytes());
    body[4..8].copy_from_slice(&(data.len() as u32).to_le_bytes());
    body[8..16].copy_from_slice(&offset.to_le_bytes());
    body[16..24].copy_from_slice(&file_id.persistent.to_le_bytes());
    body[24..32].copy_from_slice(&file_id.volatile.to_le_bytes());
    body.extend_from_slice(data);
    let charge = data.len().div_ceil(65536).max(1) as u16;
    message(&header(Command::WRITE, id, charge, charge), &body)
}

/// A large client WRITE is not held whole at either gateway: near sends it on as its
/// bytes come, unchanged, and so does far, with the fresh server id a miss gave it; the
/// server gets it whole and right, and the client its answer under its own id.
#[test]
fn a_large_write_streams_through_both_halves() {
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();

    let write = framed(&write_message(40, FILE, 0, &data));
    let mut near = Splice::near();
    let half = write.len() / 2;
    near.from_end(&write[..half]).unwrap();
    assert!(
        near.to_peer() == &write[..half],
        "near streams it as it comes"
    );
    near.from_end(&write[half..]).unwrap();
    assert!(near.to_peer() == &write[..], "and whole");

    // Far, with READs predicted: the WRITE takes a predicted id, a miss.
    let mut far = Splice::far(1 << 20);
    let (mut client, mut server, _) = drive_far(&mut far, |records| {
        records.iter().any(|r| matches!(r, Record::Announce { .. }))
    });
    let mut to_server = Frames::new();
    serve(&mut far, &mut server, &mut to_server);
    let id = client.next_id;
    client.next_id += 16;
    let write = framed(&write_message(id, client.file_id, 4096, &data));
    far.from_peer(&write[..half]).unwrap();
    let sent = far.to_end().to_vec();
    assert_eq!(sent.len(), half, "far streams it as it comes");
    let server_id = u64::from_le_bytes(sent[4 + 24..4 + 32].try_into().unwrap());
    assert_ne!(server_id, id, "with a fresh id");
    assert!(sent[..4 + 24] == write[..4 + 24] && sent[4 + 32..] == write[4 + 32..half]);
    far.from_peer(&write[half..]).unwrap();
    assert!(
        far.may_act(),
        "the observer read the streamed frame as it is: the session is still unsigned"
    );
    serve(&mut far, &mut server, &mut to_server);
    assert!(server.violations.is_empty(), "{:?}", server.violations);
    assert!(
        server.file[4096..4096 + data.len()] == data[..],
        "written whole"
    );
    let mut answers = Vec::new();
    let out = far.to_peer().to_vec();
    Frames::new()
        .feed(
            &out,
            |_| true,
            |k, p| answers.push(Record::parse(k, &p).unwrap()),
        )
        .unwrap();
    assert!(
        answers.iter().any(|r| matches!(r, Record::Smb(f)
            if Messages::new(f).next().is_some_and(|(h, _)| h.command == Command::WRITE
                && h.message_id == id && h.status == 0))),
        "the client's answer under its id: {answers:?}"
    );
}

/// A frame whose first bytes come over several reads is judged once they are in, and
/// streams as one read whole would: a WRITE at near, an answer from far at near.
#[test]
fn a_frame_whose_start_comes_in_pieces_still_streams() {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let write = framed(&write_message(7, FILE, 0, &data));
    let answer = framed(&message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..header(Command::READ, 3, 1, 1)
        },
        &data,
    ));
    let mut near = Splice::near();
    for cut in [(0, 3), (3, 60), (60, 99), (99, 5000)] {
        near.from_end(&write[cut.0..cut.1]).unwrap();
        near.from_peer(&answer[cut.0..cut.1]).unwrap();
    }
    assert!(near.to_peer() == &write[..5000], "the WRITE streams");
    assert!(near.to_end() == &answer[..5000], "the answer streams");
    near.from_end(&write[5000..]).unwrap();
    near.from_peer(&answer[5000..]).unwrap();
    assert!(near.to_peer() == &write[..] && near.to_end() == &answer[..]);
}

/// An end that finishes inside a frame: the frame's bytes go on as they came and
/// nothing follows them, not even a request near held and far then withdrew (the peer
/// would read it as the rest of the cut frame). The same when the peer's stream ends
/// inside an answer: near answers nothing more to the client.
#[test]
fn nothing_follows_a_frame_cut_by_its_end() {
    let read = read_at(0, 4096);
    let h = header(Command::READ, 9, 1, 1);
    let mut announce = Vec::new();
    Record::Announce {
        message_id: 9,
        key: super::Key::Read(super::ReadKey::of(&h, &read)),
        valid_ms: 0,
    }
    .emit(&mut announce)
    .unwrap();
    let mut near = Splice::near();
    near.from_peer(&announce).unwrap();
    near.from_end(&framed(&read_message(&h, &read))).unwrap();
    assert!(
        near.to_peer().is_empty(),
        "near holds the READ for its prediction"
    );
    let cut = framed(&read_message(&header(Command::READ, 10, 1, 1), &read));
    near.from_end(&cut[..30]).unwrap();
    near.end_finished();
    let mut withdrawn = Vec::new();
    Record::Withdrawn { message_id: 9 }
        .emit(&mut withdrawn)
        .unwrap();
    near.from_peer(&withdrawn).unwrap();
    assert!(
        near.to_peer() == &cut[..30],
        "the cut frame, and nothing after it"
    );

    let answer = framed(&message(
        &Header {
            flags: flags::SERVER_TO_REDIR,
            ..header(Command::READ, 3, 1, 1)
        },
        &vec![0x5a; 400],
    ));
    let mut prefetched = Vec::new();
    Record::Prefetched {
        message_id: 9,
        at: super::link::NO_CLOCK,
        answer: message(
            &Header {
                flags: flags::SERVER_TO_REDIR,
                ..h
            },
            &[9, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
    }
    .emit(&mut prefetched)
    .unwrap();
    let mut near = Splice::near();
    near.from_peer(&announce).unwrap();
    near.from_peer(&prefetched).unwrap();
    near.from_peer(&answer[..300]).unwrap();
    near.peer_finished().unwrap();
    // The READ near could answer from what it holds.
    near.from_end(&framed(&read_message(&h, &read))).unwrap();
    assert!(
        near.to_end() == &answer[..300],
        "the cut answer, and nothing after it"
    );
}
