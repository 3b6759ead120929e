"""The SMB benchmark's client (`cargo xtask bench --smb-file-mib`): reads one file from a
share keeping exactly one READ outstanding, as smbprotocol's low-level API issues them
(a file client that waits for each answer before asking for the next), and prints one JSON
line: bytes read, SHA-256, setup and read times, READ count and the slowest READ.

Usage: smb_read.py SERVER SHARE FILE READ_BYTES DIALECT_HEX USER PASSWORD
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

server, share, name, read_bytes, dialect, user, password = sys.argv[1:8]
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
opened = time.monotonic()
digest = hashlib.sha256()
offset = 0
reads = 0
slowest = 0.0
while offset < size:
    asked = time.monotonic()
    data = handle.read(offset, min(read_bytes, size - offset))
    slowest = max(slowest, time.monotonic() - asked)
    digest.update(data)
    offset += len(data)
    reads += 1
done = time.monotonic()
handle.close()
tree.disconnect()
session.disconnect()
connection.disconnect()
print(
    json.dumps(
        {
            "bytes": offset,
            "sha256": digest.hexdigest(),
            "setup_s": opened - start,
            "read_s": done - opened,
            "reads": reads,
            "slowest_read_s": slowest,
            "signing": bool(session.signing_required),
        }
    )
)
