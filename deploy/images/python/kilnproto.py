"""Kiln's launcher protocol as the Python launchers read it: the job frame,
a box's job header and parameters, the exit code of a launcher's own
failure. The worker's side is sandbox/initproto; the vectors both sides'
tests read are in sandbox/initproto/testdata.

    frame:       "KILN/<major>.<minor> <n>\\n" then n bytes of JSON:
                 {"code": str, "args": [str], "env": {str: str},
                  "files": [{"name": str, "data": base64}], "cpu_s": int}
                 (the job's stdin follows on the same descriptor)
    box header:  the same first line, space-padded to HEADER_SIZE bytes,
                 newline last, then n bytes of the box parameters (JSON,
                 with "v": "<major>.<minor>")

A header, or box parameters, of another major version is refused: the
image and the worker are of different releases, and what one sends the
other may not do (a box launcher of major 1 makes no user namespace per
job). A newer minor of the same major is read: it adds only what this
launcher may ignore.

Every refusal is a ProtocolError; a launcher turns it into fail(): a
"kiln-launcher:" line on stderr and exit code LAUNCH_ERROR, the platform's
fault and never the program's.

Only what every job needs is imported here: each import is start-up time
paid by every job of a container of its own.
"""

import os

PROTOCOL_MAJOR = 2
PROTOCOL_MINOR = 0
PROTOCOL = "%d.%d" % (PROTOCOL_MAJOR, PROTOCOL_MINOR)
MAGIC = b"KILN/"
LAUNCH_ERROR = 125
MAX_HEADER = 64
MAX_FRAME = 64 << 20
# A box's job header on its control socket (initproto.BoxHeaderSize).
HEADER_SIZE = 32


class ProtocolError(Exception):
    """What the worker sent is not what this launcher reads."""


def fail(msg):
    """Ends the launcher as the platform's fault."""
    os.write(2, ("kiln-launcher: " + msg + "\n").encode("utf-8", "replace"))
    os._exit(LAUNCH_ERROR)


def check_version(version):
    """Refuses a protocol version of another major than this launcher's."""
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != PROTOCOL_MAJOR:
        raise ProtocolError(
            "the worker speaks launcher protocol %s, this launcher %s: the image and the worker are of "
            "different releases (rebuild the image, or run a worker of the image's release)" % (version or "(none)", PROTOCOL)
        )


def parse_header(line):
    """The length a header line (without its newline) announces."""
    if not line.startswith(MAGIC):
        raise ProtocolError("job header does not start with %s" % MAGIC.decode())
    version, _, length = line[len(MAGIC) :].partition(b" ")
    check_version(version.decode("ascii", "replace"))
    length = length.rstrip(b" ")
    if not length.isdigit():
        raise ProtocolError("job header has no valid length")
    n = int(length)
    if n > MAX_FRAME:
        raise ProtocolError("job frame length %d is out of range" % n)
    return n


def read_header(fd):
    """Reads a frame's header line from fd and returns the length it
    announces. Byte by byte: reading further would eat the start of the
    job's stdin."""
    line = bytearray()
    while True:
        b = os.read(fd, 1)
        if not b:
            raise ProtocolError("stdin closed before a job header arrived")
        if b == b"\n":
            return parse_header(bytes(line))
        line += b
        if len(line) > MAX_HEADER:
            raise ProtocolError("job header is too long")


def read_exact(fd, n):
    chunks = []
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise ProtocolError("stdin closed before the job frame was complete")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_frame(fd):
    """A session call's frame from descriptor fd, which it closes, as
    (code, args, env, files); fail() for one it cannot read."""
    try:
        try:
            code, args, env, files, _ = decode_job(read_exact(fd, read_header(fd)))
        finally:
            os.close(fd)
    except ProtocolError as e:
        fail(str(e))
    return code, args, env, files


def recv_session_call(sock):
    """A session's next call from its zygote over sock, as (token,
    descriptors: stdin, stdout, stderr, frame, and the output channel when
    there is one). The process ends when the zygote closes sock."""
    import socket  # sessions only: no job's start pays for it

    try:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 5)
    except OSError:
        os._exit(0)
    if not msg:
        os._exit(0)
    if len(fds) not in (4, 5):
        fail("session: a call without its four descriptors")
    return msg[1:].decode("ascii", "replace"), fds


class _JSONContext:
    """What the C JSON scanner reads from json.JSONDecoder. Using _json
    directly skips importing json.decoder, which compiles regular
    expressions at import: ~8 ms of every job's start for one parse."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        raise ValueError("JSON constant %s is not allowed" % name)


def parse_json(raw):
    text = raw.decode("utf-8")
    try:
        import _json

        scan = _json.make_scanner(_JSONContext)
    except (ImportError, AttributeError):
        import json

        return json.loads(text)
    try:
        obj, end = scan(text, 0)
    except StopIteration:
        raise ValueError("not a JSON document") from None
    except Exception as e:  # the C scanner's own decode errors
        raise ValueError("JSON: %s" % e) from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError("trailing data after the JSON document")
    return obj


def decode_job(raw):
    """The frame's JSON as (code, args, env, files, cpu_s); files are
    (name, bytes) pairs."""
    import binascii

    try:
        job = parse_json(raw)
        if not isinstance(job, dict):
            raise ValueError("the frame is not a JSON object")
        code = job["code"]
        args = [str(a) for a in job.get("args") or []]
        env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
        files = [(f["name"], binascii.a2b_base64((f.get("data") or "").encode("ascii"), strict_mode=True)) for f in job.get("files") or []]
        cpu_s = int(job.get("cpu_s") or 0)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
        raise ProtocolError("job frame is not valid: %s" % e) from None
    if not isinstance(code, str):
        raise ProtocolError("job frame: code is not a string")
    return code, args, env, files, cpu_s


def parse_box_header(head):
    """The length a box's HEADER_SIZE-byte job header announces."""
    if len(head) != HEADER_SIZE or not head.endswith(b"\n"):
        raise ProtocolError("a job header of %d bytes without its newline; want %d" % (len(head), HEADER_SIZE))
    return parse_header(head[:-1])


def decode_box_params(raw):
    """The box parameters of a job's sandbox, checked: this launcher's
    protocol, a uid that is not root, a work dir that is a name, a size
    for /tmp."""
    try:
        p = parse_json(raw)
    except ValueError as e:
        raise ProtocolError("box parameters are not valid: %s" % e) from None
    if not isinstance(p, dict):
        raise ProtocolError("box parameters are not a JSON object")
    v = p.get("v")
    check_version(v if isinstance(v, str) else "")
    uid, work, tmp_mb = p.get("uid"), p.get("work"), p.get("tmp_mb")
    if not isinstance(uid, int) or isinstance(uid, bool) or uid <= 0:
        raise ProtocolError("box parameters: uid %r; a job never runs as root of the box" % (uid,))
    if not isinstance(work, str) or not work or "/" in work or work in (".", ".."):
        raise ProtocolError("box parameters: work %r is not a name" % (work,))
    if not isinstance(tmp_mb, int) or isinstance(tmp_mb, bool) or tmp_mb <= 0:
        raise ProtocolError("box parameters: tmp_mb %r; want a size" % (tmp_mb,))
    for k in ("cpu_s", "fsize", "nofile", "egress_port"):
        if not isinstance(p.get(k, 0), int) or p.get(k, 0) < 0:
            raise ProtocolError("box parameters: %s %r" % (k, p.get(k)))
    for k in ("rmem", "wmem"):
        if not isinstance(p.get(k, ""), str):
            raise ProtocolError("box parameters: %s %r" % (k, p.get(k)))
    return p
