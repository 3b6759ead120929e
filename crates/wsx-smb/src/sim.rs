//! A simulated SMB client and server, for tests of the engine here and in the gateway.
//!
//! The server is strict as Samba is: it refuses (records as a violation) any MessageId
//! outside its credit window or used twice, and [`Server::holes`] lists ids never used.
//! The client keeps one request outstanding (or `depth` READs), opens, queries, reads and
//! closes files, and checks every answer against the server's file. Both work on whole
//! SMB2 messages; [`framed`] adds the Direct TCP framing and [`pieces`] cuts a byte stream
//! as TCP would. Virtual time is passed in; there is no I/O.
//!
//! Built for this crate's tests, and for other crates with the `sim` feature.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test support: a malformed message is a failed test"
)]

use crate::wire::header::{Command, HEADER_LEN, Header, Messages, TreeOrAsync, flags, status};
use crate::wire::messages::{CloseRequest, FileId, QueryInfoRequest, ReadRequest, ReadResponse};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

pub const SESSION: u64 = 0x55;
pub const TREE: u32 = 7;
pub const FILE: FileId = FileId {
    persistent: 0x1111,
    volatile: 0x2222,
};
pub const END_OF_FILE_STATUS: u32 = 0xc000_0011;
pub const FILE_CLOSED_STATUS: u32 = 0xc000_0128;
pub const INVALID_DEVICE_REQUEST_STATUS: u32 = 0xc000_0010;

/// A QUERY_INFO for everything about a file (FileAllInformation), as clients ask after a
/// CREATE.
pub const FILE_ALL_INFORMATION: QueryInfoRequest = QueryInfoRequest {
    info_type: 1,
    file_info_class: 0x12,
    output_buffer_length: 4096,
    input_buffer_offset: 0x68,
    input_buffer_length: 0,
    additional_information: 0,
    flags: 0,
    file_id: FILE,
};

pub fn header(command: Command, message_id: u64, credit_charge: u16, credits: u16) -> Header {
    Header {
        credit_charge,
        status: 0,
        command,
        credits,
        flags: 0,
        next_command: 0,
        message_id,
        tree_or_async: TreeOrAsync::Tree {
            reserved: 0,
            tree_id: TREE,
        },
        session_id: SESSION,
        signature: [0; 16],
    }
}

pub fn message(header: &Header, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0; HEADER_LEN];
    header.emit(&mut m).unwrap();
    m.extend_from_slice(body);
    m
}

/// A READ of the test file's `length` bytes at `offset`.
pub fn read_at(offset: u64, length: u32) -> ReadRequest {
    ReadRequest {
        padding: 0x50,
        flags: 0,
        length,
        offset,
        file_id: FILE,
        minimum_count: 0,
        channel: 0,
        remaining_bytes: 0,
        channel_info_offset: 0,
        channel_info_length: 0,
    }
}

/// A READ request message: `read` under `header`.
pub fn read_message(header: &Header, read: &ReadRequest) -> Vec<u8> {
    let mut body = vec![0; ReadRequest::LEN];
    read.emit(&mut body).unwrap();
    message(header, &body)
}

/// The strict server: answers NEGOTIATE, SESSION_SETUP, TREE_CONNECT, CREATE, READ
/// (asynchronously when `async_reads`: an interim answer with the credits, then the data),
/// ECHO, WRITE and CLOSE, granting what each request asks.
#[derive(Debug)]
pub struct Server {
    pub file: Vec<u8>,
    /// Sizes of the files each CREATE opens in turn (the first bytes of `file`); empty:
    /// the whole file each time.
    pub sizes: Vec<usize>,
    /// Open files by the volatile half of their id, and their sizes (`None`: the whole
    /// file as it is now).
    pub opens: HashMap<u64, Option<usize>>,
    pub creates: usize,
    pub async_reads: bool,
    pub window_end: u64,
    pub used: BTreeSet<u64>,
    pub violations: Vec<String>,
    pub next_async: u64,
    /// The state of the lease each CREATE grants (with a lease context, as Windows
    /// servers and Samba answer a client that asks for one); `None`: no oplock, no lease.
    pub lease: Option<u32>,
    /// Which CREATEs open a directory, in turn as `sizes` (its attributes say so; a READ
    /// on it is a violation, answered STATUS_INVALID_DEVICE_REQUEST); empty: none.
    pub directories: Vec<bool>,
    /// The volatile ids of the directories opened.
    pub directory_ids: BTreeSet<u64>,
}

