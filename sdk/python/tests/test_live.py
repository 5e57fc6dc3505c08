"""The Python SDK against a live Kiln: API, JetStream, worker, containerd, Redis.

Run by internal/e2e's TestSDKs, which starts the pipeline and exports
KILN_SERVER, KILN_API_KEY and KILN_TEST_CONTROL.
"""
import asyncio
import base64
import hashlib
import json
import os
import tempfile
import threading
import time
import unittest

import kiln
from kiln import tools

from . import live


class LiveTest(unittest.TestCase):
    def setUp(self):
        self.c = live.client(self)

    def test_run_submit_get(self):
        r = self.c.run(live.unique() + "import sys\nprint(6*7)\nsys.stdin.read()", stdin="x", timeout=60)
        self.assertEqual((r.status, r.exit_code, r.stdout), ("succeeded", 0, "42\n"))
        self.assertTrue(r.ok and r.done)
        self.assertTrue(r.image.digest.startswith("sha256:"))
        again = self.c.submit(live.unique() + "print(1)")
        self.assertTrue(again.accepted)
        self.assertEqual(again.status, "queued")
        got = self.c.wait(again.id, timeout=60)
        self.assertEqual(got.stdout, "1\n")
        self.assertEqual(self.c.get(again.id).status, "succeeded")

    def test_files_and_failure_categories(self):
        r = self.c.run(live.unique() + "print(open('in.bin','rb').read().hex(), open('t.txt').read())",
                       files={"in.bin": b"\x00\xff", "t.txt": "hi"}, timeout=60)
        self.assertEqual(r.stdout, "00ff hi\n")
        bad = self.c.run(live.unique() + "print(", timeout=60)
        self.assertEqual((bad.status, bad.error.category, bad.error.fixable, bad.error.retryable),
                         ("failed", "syntax_error", True, False))
        slow = self.c.run(live.unique() + "import time\ntime.sleep(10)", limits=kiln.Limits(timeout_ms=1000), timeout=60)
        self.assertEqual((slow.status, slow.error.category), ("timed_out", "timeout"))

    def test_session_keeps_state(self):
        with self.c.session(files={"seed.txt": "seeded"}) as s:
            self.assertEqual(s.status, "ready")
            a = s.run("x = 41\nopen('out.txt', 'w').write('kept')\nprint(open('seed.txt').read())")
            self.assertEqual((a.status, a.stdout, a.seq, a.incarnation, a.state_restored),
                             ("succeeded", "seeded\n", 1, 1, True))
            b = s.run("print(x + 1)")
            self.assertEqual((b.stdout, b.seq), ("42\n", 2))
            self.assertEqual(s.read_file("out.txt"), b"kept")
            other = self.c.get_session(s.id)
            self.assertEqual(other.id, s.id)
        self.assertEqual(s.status, "ended")
        with self.assertRaises(kiln.KilnError) as cm:
            s.run("print(x)")
        self.assertEqual(cm.exception.status, 410)

    def test_list_metadata_replay_audit(self):
        tag = live.unique().strip("# \n")[-12:]
        failed = self.c.run(live.unique() + "import sys; sys.exit(3)", metadata={"suite": tag}, cache=False, timeout=60)
        self.assertEqual((failed.status, failed.metadata), ("failed", {"suite": tag}))
        ok = self.c.run(live.unique() + "print(1)", metadata={"suite": tag, "n": "2"}, cache=False, timeout=60)
        page = self.c.list_jobs(tags={"suite": tag}, limit=1)
        self.assertEqual([j.id for j in page.jobs], [ok.id])
        self.assertTrue(page.next_cursor)
        rest = self.c.list_jobs(tags={"suite": tag}, cursor=page.next_cursor)
        self.assertEqual([j.id for j in rest.jobs], [failed.id])
        self.assertEqual(rest.jobs[0].exit_code, 3)
        self.assertEqual([j.id for j in self.c.list_jobs(status="failed", tags={"suite": tag}).jobs], [failed.id])
        self.assertEqual([j.id for j in self.c.iter_jobs(tags={"suite": tag}, limit=1)], [ok.id, failed.id])
        again = self.c.replay(ok.id)
        self.assertTrue(again.accepted)
        done = self.c.wait(again.id, timeout=60)
        self.assertEqual((done.replay_of, done.stdout), (ok.id, "1\n"))
        kinds = {r.get("kind") for r in self.c.audit(kind="replay")}
        self.assertEqual(kinds, {"replay"})
        with self.c.session(metadata={"suite": tag}) as s:
            self.assertEqual([x.id for x in self.c.sessions(tags={"suite": tag})], [s.id])
            self.assertEqual(s.metadata, {"suite": tag})
            self.assertEqual(self.c.sessions(tags={"suite": tag + "-other"}), [])

    def test_session_env(self):
        with self.c.session(env={"GREETING": "session", "LEVEL": "session"}) as s:
            r = s.run("import os\nprint(os.environ['GREETING'], os.environ['LEVEL'])", env={"LEVEL": "call"})
            self.assertEqual(r.stdout, "session call\n")

    def test_idempotent_submit(self):
        code = live.unique() + "print('idem')"
        a = self.c.submit(code, idempotency_key="py-idem-" + code[6:20])
        b = self.c.submit(code, idempotency_key="py-idem-" + code[6:20])
        self.assertEqual(a.id, b.id)
        with self.assertRaises(kiln.Conflict) as cm:
            self.c.submit(code + "#other", idempotency_key="py-idem-" + code[6:20])
        self.assertEqual(cm.exception.field, "Idempotency-Key")
        self.c.wait(a.id, timeout=60)

    def test_batch_jobs_and_wait_all(self):
        items = self.c.batch([live.unique() + "print('a')", kiln.Spec(code=live.unique() + "print('b')"), {"code": ""}])
        self.assertEqual([i.index for i in items], [0, 1, 2])
        self.assertIsNotNone(items[0].job)
        self.assertIsInstance(items[2].error, kiln.InvalidRequest)
        self.assertEqual(items[2].error.field, "jobs[2].code")
        ids = [items[0].job.id, items[1].job.id]
        results = self.c.wait_all(ids, timeout=120)
        self.assertEqual([r.stdout for r in results], ["a\n", "b\n"])
        listed = self.c.jobs(ids + ["0190a5e4-7b1c-7d2e-8f3a-123456789abc"])
        self.assertEqual([j.id if j else None for j in listed], ids + [None])

    def test_cancel(self):
        running = self.c.submit(live.unique() + "import time\nprint('started', flush=True)\ntime.sleep(30)", cache=False)
        deadline = time.monotonic() + 60
        while self.c.get(running.id).status == "queued" and time.monotonic() < deadline:
            time.sleep(0.1)
        self.c.cancel(running.id)
        r = self.c.wait(running.id, timeout=60)
        self.assertEqual(r.status, "canceled")
        self.assertEqual(r.error.category, "canceled")

    def test_errors(self):
        with self.assertRaises(kiln.InvalidRequest) as cm:
            self.c.submit("print(1)", limits={"memory_mb": 1 << 20})
        self.assertEqual((cm.exception.status, cm.exception.field), (422, "limits.memory_mb"))
        with self.assertRaises(kiln.InvalidRequest) as cm:
            self.c.get("../etc/passwd")
        self.assertEqual(cm.exception.status, 400)
        with self.assertRaises(kiln.NotFound):
            self.c.get("0190a5e4-7b1c-7d2e-8f3a-123456789abc")
        with self.assertRaises(kiln.Unauthorized):
            kiln.Client(api_key="wrong").runtimes()
        with self.assertRaises(kiln.MethodNotAllowed):
            self.c._t.call("PUT", "/v1/jobs")
        with self.assertRaises(kiln.InvalidRequest):
            self.c.batch([{"code": "print(1)"}] * 101)
        self.assertEqual(sorted(r["name"] for r in self.c.runtimes()), ["node", "python"])


