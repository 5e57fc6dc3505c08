"""Retry and wait logic against a scripted HTTP server (a fake for logic only; the live
suite covers the same paths against the real API)."""
import json
import socket
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kiln

FAST = kiln.RetryPolicy(initial_backoff=0.01, max_backoff=0.05, max_elapsed=10)


class Script:
    """Answers requests in order from a list of (status, headers, body)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        self.lock = threading.Lock()

    def next(self, handler):
        with self.lock:
            self.requests.append((handler.command, handler.path, dict(handler.headers)))
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def serve(script, port=0):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def handle_one(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            status, headers, body = script.next(self)
            if status == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_DELETE = handle_one

    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def problem(t, status):
    return {"type": "urn:kiln:problem:" + t, "title": t, "status": status, "detail": "d"}


QUEUED = {"id": "0190a5e4-7b1c-7d2e-8f3a-123456789abc", "status": "queued"}
DONE = {"id": QUEUED["id"], "status": "succeeded", "exit_code": 0, "stdout": "ok\n"}


class RetryTest(unittest.TestCase):
    def start(self, answers):
        script = Script(answers)
        srv = serve(script)
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        return script, kiln.Client(f"http://127.0.0.1:{srv.server_address[1]}", "", retry=FAST)

    def test_submit_retries_429_503_and_dropped_connections_with_one_key(self):
        script, c = self.start([
            (429, {"Retry-After": "1"}, problem("queue-full", 429)),
            (503, {"Retry-After": "0"}, problem("unavailable", 503)),
            ("drop", {}, None),
            (202, {}, QUEUED),
        ])
        t0 = time.monotonic()
        r = c.submit("print(1)")
        self.assertGreaterEqual(time.monotonic() - t0, 1.0, "Retry-After: 1 was not honoured")
        self.assertTrue(r.accepted)
        keys = {h.get("Idempotency-Key") for (_, _, h) in script.requests}
        self.assertEqual(len(script.requests), 4)
        self.assertEqual(len(keys), 1, "every retry must carry the same Idempotency-Key")
        self.assertTrue(next(iter(keys)))

    def test_submit_gives_up_with_the_last_error(self):
        _, c = self.start([(429, {"Retry-After": "0"}, problem("queue-full", 429))])
        c._t.retry = kiln.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.01)
        with self.assertRaises(kiln.QueueFull) as cm:
            c.submit("print(1)")
        self.assertEqual(cm.exception.retry_after, 0)

    def test_no_retry_of_client_errors(self):
        script, c = self.start([(422, {}, problem("invalid-field", 422))])
        with self.assertRaises(kiln.InvalidRequest):
            c.submit("print(1)")
        self.assertEqual(len(script.requests), 1)

    def test_an_answer_too_deep_to_decode_is_a_decode_error(self):
        # A result nested past Python's recursion limit (a server older than the
        # flattening of deep outputs, or anything else that sends one): the client
        # raises its own error, never RecursionError, and does not retry it.
        deep = b"[" * 100_000 + b"]" * 100_000
        body = b'{"id": "' + QUEUED["id"].encode() + b'", "status": "succeeded", "outputs": [' \
            b'{"type": "execute_result", "data": {"text/plain": "x", "application/json": ' + deep + b'}}]}'
        script, c = self.start([(200, {}, body)])
        with self.assertRaises(kiln.DecodeError) as cm:
            c.get(QUEUED["id"])
        self.assertIsInstance(cm.exception, kiln.KilnError)
        self.assertIn("RecursionError", str(cm.exception))
        self.assertEqual(len(script.requests), 1)
        _, c = self.start([(200, {}, b"{not json")])
        with self.assertRaises(kiln.DecodeError):
            c.get(QUEUED["id"])

    def test_batch_is_not_resent_after_a_dropped_connection(self):
        script, c = self.start([("drop", {}, None), (200, {}, {"jobs": []})])
        with self.assertRaises(kiln.ConnectionFailed):
            c.batch(["print(1)"])
        self.assertEqual(len(script.requests), 1)

    def test_connection_refused_is_retried(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = kiln.Client(f"http://127.0.0.1:{port}", "", retry=kiln.RetryPolicy(max_attempts=100, initial_backoff=0.01, max_backoff=0.05))
        script = Script([(202, {}, QUEUED)])
        started = []

        def later():
            time.sleep(0.3)
            srv = serve(script, port)
            started.append(srv)

        threading.Thread(target=later).start()
        r = c.submit("print(1)")
        self.assertEqual(r.id, QUEUED["id"])
        for srv in started:
            srv.shutdown()
            srv.server_close()

    def test_wait_survives_errors_and_times_out(self):
        script, c = self.start([("drop", {}, None), (503, {}, problem("unavailable", 503)), (200, {}, QUEUED),
                                (200, {}, DONE)])
        r = c.wait(QUEUED["id"], timeout=10)
        self.assertEqual(r.stdout, "ok\n")
        self.assertIn("wait=", script.requests[0][1])
        _, c2 = self.start([(200, {}, QUEUED)])
        c2.long_poll = 0.05
        with self.assertRaises(kiln.WaitTimeout) as cm:
            c2.wait(QUEUED["id"], timeout=0.3)
        self.assertEqual(cm.exception.job.status, "queued")


if __name__ == "__main__":
    unittest.main()