impl Server {
    /// The size of the open file a READ, QUERY_INFO or CLOSE names; `None` (and a
    /// violation) if it is not open.
    pub fn size_of(&mut self, header: &Header, body: &[u8]) -> Option<usize> {
        let file_id = crate::wire::messages::file_id_of(header.command, body)?;
        match self.opens.get(&file_id.volatile) {
            Some(size) if file_id.persistent == FILE.persistent => {
                Some(size.unwrap_or(self.file.len()))
            }
            _ => {
                self.violations.push(format!(
                    "{:?} {} on a file not open",
                    header.command, header.message_id
                ));
                None
            }
        }
    }

    /// Whether the `create`-th CREATE (from 0) opens a directory.
    pub fn is_directory(&self, create: usize) -> bool {
        !self.directories.is_empty() && self.directories[create % self.directories.len()]
    }

    /// Ids below the highest used that no request used: Samba's window cannot slide past
    /// one, so each is a credit the session loses for good.
    pub fn holes(&self) -> Vec<u64> {
        let top = self.used.last().map_or(0, |&t| t + 1);
        (0..top).filter(|id| !self.used.contains(id)).collect()
    }

    pub fn answer(&mut self, frame: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (h, m) in Messages::new(frame) {
            let charge = u64::from(h.credit_charge.max(1));
            for id in h.message_id..h.message_id + charge {
                if id >= self.window_end {
                    self.violations
                        .push(format!("id {id} beyond the window ({})", self.window_end));
                }
                if !self.used.insert(id) {
                    self.violations.push(format!("id {id} used twice"));
                }
            }
            let grant = h.credits.max(1);
            self.window_end += u64::from(grant);
            let mut answer = Header {
                flags: flags::SERVER_TO_REDIR,
                credits: grant,
                ..h
            };
            let body: Vec<u8> = match h.command {
                Command::NEGOTIATE => {
                    let mut b = vec![0; 64];
                    b[0] = 65;
                    b[4..6].copy_from_slice(&0x0210u16.to_le_bytes());
                    b
                }
                Command::SESSION_SETUP => vec![9, 0, 0, 0, 0, 0, 0, 0],
                Command::TREE_CONNECT => {
                    let mut b = vec![0; 16];
                    b[0] = 16;
                    b
                }
                Command::CREATE => {
                    let size = self
                        .sizes
                        .get(self.creates % self.sizes.len().max(1))
                        .copied();
                    let volatile = FILE.volatile + self.creates as u64;
                    let directory = self.is_directory(self.creates);
                    if directory {
                        self.directory_ids.insert(volatile);
                    }
                    self.creates += 1;
                    self.opens.insert(volatile, size);
                    let mut b = vec![0; 88];
                    b[0] = 89;
                    let eof = size.unwrap_or(self.file.len()) as u64;
                    b[48..56].copy_from_slice(&eof.to_le_bytes());
                    // FileAttributes: NORMAL, or DIRECTORY.
                    let attributes: u32 = if directory { 0x10 } else { 0x80 };
                    b[56..60].copy_from_slice(&attributes.to_le_bytes());
                    b[64..72].copy_from_slice(&FILE.persistent.to_le_bytes());
                    b[72..80].copy_from_slice(&volatile.to_le_bytes());
                    if let Some(state) = self.lease {
                        b[2] = crate::wire::messages::oplock::LEASE;
                        // One context right after the fixed part: "RqLs", a version 1
                        // lease (key, state, flags, duration).
                        b[80..84].copy_from_slice(&(HEADER_LEN as u32 + 88).to_le_bytes());
                        b[84..88].copy_from_slice(&56u32.to_le_bytes());
                        b.extend_from_slice(&[0; 4]);
                        b.extend_from_slice(&[16, 0, 4, 0, 0, 0, 24, 0, 32, 0, 0, 0]);
                        b.extend_from_slice(b"RqLs\0\0\0\0");
                        b.extend_from_slice(&[0x5A; 16]);
                        b.extend_from_slice(&state.to_le_bytes());
                        b.extend_from_slice(&[0; 12]);
                    }
                    b
                }
                Command::READ | Command::QUERY_INFO | Command::CLOSE
                    if self.size_of(&h, &m[HEADER_LEN..]).is_none() =>
                {
                    answer.status = FILE_CLOSED_STATUS;
                    vec![9, 0, 0, 0, 0, 0, 0, 0, 0]
                }
                Command::QUERY_INFO => {
                    let query = QueryInfoRequest::parse(&m[HEADER_LEN..]).unwrap();
                    let size = self.size_of(&h, &m[HEADER_LEN..]).unwrap();
                    let mut data = vec![query.info_type, query.file_info_class];
                    data.extend_from_slice(&(size as u64).to_le_bytes());
                    data.extend_from_slice(&query.file_id.volatile.to_le_bytes());
                    let mut b = vec![9, 0, 0x48, 0];
                    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    b.extend_from_slice(&data);
                    b
                }
                Command::CLOSE => {
                    let close = CloseRequest::parse(&m[HEADER_LEN..]).unwrap();
                    self.opens.remove(&close.file_id.volatile);
                    CloseRequest::RESPONSE_WITHOUT_ATTRIBUTES.to_vec()
                }
                Command::READ
                    if crate::wire::messages::file_id_of(h.command, &m[HEADER_LEN..])
                        .is_some_and(|id| self.directory_ids.contains(&id.volatile)) =>
                {
                    self.violations
                        .push(format!("READ {} of a directory", h.message_id));
                    answer.status = INVALID_DEVICE_REQUEST_STATUS;
                    vec![9, 0, 0, 0, 0, 0, 0, 0, 0]
                }
                Command::READ => {
                    let read = ReadRequest::parse(&m[HEADER_LEN..]).unwrap();
                    let size = self.size_of(&h, &m[HEADER_LEN..]).unwrap();
                    let start = read.offset as usize;
                    if start >= size {
                        answer.status = END_OF_FILE_STATUS;
                        vec![9, 0, 0, 0, 0, 0, 0, 0, 0]
                    } else {
                        let end = (start + read.length as usize).min(size);
                        if self.async_reads {
                            self.next_async += 1;
                            let interim = Header {
                                status: status::PENDING,
                                flags: flags::SERVER_TO_REDIR | flags::ASYNC_COMMAND,
                                tree_or_async: TreeOrAsync::Async(self.next_async),
                                ..answer
                            };
                            out.push(message(&interim, &[9, 0, 0, 0, 0, 0, 0, 0, 0]));
                            answer.credits = 0;
                            answer.flags |= flags::ASYNC_COMMAND;
                            answer.tree_or_async = TreeOrAsync::Async(self.next_async);
                        }
                        let mut b = vec![0; ReadResponse::LEN];
                        ReadResponse {
                            data_offset: 0x50,
                            data_length: (end - start) as u32,
                            data_remaining: 0,
                            flags: 0,
                        }
                        .emit(&mut b)
                        .unwrap();
                        b.extend_from_slice(&self.file[start..end]);
                        b
                    }
                }
                Command::WRITE => {
                    // DataOffset (2 at 2, from the header), Length (4 at 4), Offset (8 at 8).
                    let b = &m[HEADER_LEN..];
                    let data_at = usize::from(u16::from_le_bytes([b[2], b[3]]));
                    let len = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
                    let offset = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
                    let data = &m[data_at..data_at + len];
                    if offset + len > self.file.len() {
                        self.file.resize(offset + len, 0);
                    }
                    self.file[offset..offset + len].copy_from_slice(data);
                    let mut answer_body = vec![0; 16];
                    answer_body[0] = 17;
                    answer_body[4..8].copy_from_slice(&(len as u32).to_le_bytes());
                    answer_body
                }
                _ => vec![4, 0, 0, 0],
            };
            out.push(message(&answer, &body));
        }
        out
    }
}

