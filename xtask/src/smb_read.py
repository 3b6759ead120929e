"""The SMB benchmark's client (`cargo xtask bench --smb-file-mib` / `--smb-files`): reads
files from a share keeping exactly one READ outstanding, as smbprotocol's low-level API
issues them (a file client that waits for each answer before asking for the next), one
file after another (CREATE, READs, CLOSE), and prints one JSON line: bytes read, the
SHA-256 of all of them in order, setup and read times, files, READ count, the time spent in
READs and the slowest READ.

With --compound, each file is opened as Windows opens one: its CREATE and a QUERY_INFO
(FileStandardInformation) of the handle it makes in one compound request (related
operations), then READs and CLOSE. With --share-write, each is opened letting others
write it (as Samba's smbclient opens files); with --lease, each CREATE asks for a lease
that caches reads and handles (as Windows asks), and the JSON line has the lease state
the server granted for each file ("lease_states").

Usage: smb_read.py [--compound] [--share-write] [--lease] SERVER SHARE READ_BYTES
DIALECT_HEX USER PASSWORD FILE...
"""

import hashlib
import json
import sys
import time
import uuid

from smbprotocol.connection import Connection
from smbprotocol.create_contexts import (
    CreateContextName,
    SMB2CreateContextRequest,
    SMB2CreateRequestLease,
    SMB2CreateResponseLease,
    SMB2CreateResponseLeaseV2,
)
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    RequestedOplockLevel,
    ShareAccess,
    SMB2QueryInfoRequest,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

args = sys.argv[1:]
flags = set()
while args and args[0].startswith("--"):
    flags.add(args.pop(0))
compound = "--compound" in flags
share_write = "--share-write" in flags
lease = "--lease" in flags
server, share, read_bytes, dialect, user, password = args[:6]
names = args[6:]
read_bytes = int(read_bytes)
start = time.monotonic()
connection = Connection(uuid.uuid4(), server, 445, require_signing=False)
connection.connect(dialect=int(dialect, 16), timeout=60)
session = Session(connection, user, password, require_encryption=False)
session.connect()
tree = TreeConnect(session, rf"\\{server}\{share}")
# smbprotocol validates the negotiation with an FSCTL_VALIDATE_NEGOTIATE_INFO after the
# tree connect, even on 2.x where the dialect does not define it, and that exchange is
# signed: the session would be a signed one for the gateways. pysmb, the other client
# that keeps one READ outstanding, sends no such request; neither does this.
tree.connect(require_secure_negotiate=False)
opened = time.monotonic()
digest = hashlib.sha256()
offset_total = 0
reads = 0
reading = 0.0
slowest = 0.0
lease_states = []


def lease_request():
    """A create context asking for a lease that caches reads and handles."""
    request = SMB2CreateRequestLease()
    request["lease_key"] = uuid.uuid4().bytes
    request["lease_state"] = 0x01 | 0x02  # SMB2_LEASE_READ_CACHING | HANDLE_CACHING
    context = SMB2CreateContextRequest()
    context["buffer_name"] = CreateContextName.SMB2_CREATE_REQUEST_LEASE
    context["buffer_data"] = request
    return context


for name in names:
    handle = Open(tree, name)
    share = ShareAccess.FILE_SHARE_READ
    if share_write:
        share |= ShareAccess.FILE_SHARE_WRITE
    create = (
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.GENERIC_READ,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        share,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
    )
    if compound:
        request, receive_create = handle.create(*create, send=False)
        query = SMB2QueryInfoRequest()
        query["info_type"] = 1  # SMB2_0_INFO_FILE
        query["file_info_class"] = 5  # FileStandardInformation
        query["output_buffer_length"] = 24
        query["file_id"] = b"\xff" * 16  # the handle the CREATE before it makes
        sent = connection.send_compound(
            [request, query], session.session_id, tree.tree_connect_id, related=True
        )
        receive_create(sent[0])
        connection.receive(sent[1])
    elif lease:
        contexts = handle.create(
            *create,
            create_contexts=[lease_request()],
            oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
        )
        granted = [
            c["lease_state"].get_value()
            for c in contexts or []
            if isinstance(c, (SMB2CreateResponseLease, SMB2CreateResponseLeaseV2))
        ]
        lease_states.append(granted[0] if granted else None)
    else:
        handle.create(*create)
    size = handle.end_of_file
    offset = 0
    while offset < size:
        asked = time.monotonic()
        data = handle.read(offset, min(read_bytes, size - offset))
        took = time.monotonic() - asked
        reading += took
        slowest = max(slowest, took)
        digest.update(data)
        offset += len(data)
        reads += 1
    handle.close()
    offset_total += offset
done = time.monotonic()
tree.disconnect()
session.disconnect()
connection.disconnect()
print(
    json.dumps(
        {
            "bytes": offset_total,
            "sha256": digest.hexdigest(),
            "setup_s": opened - start,
            "read_s": done - opened,
            "files": len(names),
            "reads": reads,
            "reads_s": reading,
            "slowest_read_s": slowest,
            "signing": bool(session.signing_required),
            "lease_states": lease_states,
        }
    )
)
