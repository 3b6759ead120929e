//! `wsx-streams`: the tunnel core alone with many concurrent streams, in simulation.
//!
//! Two connections (`wsx_tunnel::testing::Pair`, virtual time, a simulated 10 Gbit/s
//! 10 ms link) open `--count` streams; each carries a 64-byte request, which the far side
//! reads and checks. With every stream open and idle, the heap both ends hold is counted
//! (this program's allocator counts the bytes allocated and not yet freed); then every
//! stream is finished in both directions, and the heap counted again once both ends have
//! forgotten them. CPU time is the process's, per phase. The report is one JSON line.

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::Serialize;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use wsx_tunnel::testing::{LinkConfig, Pair};
use wsx_tunnel::{Event, StreamId, StreamMeta, Target, TransportConfig};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's arguments; the count
// is only arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            HELD.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for GlobalAlloc::realloc, passed through.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HELD.fetch_add(new_size, Ordering::Relaxed);
            HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Parser, Debug)]
#[command(about = "The tunnel core with many concurrent streams, in simulation")]
struct Args {
    /// Streams to open and hold at once.
    #[arg(long)]
    count: usize,
    /// Simulation seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Bytes of each stream's request.
const REQUEST: usize = 64;

#[derive(Debug, Serialize)]
struct Report {
    kind: &'static str,
    streams: usize,
    /// Streams both ends held open at once, and the requests read and checked.
    open_client: usize,
    open_server: usize,
    verified_requests: usize,
    /// Heap held (bytes) by both ends with the connections established and no streams,
    /// with every stream open and idle, and after every stream closed.
    heap_idle: usize,
    heap_open: usize,
    heap_closed: usize,
    /// (heap_open - heap_idle) / streams / 2: one end's heap per open stream.
    bytes_per_stream_per_end: f64,
    /// CPU seconds of the whole simulation (both ends, the links) to open the streams and
    /// deliver their requests, and to close them.
    open_cpu_s: f64,
    close_cpu_s: f64,
    /// Per stream, both ends together (µs).
    open_cpu_us_per_stream: f64,
    close_cpu_us_per_stream: f64,
    /// Virtual time the two phases took.
    open_virtual_s: f64,
    close_virtual_s: f64,
    verified: bool,
}

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Stream `n`'s request.
fn request(n: u64) -> [u8; REQUEST] {
    let mut r = [0u8; REQUEST];
    for (i, b) in r.iter_mut().enumerate() {
        *b = (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 8 * 8)) as u8 ^ i as u8;
    }
    r
}

fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.count;
    let mut transport = TransportConfig::default();
    transport.max_concurrent_streams = n as u64 + 16;
    let link = LinkConfig::new(Duration::from_millis(10), 10_000);
    let mut pair = Pair::with_config(Instant::now(), link.clone(), link, args.seed, transport);
    pair.connect();
    // The bookkeeping of this program, allocated before the baseline.
    let mut numbers: HashMap<StreamId, u64> = HashMap::with_capacity(n);
    let mut ids: Vec<StreamId> = Vec::with_capacity(n);
    let mut events = Vec::with_capacity(1 << 16);
    // What each stream's far end has read so far (requests may arrive in pieces).
    let mut arrived: Vec<([u8; REQUEST], u8)> = vec![([0; REQUEST], 0); n];
    let settle = |pair: &mut Pair| {
        let until = pair.now + Duration::from_millis(200);
        while pair.now < until && pair.step() {}
    };
    settle(&mut pair);
    for side in &mut pair.sides {
        side.events.clear();
        side.events.shrink_to(1 << 16);
    }
    let heap_idle = HELD.load(Ordering::Relaxed);

    // Open every stream with its request; the far side reads and checks each.
    let cpu = cpu_seconds();
    let start = pair.now;
    let meta = StreamMeta {
        destination: Some(Target::Addr("192.0.2.1:80".parse()?)),
        ..StreamMeta::default()
    };
    for i in 0..n as u64 {
        let id = pair
            .client()
            .open_stream(meta.clone())
            .with_context(|| format!("opening stream {i}"))?;
        let written = pair.client().write(id, &request(i))?;
        if written != REQUEST {
            bail!("stream {i} took {written} of {REQUEST} bytes");
        }
        numbers.insert(id, i);
        ids.push(id);
    }
    let mut verified_requests = 0usize;
    let mut wrong = 0usize;
    let mut buf = [0u8; 256];
    let limit = pair.now + Duration::from_secs(600);
    while verified_requests + wrong < n {
        if pair.now > limit || !pair.step() {
            bail!("{verified_requests} of {n} requests arrived");
        }
        events.append(&mut pair.sides[1].events);
        pair.sides[0].events.clear();
        for (_, event) in events.drain(..) {
            if let Event::StreamOpened(id) | Event::StreamReadable(id) = event {
                let Some(&i) = numbers.get(&id) else {
                    bail!("stream {id:?} was never opened");
                };
                let (so_far, len) = &mut arrived[i as usize];
                let connection = pair.server();
                loop {
                    match connection.read(id, &mut buf) {
                        Ok(Some(got)) => {
                            let at = usize::from(*len);
                            if at + got > REQUEST {
                                bail!("stream {i} carried more than its request");
                            }
                            so_far[at..at + got].copy_from_slice(&buf[..got]);
                            *len += got as u8;
                            if usize::from(*len) == REQUEST {
                                if *so_far == request(i) {
                                    verified_requests += 1;
                                } else {
                                    wrong += 1;
                                }
                            }
                        }
                        Err(wsx_tunnel::StreamError::Blocked) => break,
                        other => bail!("reading stream {i}: {other:?}"),
                    }
                }
            }
        }
    }
    let open_virtual_s = (pair.now - start).as_secs_f64();
    // Every acknowledgment in: the streams are open and idle.
    settle(&mut pair);
    let open_cpu_s = cpu_seconds() - cpu;
    let (open_client, open_server) = (pair.client().open_streams(), pair.server().open_streams());
    pair.sides[0].events.clear();
    pair.sides[1].events.clear();
    let heap_open = HELD.load(Ordering::Relaxed);

    // Close: the client finishes each stream, the server reads the end and finishes too.
    let cpu = cpu_seconds();
    let start = pair.now;
    for &id in &ids {
        pair.client().finish(id)?;
    }
    let limit = pair.now + Duration::from_secs(600);
    while pair.client().open_streams() > 0 || pair.server().open_streams() > 0 {
        if pair.now > limit || !pair.step() {
            bail!(
                "streams still open: {} and {}",
                pair.client().open_streams(),
                pair.server().open_streams()
            );
        }
        for side in 0..2 {
            events.append(&mut pair.sides[side].events);
            for (_, event) in events.drain(..) {
                if let Event::StreamReadable(id) = event {
                    let connection = pair.sides[side].connection();
                    if let Ok(None) = connection.read(id, &mut buf) {
                        if side == 1 {
                            connection.finish(id)?;
                        }
                    }
                }
            }
        }
    }
    settle(&mut pair);
    let close_virtual_s = (pair.now - start).as_secs_f64();
    let close_cpu_s = cpu_seconds() - cpu;
    let heap_closed = HELD.load(Ordering::Relaxed);

    let per_stream = |bytes: usize| bytes as f64 / n.max(1) as f64;
    let report = Report {
        kind: "streams",
        streams: n,
        open_client,
        open_server,
        verified_requests,
        heap_idle,
        heap_open,
        heap_closed,
        bytes_per_stream_per_end: per_stream(heap_open.saturating_sub(heap_idle)) / 2.0,
        open_cpu_s,
        close_cpu_s,
        open_cpu_us_per_stream: open_cpu_s * 1e6 / n.max(1) as f64,
        close_cpu_us_per_stream: close_cpu_s * 1e6 / n.max(1) as f64,
        open_virtual_s,
        close_virtual_s,
        verified: wrong == 0 && verified_requests == n && open_client == n && open_server == n,
    };
    println!("{}", serde_json::to_string(&report)?);
    if !report.verified {
        bail!("not verified: {report:?}");
    }
    Ok(())
}