/// A scripted client's request after its CREATE.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Read {
        offset: u64,
        len: u32,
    },
    Echo,
    /// 64 new bytes at `offset`.
    /// `len` new bytes at `offset` (large ones stream through the gateways).
    Write {
        offset: u64,
        len: u32,
    },
}

/// What the client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Negotiate,
    SessionSetup,
    TreeConnect,
    Create,
    /// QUERY_INFOs after a CREATE.
    Query,
    Read,
    /// The CLOSE sent.
    Closing,
    /// An ECHO sent after this many READs (a request that is not the predicted READ).
    Done,
}

/// A client that keeps one request outstanding and reads the whole file in READs of
/// `read_len`; after `echo_after` READs it sends an ECHO, after `write_after` a WRITE.
#[derive(Debug)]
pub struct Client {
    pub read_len: u32,
    pub window_end: u64,
    pub next_id: u64,
    pub step: Step,
    pub offset: u64,
    pub end_of_file: u64,
    pub data: Vec<u8>,
    pub reads: usize,
    pub echo_after: Option<usize>,
    pub write_after: Option<usize>,
    /// Credits the client asks for in its SESSION_SETUP: its window from then on.
    pub setup_credits: u16,
    /// Asks for no more than the file's rest (smbprotocol does; smbclient asks whole).
    pub trim_last: bool,
    /// From the file of this number on (the first is 1), closes each once it has read at
    /// least these bytes (whole READs; one READ outstanding only): a client that looks
    /// only at the start of a file.
    pub read_limit: Option<(usize, u64)>,
    /// Instead of reading the file through: these requests, one at a time, each READ's
    /// answer checked against `expect` (the file).
    pub script: Option<(VecDeque<Op>, Vec<u8>)>,
    /// The READ in flight of a script, and its offset.
    pub scripted_read: Option<(u64, u32)>,
    /// What went against the protocol, as the client sees it.
    pub violations: Vec<String>,
    /// The id of the request it waits on.
    pub last_id: u64,
    /// READs kept outstanding once reading (1: one at a time, the default).
    pub depth: usize,
    /// With `depth` > 1: the READs outstanding, by id, and their offsets.
    pub outstanding: BTreeMap<u64, u64>,
    pub finished_at: Option<u64>,
    /// Files to read, one after another: each opened, queried, read and closed.
    pub files: usize,
    /// Files opened so far; the one open.
    pub opened: usize,
    pub file_id: FileId,
    /// QUERY_INFOs the client sends after each CREATE (smbclient asks one), for the first
    /// `query_files` files; the next one to send.
    pub queries: Vec<QueryInfoRequest>,
    pub query_files: usize,
    pub query_at: usize,
    /// The ShareAccess of its CREATEs (1: read only, which keeps writers out; 3: others
    /// may write, as Samba's smbclient opens).
    pub share_access: u32,
    /// The name each CREATE opens, in turn (empty: none, as a share's root).
    pub names: Vec<String>,
    /// How long it takes to send its next request once an answer is in, µs.
    pub think_us: u64,
    /// Once, after this many READs answered: a pause this long (µs) before the next
    /// request, beside `think_us`.
    pub pause: Option<(usize, u64)>,
    /// What is open is a directory (its CREATE answer says so): queried, never read.
    pub directory: bool,
}

