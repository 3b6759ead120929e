"""The SMB benchmark's client (`cargo xtask bench --smb-file-mib` / `--smb-files`): reads
files from a share keeping exactly one READ outstanding, as smbprotocol's low-level API
issues them (a file client that waits for each answer before asking for the next), one
file after another (CREATE, READs, CLOSE), and prints one JSON line: bytes read, the
SHA-256 of all of them in order, setup and read times, files, READ count, the time spent in
READs and the slowest READ.

Usage: smb_read.py SERVER SHARE READ_BYTES DIALECT_HEX USER PASSWORD FILE...
"""

import hashlib
import json
import sys
import time
import uuid

from smbprotocol.connection import Connection
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    ShareAccess,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

server, share, read_bytes, dialect, user, password = sys.argv[1:7]
names = sys.argv[7:]
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
for name in names:
    handle = Open(tree, name)
    handle.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.GENERIC_READ,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        ShareAccess.FILE_SHARE_READ,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
    )
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
        }
    )
)