class OutageTest(unittest.TestCase):
    """Retries and waits across a NATS outage and an API restart (the harness's control endpoint)."""

    def setUp(self):
        self.c = live.client(self)
        live.require(self, "KILN_TEST_CONTROL")

    def test_submit_retries_through_a_queue_outage(self):
        live.control(self, "POST", "/nats/stop")
        try:
            with self.assertRaises(kiln.Unavailable) as cm:
                kiln.Client(retry=kiln.NO_RETRY).submit(live.unique() + "print(1)")
            self.assertGreater(cm.exception.retry_after, 0)
            threading.Timer(2.0, live.control, (self, "POST", "/nats/start")).start()
            key = "py-outage-" + live.unique()[6:30]
            code = live.unique() + "print('after outage')"
            r = self.c.submit(code, idempotency_key=key)  # 503s until NATS is back, then accepted
        finally:
            time.sleep(2.5)
            live.control(self, "POST", "/nats/start")
        self.assertEqual(self.c.submit(code, idempotency_key=key).id, r.id, "a retry created a second job")
        self.assertEqual(self.c.wait(r.id, timeout=90).stdout, "after outage\n")

    def test_wait_survives_an_api_restart(self):
        before = int(live.control(self, "GET", "/api/restarts"))
        job = self.c.submit(live.unique() + "import time\ntime.sleep(4)\nprint('survived')", cache=False)
        out = {}

        def waiter():
            try:
                out["r"] = self.c.wait(job.id, timeout=90)
            except Exception as e:  # reported below
                out["e"] = e

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(1.0)  # the wait is now a long-poll on the API
        live.control(self, "POST", "/api/restart?down=2s")
        with self.assertRaises(kiln.ConnectionFailed):
            kiln.Client(retry=kiln.NO_RETRY).get(job.id)
        t.join(120)
        self.assertNotIn("e", out, out.get("e"))
        self.assertEqual((out["r"].status, out["r"].stdout), ("succeeded", "survived\n"))
        self.assertGreater(int(live.control(self, "GET", "/api/restarts")), before)