impl Client {
    /// How long it waits before a request it sends now: its thinking, and the pause if
    /// this is when it comes.
    pub fn wait_us(&mut self) -> u64 {
        let pause = self
            .pause
            .take_if(|&mut (after, _)| after == self.reads)
            .map_or(0, |(_, us)| us);
        self.think_us + pause
    }

    pub fn request(&mut self, command: Command, credits: u16, body: &[u8]) -> Vec<u8> {
        self.charged(command, 1, credits, body)
    }

    /// A request of `charge` credits (SMB 2.1: one per 64 KiB of a READ or WRITE).
    pub fn charged(&mut self, command: Command, charge: u16, credits: u16, body: &[u8]) -> Vec<u8> {
        let id = self.next_id;
        if id + u64::from(charge) > self.window_end {
            self.violations.push(format!(
                "client has no credit for ids {id}..{} ({})",
                id + u64::from(charge),
                self.window_end
            ));
        }
        self.next_id += u64::from(charge);
        self.last_id = id;
        message(&header(command, id, charge, credits), body)
    }

    pub fn read_request(&mut self) -> Vec<u8> {
        let mut body = [0; ReadRequest::LEN];
        let length = if self.trim_last && self.script.is_none() {
            let rest = self.end_of_file.saturating_sub(self.offset);
            self.read_len.min(u32::try_from(rest).unwrap_or(u32::MAX))
        } else {
            self.read_len
        };
        ReadRequest {
            file_id: self.file_id,
            ..read_at(self.offset, length)
        }
        .emit(&mut body)
        .unwrap();
        let charge = length.div_ceil(65536).max(1) as u16;
        self.charged(Command::READ, charge, charge, &body)
    }

