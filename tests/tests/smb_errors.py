"""The SMB end-to-end test's error cases (tests/tests/smb.rs): one session of smbprotocol
(SMB 2.1, one request at a time) that reads files and runs into errors, in an order that
has the gateways' open-ahead learn the client first. Prints one JSON list: for each step
its name, and "ok" with the SHA-256 of what it read (or what it got) or "status" with the
NTSTATUS the server answered.

Usage: smb_errors.py SERVER SHARE USER PASSWORD
"""

import hashlib
import json
import sys
import uuid

from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
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

server, share, user, password = sys.argv[1:5]
connection = Connection(uuid.uuid4(), server, 445, require_signing=False)
connection.connect(dialect=0x0210, timeout=60)
session = Session(connection, user, password, require_encryption=False)
session.connect()
tree = TreeConnect(session, rf"\\{server}\{share}")
# As the benchmark's client: no (signed) VALIDATE_NEGOTIATE on 2.1.
tree.connect(require_secure_negotiate=False)


def opened(name, share_access=ShareAccess.FILE_SHARE_READ):
    handle = Open(tree, name)
    handle.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.GENERIC_READ,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        share_access,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
    )
    return handle


def read_whole(name):
    handle = opened(name)
    size, offset, digest = handle.end_of_file, 0, hashlib.sha256()
    while offset < size:
        data = handle.read(offset, min(65536, size - offset))
        digest.update(data)
        offset += len(data)
    handle.close()
    return digest.hexdigest()


def read_past_end(name):
    handle = opened(name)
    try:
        return hashlib.sha256(handle.read(handle.end_of_file + 10, 100)).hexdigest()
    finally:
        handle.close()


def shared_with_nobody(name):
    first = opened(name, share_access=0)
    try:
        return read_whole(name)
    finally:
        first.close()


results = []
steps = [
    ("read a", lambda: read_whole("a.bin")),
    ("read b", lambda: read_whole("b.bin")),
    ("open a file that is not there", lambda: read_whole("missing.bin")),
    ("read c", lambda: read_whole("c.bin")),
    ("read past the end", lambda: read_past_end("a.bin")),
    ("open a directory as a file", lambda: read_whole("dir")),
    ("read b again", lambda: read_whole("b.bin")),
    ("open a file another open shares with nobody", lambda: shared_with_nobody("c.bin")),
    ("read an empty file", lambda: read_whole("empty.bin")),
    ("read a again", lambda: read_whole("a.bin")),
]
for name, step in steps:
    try:
        results.append([name, "ok", step()])
    except SMBResponseException as e:
        results.append([name, "status", f"{e.status:#010x}"])
tree.disconnect()
session.disconnect()
connection.disconnect()
print(json.dumps(results))