class ToolsLiveTest(unittest.TestCase):
    def setUp(self):
        self.c = live.client(self)

    def test_anthropic_round_trip(self):
        block = {"type": "tool_use", "id": "toolu_01", "name": "run_python",
                 "input": {"code": live.unique() + "print(sum(range(10)))"}}
        out = self.c.run_tool_call(block, timeout=60)
        self.assertEqual((out["type"], out["tool_use_id"], out["is_error"]), ("tool_result", "toolu_01", False))
        self.assertIn("stdout:\n45\n", out["content"][0]["text"])
        bad = self.c.run_tool_call({**block, "input": {"code": live.unique() + "def f(:\n"}}, timeout=60)
        self.assertTrue(bad["is_error"])
        text = bad["content"][0]["text"]
        for want in ("error_category: syntax_error", "retry_with_changed_code_can_help: yes",
                     "retry_same_call_can_help: false", "exception_type: SyntaxError"):
            self.assertIn(want, text)

    def test_chart_is_the_servers_block(self):
        # The helper returns what POST /v1/tool-calls returns: the chart as an image block.
        code = live.unique() + "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()\n"
        out = self.c.run_tool_call({"type": "tool_use", "id": "toolu_c", "name": "run_python", "input": {"code": code}},
                                   timeout=60)
        kinds = [b["type"] for b in out["content"]]
        self.assertEqual(kinds, ["text", "image"], out)
        self.assertEqual(out["content"][1]["source"]["media_type"], "image/png")
        self.assertIn("(image output-1, image/png)", out["content"][0]["text"])
        self.assertEqual(base64.b64decode(out["content"][1]["source"]["data"])[:8], b"\x89PNG\r\n\x1a\n")
        # The Responses API's function_call: the server's function_call_output, the chart
        # as an input_image.
        call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "run_python",
                "arguments": json.dumps({"code": code})}
        resp = self.c.run_tool_call(call, timeout=60)
        self.assertEqual((resp["type"], resp["call_id"]), ("function_call_output", "call_1"))
        self.assertEqual([p["type"] for p in resp["output"]], ["input_text", "input_image"], resp)
        self.assertIn("(image output-1, image/png)", resp["output"][0]["text"])
        prefix = "data:image/png;base64,"
        self.assertTrue(resp["output"][1]["image_url"].startswith(prefix))
        self.assertEqual(base64.b64decode(resp["output"][1]["image_url"][len(prefix):])[:8], b"\x89PNG\r\n\x1a\n")
        # Exactly what the server answers the same call (job ids aside: a cache hit has its own).
        for c in (call, {"type": "tool_use", "id": "toolu_c", "name": "run_python", "input": {"code": code}},
                  {"id": "call_2", "type": "function", "function": {"name": "run_python", "arguments": json.dumps({"code": code})}}):
            self.assertEqual(live.without_job_ids(self.c.run_tool_call(c, timeout=60)), live.without_job_ids(live.post_tool_call(self, c)))

    def test_openai_round_trip(self):
        call = {"id": "call_9", "type": "function",
                "function": {"name": "run_python", "arguments": json.dumps(
                    {"code": live.unique() + "import time\ntime.sleep(5)", "timeout_s": 1})}}
        out = self.c.run_tool_call(call, timeout=60)
        self.assertEqual((out["role"], out["tool_call_id"]), ("tool", "call_9"))
        self.assertIn("status: timed_out", out["content"])
        self.assertIn("error_category: timeout", out["content"])
        broken = self.c.run_tool_call({"id": "call_10", "type": "function",
                                       "function": {"name": "run_python", "arguments": "{not json"}})
        self.assertIn("error_category: invalid_request", broken["content"])