    /// A CREATE of the next file, with its ShareAccess.
    pub fn create(&mut self) -> Vec<u8> {
        let mut body = vec![0; 57];
        body[0] = 57;
        body[32..36].copy_from_slice(&self.share_access.to_le_bytes());
        if !self.names.is_empty() {
            // NameOffset (from the header's start) and NameLength, the name in UTF-16LE
            // where the buffer starts.
            let name: Vec<u8> = self.names[self.opened % self.names.len()]
                .encode_utf16()
                .flat_map(u16::to_le_bytes)
                .collect();
            body[44..46].copy_from_slice(&((HEADER_LEN + 56) as u16).to_le_bytes());
            body[46..48].copy_from_slice(&(name.len() as u16).to_le_bytes());
            body.truncate(56);
            body.extend_from_slice(&name);
        }
        self.request(Command::CREATE, 1, &body)
    }

    /// The file open has been read as far as [`Client::read_limit`] allows.
    fn read_enough(&self) -> bool {
        self.read_limit
            .is_some_and(|(from, limit)| self.opened >= from && self.offset >= limit)
    }

    /// The CLOSE of the file read.
    pub fn close(&mut self) -> Vec<u8> {
        self.step = Step::Closing;
        let mut body = vec![0; CloseRequest::LEN];
        CloseRequest {
            flags: 0,
            file_id: self.file_id,
        }
        .emit(&mut body)
        .unwrap();
        self.request(Command::CLOSE, 1, &body)
    }

    /// After the CREATE's answer, and each QUERY_INFO's: the next QUERY_INFO, or the
    /// reading's first request.
    pub fn after_create(&mut self, now: u64) -> Option<Vec<u8>> {
        if let Some(query) = self.queries.get(self.query_at) {
            self.step = Step::Query;
            let mut body = vec![0; QueryInfoRequest::LEN];
            QueryInfoRequest {
                file_id: self.file_id,
                ..*query
            }
            .emit(&mut body)
            .unwrap();
            return Some(self.request(Command::QUERY_INFO, 1, &body));
        }
        self.step = Step::Read;
        if self.script.is_some() {
            // The script's first request, as if answering nothing.
            let mut answer = message(&header(Command::ECHO, 0, 1, 0), &[4, 0, 0, 0]);
            answer[16] = flags::SERVER_TO_REDIR as u8;
            return self.answered(&answer, now);
        }
        if self.offset >= self.end_of_file || self.directory {
            return Some(self.close());
        }
        Some(self.read_request())
    }

    /// The first request.
    pub fn start(&mut self) -> Vec<u8> {
        self.step = Step::Negotiate;
        self.request(Command::NEGOTIATE, 1, &[36, 0])
    }

    /// An answer came; the next requests. A client with `depth` READs outstanding reads
    /// the file whole, each answer checked at its offset, and keeps that many in flight.
    pub fn answered_all(&mut self, frame: &[u8], now: u64) -> Vec<Vec<u8>> {
        if self.depth == 1 || self.script.is_some() {
            return self.answered(frame, now).into_iter().collect();
        }
        if self.step != Step::Read {
            let Some(first) = self.answered(frame, now) else {
                return Vec::new();
            };
            if self.step != Step::Read {
                return vec![first];
            }
            // The first READ: then the rest of the depth at once.
            self.data = vec![0; self.end_of_file as usize];
            self.outstanding.insert(self.last_id, self.offset);
            self.offset += u64::from(self.read_len);
            let mut out = vec![first];
            while self.outstanding.len() < self.depth && self.offset < self.end_of_file {
                out.push(self.next_pipelined());
            }
            return out;
        }
        let (h, m) = Messages::new(frame).next().unwrap();
        self.window_end += u64::from(h.credits);
        if h.status == status::PENDING {
            return Vec::new();
        }
        if h.command == Command::ECHO {
            return Vec::new();
        }
        let Some(offset) = self.outstanding.remove(&h.message_id) else {
            self.violations
                .push(format!("an answer to {} nobody waits on", h.message_id));
            return Vec::new();
        };
        self.reads += 1;
        let start = offset as usize;
        let end = (start + self.read_len as usize).min(self.data.len());
        let r = ReadResponse::parse(&m[HEADER_LEN..]).unwrap();
        let at = usize::from(r.data_offset);
        if h.command != Command::READ || r.data_length as usize != end - start {
            self.violations
                .push(format!("READ at {offset}: {:?} {:#x}", h.command, h.status));
        } else {
            self.data[start..end].copy_from_slice(&m[at..at + end - start]);
        }
        let mut out = Vec::new();
        if self.echo_after == Some(self.reads) {
            // A request in flight among the READs, on an id a prediction may have.
            self.echo_after = None;
            out.push(self.request(Command::ECHO, 1, &[4, 0, 0, 0]));
        }
        while self.outstanding.len() < self.depth && self.offset < self.end_of_file {
            out.push(self.next_pipelined());
        }
        if self.outstanding.is_empty() && self.step == Step::Read {
            out.push(self.close());
        }
        out
    }