class AsyncTest(unittest.TestCase):
    def test_async_client(self):
        live.require(self, "KILN_SERVER")

        async def main():
            async with kiln.AsyncClient() as c:
                a, b = await asyncio.gather(c.run(live.unique() + "print('x')", timeout=60),
                                            c.run(live.unique() + "print('y')", timeout=60))
                sub = await c.submit(live.unique() + "print('z')")
                got = await c.wait(sub.id, timeout=60)
                with self.assertRaises(kiln.NotFound):
                    await c.get("0190a5e4-7b1c-7d2e-8f3a-123456789abc")
                return a.stdout, b.stdout, got.stdout

        self.assertEqual(asyncio.run(main()), ("x\n", "y\n", "z\n"))


OUTPUT_DIR_CODE = "import os\nout = os.environ.get('KILN_OUTPUT_DIR') or '/work/out'\nos.makedirs(out, exist_ok=True)\n"


class ArtifactsEventsTest(unittest.TestCase):
    """Artifacts and the event stream."""

    def setUp(self):
        self.c = live.client(self)

    def test_artifacts(self):
        png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
        r = self.c.run(live.unique() + OUTPUT_DIR_CODE +
                       f"open(os.path.join(out, 'chart.png'), 'wb').write({png!r})\n"
                       "open(os.path.join(out, 'clean.csv'), 'w').write('a,b\\n1,2\\n')\n", timeout=60)
        self.assertEqual(r.status, "succeeded", r.stderr)
        by_name = {a.name: a for a in r.artifacts}
        self.assertEqual(set(by_name), {"chart.png", "clean.csv"})
        chart = by_name["chart.png"]
        self.assertEqual((chart.size, chart.sha256, chart.content_type),
                         (len(png), hashlib.sha256(png).hexdigest(), "image/png"))
        self.assertEqual(self.c.artifact(r.id, chart), png)
        self.assertEqual(self.c.artifact(r.id, "clean.csv"), b"a,b\n1,2\n")  # checked against the ETag
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "chart.png")
            self.assertEqual(self.c.artifact(r.id, chart, p), p)
            with open(p, "rb") as f:
                self.assertEqual(f.read(), png)
            wrong = kiln.Artifact(name="chart.png", size=chart.size, sha256="0" * 64)
            with self.assertRaises(kiln.IntegrityError):
                self.c.artifact(r.id, wrong, os.path.join(d, "bad.png"))
            self.assertFalse(os.path.exists(os.path.join(d, "bad.png")))
        with self.assertRaises(kiln.NotFound):
            self.c.artifact(r.id, "missing.txt")
        tr = tools.tool_result(r, "toolu_a", base_url=self.c.server)
        arts = json.loads(tr["content"][0]["text"])["artifacts"]
        self.assertTrue(any(a["url"].endswith(f"/v1/jobs/{r.id}/artifacts/chart.png") for a in arts))

    def test_events_stream_and_resume_across_restart(self):
        job = self.c.submit(live.unique() + "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')",
                            cache=False)
        seen, texts, restarted = [], [], False
        first_at = end_at = None
        for ev in self.c.events(job.id, timeout=90):
            seen.append(ev)
            if ev.type == "stdout":
                texts.append(ev.text)
                if "first" in ev.text and first_at is None:
                    first_at = time.monotonic()
                    if os.environ.get("KILN_TEST_CONTROL") and ev.id is not None:
                        live.control(self, "POST", "/api/restart?down=1s")
                        restarted = True
            if ev.type == "result":
                end_at = time.monotonic()
        self.assertEqual(seen[-1].type, "result")
        self.assertEqual(seen[-1].result.status, "succeeded")
        self.assertEqual("".join(texts), "first\nsecond\n", "output lost or repeated across the reconnect" if restarted else "")
        self.assertIn("status", [e.type for e in seen])
        self.assertGreater(end_at - first_at, 1.5, "the first line was not streamed live")
        # A late client gets the retained output and the result at once.
        late = list(self.c.events(job.id, timeout=30))
        self.assertEqual(late[-1].type, "result")
        # Resuming after an event id skips what came before it.
        first = next((e for e in seen if e.type == "stdout" and e.id is not None), None)
        if first is None:
            self.fail("stdout events carry no id: Last-Event-ID cannot resume")
        resumed = list(self.c.events(job.id, last_event_id=first.id, timeout=30))
        self.assertNotIn("first\n", [e.text for e in resumed if e.type == "stdout"])
        self.assertEqual(resumed[-1].type, "result")


if __name__ == "__main__":
    unittest.main()