    /// The next READ of a pipelining client.
    pub fn next_pipelined(&mut self) -> Vec<u8> {
        let frame = self.read_request();
        self.outstanding.insert(self.last_id, self.offset);
        self.offset += u64::from(self.read_len);
        frame
    }

    /// An answer came; the next request, if any.
    pub fn answered(&mut self, frame: &[u8], now: u64) -> Option<Vec<u8>> {
        let (h, m) = Messages::new(frame).next().unwrap();
        self.window_end += u64::from(h.credits);
        if h.status == status::PENDING {
            return None;
        }
        match (self.step, h.command) {
            (Step::Negotiate, Command::NEGOTIATE) => {
                self.step = Step::SessionSetup;
                let credits = self.setup_credits;
                Some(self.request(Command::SESSION_SETUP, credits, &[25, 0]))
            }
            (Step::SessionSetup, Command::SESSION_SETUP) => {
                self.step = Step::TreeConnect;
                Some(self.request(Command::TREE_CONNECT, 1, &[9, 0]))
            }
            (Step::TreeConnect, Command::TREE_CONNECT) => {
                self.step = Step::Create;
                Some(self.create())
            }
            (Step::Create, Command::CREATE) => {
                let b = &m[HEADER_LEN..];
                self.end_of_file = u64::from_le_bytes(b[48..56].try_into().unwrap());
                // FileAttributes: DIRECTORY.
                self.directory = b[56] & 0x10 != 0;
                self.file_id = FileId::parse(&b[64..80]);
                self.opened += 1;
                self.offset = 0;
                self.query_at = 0;
                if self.opened > self.query_files {
                    self.queries.clear();
                }
                self.after_create(now)
            }
            (Step::Read, Command::READ | Command::ECHO | Command::WRITE)
                if self.script.is_some() =>
            {
                if let Some((offset, len)) = self.scripted_read.take() {
                    let file = &self.script.as_ref().unwrap().1;
                    let start = offset as usize;
                    if start >= file.len() {
                        if h.status != END_OF_FILE_STATUS {
                            self.violations
                                .push(format!("READ at {offset}: {:#x}", h.status));
                        }
                    } else {
                        let end = (start + len as usize).min(file.len());
                        let r = ReadResponse::parse(&m[HEADER_LEN..]).unwrap();
                        let at = usize::from(r.data_offset);
                        if h.command != Command::READ
                            || m[at..at + r.data_length as usize] != file[start..end]
                        {
                            self.violations
                                .push(format!("READ at {offset}: wrong data"));
                        }
                    }
                    self.reads += 1;
                }
                let next = self.script.as_mut().unwrap().0.pop_front();
                match next {
                    Some(Op::Read { offset, len }) => {
                        self.offset = offset;
                        self.read_len = len;
                        self.scripted_read = Some((offset, len));
                        Some(self.read_request())
                    }
                    Some(Op::Echo) => Some(self.request(Command::ECHO, 1, &[4, 0, 0, 0])),
                    Some(Op::Write { offset, len }) => {
                        // `len` bytes of a new pattern at `offset`, which the client now
                        // expects to read back.
                        let data: Vec<u8> = (0..len)
                            .map(|i| (i as u8) ^ 0xa5 ^ (offset as u8) ^ ((i >> 8) as u8))
                            .collect();
                        let expect = &mut self.script.as_mut().unwrap().1;
                        let at = offset as usize;
                        if at + data.len() > expect.len() {
                            expect.resize(at + data.len(), 0);
                        }
                        expect[at..at + data.len()].copy_from_slice(&data);
                        let mut body = vec![0; 48];
                        body[0] = 49;
                        body[2..4].copy_from_slice(&((HEADER_LEN + 48) as u16).to_le_bytes());
                        body[4..8].copy_from_slice(&(data.len() as u32).to_le_bytes());
                        body[8..16].copy_from_slice(&offset.to_le_bytes());
                        body[16..24].copy_from_slice(&self.file_id.persistent.to_le_bytes());
                        body[24..32].copy_from_slice(&self.file_id.volatile.to_le_bytes());
                        body.extend_from_slice(&data);
                        let charge = len.div_ceil(65536).max(1) as u16;
                        Some(self.charged(Command::WRITE, charge, charge, &body))
                    }
                    None => Some(self.close()),
                }
            }
            (Step::Read, Command::READ) | (Step::Read, Command::ECHO | Command::WRITE) => {
                if h.command == Command::READ {
                    assert_eq!(h.status, 0, "a READ within the file failed");
                    let r = ReadResponse::parse(&m[HEADER_LEN..]).unwrap();
                    let at = usize::from(r.data_offset);
                    self.data
                        .extend_from_slice(&m[at..at + r.data_length as usize]);
                    self.offset += u64::from(r.data_length);
                    self.reads += 1;
                    if self.echo_after == Some(self.reads) {
                        self.echo_after = None;
                        return Some(self.request(Command::ECHO, 1, &[4, 0, 0, 0]));
                    }
                    if self.write_after == Some(self.reads) {
                        self.write_after = None;
                        let mut body = vec![0; 49];
                        body[0] = 49;
                        return Some(self.request(Command::WRITE, 1, &body));
                    }
                }
                if self.offset >= self.end_of_file || self.read_enough() {
                    return Some(self.close());
                }
                Some(self.read_request())
            }
            (Step::Query, Command::QUERY_INFO) => {
                let query = self.queries[self.query_at];
                let mut expect = vec![query.info_type, query.file_info_class];
                expect.extend_from_slice(&self.end_of_file.to_le_bytes());
                expect.extend_from_slice(&self.file_id.volatile.to_le_bytes());
                if h.status != 0 || m.get(HEADER_LEN + 8..) != Some(&expect[..]) {
                    self.violations
                        .push(format!("QUERY_INFO {}: {:#x}", self.query_at, h.status));
                }
                self.query_at += 1;
                self.after_create(now)
            }
            (Step::Closing, Command::CLOSE) => {
                if h.status != 0 || m.len() != HEADER_LEN + 60 {
                    self.violations.push(format!("CLOSE: {:#x}", h.status));
                }
                if self.opened < self.files {
                    self.step = Step::Create;
                    return Some(self.create());
                }
                self.step = Step::Done;
                self.finished_at = Some(now);
                None
            }
            (Step::Done, _) => None,
            (step, command) => {
                self.violations
                    .push(format!("unexpected answer {command:?} in {step:?}"));
                None
            }
        }
    }
}

/// Frames `payload` as Direct TCP does.
pub fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = crate::wire::framing::frame_header(payload.len())
        .unwrap()
        .to_vec();
    out.extend_from_slice(payload);
    out
}

/// Cuts `bytes` into pieces of pseudo-random sizes (as TCP segments and reads would).
pub fn pieces(bytes: &[u8], seed: &mut u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let n = match *seed >> 61 {
            0 => 1,
            1 => 3,
            2 => 100,
            _ => 70_000,
        }
        .min(rest.len());
        out.push(rest[..n].to_vec());
        rest = &rest[n..];
    }
    out
}

/// A client that will read a file of `len` bytes in READs of `read_len`, and its server.
pub fn parties(len: usize, read_len: u32) -> (Client, Server) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let file: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let server = Server {
        file,
        sizes: Vec::new(),
        opens: HashMap::new(),
        creates: 0,
        async_reads: false,
        window_end: 1,
        used: BTreeSet::new(),
        violations: Vec::new(),
        next_async: 0,
        lease: None,
        directories: Vec::new(),
        directory_ids: BTreeSet::new(),
    };
    let client = Client {
        read_len,
        window_end: 1,
        next_id: 0,
        step: Step::Negotiate,
        offset: 0,
        end_of_file: 0,
        data: Vec::new(),
        reads: 0,
        echo_after: None,
        write_after: None,
        setup_credits: 64,
        trim_last: false,
        read_limit: None,
        script: None,
        scripted_read: None,
        violations: Vec::new(),
        last_id: 0,
        depth: 1,
        outstanding: BTreeMap::new(),
        finished_at: None,
        files: 1,
        opened: 0,
        file_id: FILE,
        queries: Vec::new(),
        query_files: usize::MAX,
        query_at: 0,
        share_access: 1,
        names: Vec::new(),
        think_us: 0,
        pause: None,
        directory: false,
    };
    (client, server)
}
