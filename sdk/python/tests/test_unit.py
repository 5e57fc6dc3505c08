"""Unit tests of the client's logic that need no server."""
import ast
import base64
import io
import json
import pathlib
import unittest

import kiln
from kiln import _sse, errors, tools


class SpecTest(unittest.TestCase):
    def test_to_dict(self):
        s = kiln.Spec(code="print(1)", stdin="x", files={"a.txt": "hi", "b.bin": b"\x00\xff"},
                      limits=kiln.Limits(timeout_ms=5000), cache=False, env={"A": "1"}, args=["-v"])
        d = s.to_dict()
        self.assertEqual(d["files"][0], {"name": "a.txt", "content": "hi"})
        self.assertEqual(d["files"][1], {"name": "b.bin", "content": base64.b64encode(b"\x00\xff").decode(),
                                         "encoding": "base64"})
        self.assertEqual(d["limits"], {"timeout_ms": 5000})
        self.assertIs(d["cache"], False)
        self.assertEqual(kiln.Spec(code="x").to_dict(), {"code": "x"})
        self.assertEqual(kiln.Spec(code="x", budget="bud_1").to_dict(), {"code": "x", "budget": "bud_1"})
        self.assertEqual(kiln.Spec(code="x", network=["api.example.org", "*.data.gov:443"]).to_dict(),
                         {"code": "x", "network": {"allow": ["api.example.org", "*.data.gov:443"]}})
        self.assertEqual(kiln.Spec(code="x", network=[]).to_dict(), {"code": "x"})
        with self.assertRaises(TypeError):
            kiln.Spec(code="x", network="api.example.org").to_dict()

    def test_result_from_dict(self):
        r = kiln.Result.from_dict({"id": "j", "status": "failed", "exit_code": 1,
                                   "error": {"category": "syntax_error", "message": "m", "retryable": False},
                                   "artifacts": [{"name": "a.png", "size": 3, "sha256": "ab", "content_type": "image/png"}],
                                   "stdout_base64": base64.b64encode(b"\xff").decode(), "future_field": 1})
        self.assertTrue(r.done)
        self.assertFalse(r.ok)
        self.assertTrue(r.error.fixable)
        self.assertEqual(r.artifacts[0].content_type, "image/png")
        self.assertEqual(r.stdout_bytes_exact, b"\xff")
        self.assertEqual(r.raw["future_field"], 1)
        self.assertFalse(kiln.Result.from_dict({"id": "j", "status": "running"}).done)
        egress = {"connections": 1, "refused": 0, "bytes_up": 10, "bytes_down": 20,
                  "records": [{"host": "api.example.org", "port": 443, "allowed": True}]}
        self.assertEqual(kiln.Result.from_dict({"id": "j", "status": "succeeded", "egress": egress}).egress, egress)
        self.assertIsNone(r.egress)


class ErrorMappingTest(unittest.TestCase):
    def test_problem_types(self):
        cases = {
            ("invalid-field", 422): kiln.InvalidRequest,
            ("body-too-large", 413): kiln.PayloadTooLarge,
            ("unauthorized", 401): kiln.Unauthorized,
            ("not-found", 404): kiln.NotFound,
            ("method-not-allowed", 405): kiln.MethodNotAllowed,
            ("idempotency-key-reused", 422): kiln.Conflict,
            ("budget-exhausted", 409): kiln.BudgetExhausted,
            ("egress-not-allowed", 422): kiln.EgressNotAllowed,
            ("queue-full", 429): kiln.QueueFull,
            ("unavailable", 503): kiln.Unavailable,
            ("internal", 500): kiln.ServerError,
        }
        for (t, status), cls in cases.items():
            e = errors.from_problem(status, {"type": "urn:kiln:problem:" + t, "title": "T", "detail": "D", "field": "f"}, 2.0)
            self.assertIs(type(e), cls, t)
            self.assertIsInstance(e, kiln.KilnError)
            self.assertEqual((e.status, e.field, e.retry_after), (status, "f", 2.0))
        self.assertTrue(errors.from_problem(429, {"type": "urn:kiln:problem:queue-full"}, 1).temporary)
        self.assertIsInstance(errors.from_problem(429, {"type": "urn:kiln:problem:queue-full"}, 1), kiln.RateLimited)
        self.assertFalse(errors.from_problem(422, {}, None).temporary)
        self.assertFalse(errors.from_problem(409, {"type": "urn:kiln:problem:budget-exhausted"}, None).temporary)
        egress = errors.from_problem(422, {"type": "urn:kiln:problem:egress-not-allowed"}, None)
        self.assertIsInstance(egress, kiln.InvalidRequest)
        self.assertFalse(egress.temporary)
        # Unknown types fall back on the status.
        self.assertIs(type(errors.from_problem(429, {"type": "urn:other"}, None)), kiln.RateLimited)
        self.assertIs(type(errors.from_problem(502, {}, None)), kiln.ServerError)


class SSETest(unittest.TestCase):
    def parse(self, text):
        return list(_sse.parse(io.BytesIO(text.encode()).readline))

    def test_events(self):
        evs = self.parse(
            ": keep-alive\n\n"
            "id: 1\nevent: status\ndata: {\"status\": \"running\", \"worker\": \"w\"}\n\n"
            "id: 2\r\nevent: stdout\r\ndata: {\"data\": \"a\\n\"}\r\n\r\n"
            "event: stderr\ndata: {\"data_base64\": \"/w==\"}\n\n"
            "id: 3\nevent: output_skipped\ndata: {\"stream\": \"stdout\", \"bytes\": 3145728}\n\n"
            "id: 4\nevent: result\ndata: {\"id\": \"j\",\ndata:  \"status\": \"succeeded\"}\n\n"
            "event: partial\ndata: {}\n")
        self.assertEqual([e.type for e in evs], ["status", "stdout", "stderr", "output_skipped", "result"])
        self.assertEqual(evs[0].status, "running")
        self.assertEqual(evs[1].text, "a\n")
        self.assertEqual(evs[1].id, "2")
        self.assertEqual(evs[2].raw_bytes, b"\xff")
        self.assertEqual(evs[2].id, "2")  # the last event id carries over
        self.assertEqual(evs[3].skipped, 3145728)
        self.assertEqual(evs[1].skipped, 0)
        self.assertEqual(evs[4].result.status, "succeeded")


class ToolsTest(unittest.TestCase):
    def test_definitions(self):
        a = tools.tool_definition("anthropic")
        self.assertEqual(a["name"], "run_python")
        self.assertEqual(a["input_schema"]["required"], ["code"])
        o = tools.tool_definition("openai")
        self.assertEqual(o["type"], "function")
        self.assertEqual(o["function"]["parameters"]["properties"]["timeout_s"]["maximum"], 300)
        r = tools.tool_definition("openai-responses")
        self.assertEqual((r["type"], r["name"], r["strict"]), ("function", "run_python", False))
        with self.assertRaises(ValueError):
            tools.tool_definition("other")

    def test_server_call_sends_the_call_as_it_is(self):
        # Every format goes to POST /v1/tool-calls unchanged (the runtime may rename the tool),
        # so the server's answer is the block to return.
        fc = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "run_python", "arguments": "{\"code\": \"1\"}"}
        self.assertEqual(tools.server_call(fc), (fc, "openai-responses", "call_1"))
        body, fmt, call_id = tools.server_call(fc, runtime="python-slim")
        self.assertEqual((body["name"], body["arguments"], fmt, call_id), ("run_python_slim", fc["arguments"], "openai-responses", "call_1"))
        tu = {"type": "tool_use", "id": "t", "name": "run_python", "input": {"code": "1"}}
        self.assertEqual(tools.server_call(tu), (tu, "anthropic", "t"))

    def test_parse(self):
        a = tools.parse_tool_call({"type": "tool_use", "id": "toolu_1", "name": "run_python",
                                   "input": {"code": "print(1)", "timeout_s": 2, "files": [{"name": "x", "content": "y"}]}})
        self.assertEqual((a.format, a.call_id, a.spec.runtime), ("anthropic", "toolu_1", "python"))
        self.assertEqual(a.spec.to_dict()["limits"], {"timeout_ms": 2000})
        o = tools.parse_tool_call({"id": "call_1", "type": "function",
                                   "function": {"name": "run_python", "arguments": json.dumps({"code": "print(2)", "stdin": "s"})}})
        self.assertEqual((o.format, o.call_id, o.spec.stdin), ("openai", "call_1", "s"))
        r = tools.parse_tool_call({"type": "function_call", "call_id": "c", "name": "run_python", "arguments": "{\"code\": \"1\"}"})
        self.assertEqual(r.format, "openai-responses")
        for bad in ({"id": "c", "function": {"name": "run_python", "arguments": "{"}},
                    {"type": "tool_use", "id": "t", "name": "run_python", "input": {"code": ""}},
                    {"type": "tool_use", "id": "t", "name": "run_python", "input": {"code": "x", "timeout_s": -1}},
                    {"nothing": 1}):
            with self.assertRaises(tools.ToolCallError):
                tools.parse_tool_call(bad)

    def test_results(self):
        res = kiln.Result.from_dict({"id": "j1", "status": "failed", "exit_code": 1, "stderr": "SyntaxError",
                                     "error": {"category": "syntax_error", "message": "bad", "retryable": False},
                                     "artifacts": [{"name": "p.png", "size": 1, "sha256": "s", "content_type": "image/png"}]})
        a = tools.tool_result(res, "toolu_1", "anthropic", base_url="http://k")
        self.assertEqual((a["type"], a["tool_use_id"], a["is_error"]), ("tool_result", "toolu_1", True))
        body = json.loads(a["content"][0]["text"])
        self.assertEqual(body["error"]["category"], "syntax_error")
        self.assertTrue(body["error"]["fix_code_and_retry"])
        self.assertEqual(body["artifacts"][0]["url"], "http://k/v1/jobs/j1/artifacts/p.png")
        o = tools.tool_result(res, "call_1", "openai")
        self.assertEqual((o["role"], o["tool_call_id"]), ("tool", "call_1"))
        self.assertTrue(json.loads(o["content"])["is_error"])
        ok = tools.tool_result(kiln.Result.from_dict({"id": "j", "status": "succeeded", "exit_code": 0, "stdout": "1\n"}), "t")
        self.assertFalse(ok["is_error"])
        internal = kiln.Result.from_dict({"status": "internal_error", "error": {"category": "internal", "retryable": True}})
        body = json.loads(tools.tool_result(internal, "t")["content"][0]["text"])
        self.assertEqual((body["error"]["retryable"], body["error"]["fix_code_and_retry"]), (True, False))


class CompatibilityTest(unittest.TestCase):
    def test_sources_parse_as_python_39(self):
        root = pathlib.Path(kiln.__file__).parent
        for f in sorted(root.glob("*.py")):
            ast.parse(f.read_text(), filename=str(f), feature_version=(3, 9))


if __name__ == "__main__":
    unittest.main()


class SchemaTest(unittest.TestCase):
    """The hand-written types are views of the generated wire types (kiln/_schema.py,
    made from the API's OpenAPI document): a field the document does not have is a
    drift, and so is a problem type whose class the SDK lacks."""

    def keys(self, *schemas):
        from kiln import _schema
        out = set()
        for name in schemas:
            out |= set(getattr(_schema, name).__annotations__)
        return out

    def test_dataclass_fields_are_the_documents(self):
        import dataclasses
        from kiln import sessions, types
        for cls, schemas, own in [
            (types.Result, ("Result", "Accepted"), {"accepted", "raw"}),
            (types.JobSummary, ("JobSummary",), {"raw"}),
            (types.Spec, ("Spec",), set()),
            (types.Limits, ("Limits",), set()),
            (types.Failure, ("Failure",), set()),
            (types.Artifact, ("Artifact",), set()),
            (sessions.CallResult, ("CallResult", "Result", "Accepted"), {"accepted", "raw"}),
            (sessions.Session, ("Session",), {"raw", "_client"}),
        ]:
            fields = {f.name for f in dataclasses.fields(cls)} - own
            extra = fields - self.keys(*schemas)
            self.assertFalse(extra, f"{cls.__name__} has fields the document's {schemas} lack: {sorted(extra)}")

    def test_every_problem_type_has_its_class(self):
        from kiln import _schema
        for t in _schema.PROBLEM_TYPES:
            cls = errors.error_class(400, t)
            self.assertEqual(cls.__name__, _schema.ERROR_CLASS_BY_TYPE[t[len(_schema.PROBLEM_PREFIX):]], t)
            self.assertTrue(issubclass(cls, errors.KilnError))
        self.assertIs(errors.error_class(429, "urn:kiln:problem:quota-exceeded:sessions"), errors.QuotaExceeded)
        self.assertIs(errors.error_class(410), errors.SessionEnded)

    def test_terminal_statuses_are_the_documents(self):
        from kiln import _schema
        self.assertEqual(kiln.TERMINAL_STATUSES, frozenset(_schema.TERMINAL_STATUSES))
        self.assertEqual(set(_schema.STATUSES), set(_schema.TERMINAL_STATUSES) | set(_schema.PENDING_STATUSES))

    def test_list_and_metadata(self):
        self.assertEqual(kiln.Spec(code="x", metadata={"team": "a"}).to_dict(), {"code": "x", "metadata": {"team": "a"}})
        p = kiln.JobSummary.from_dict({"id": "j", "status": "failed", "runtime": "python", "exit_code": 3,
                                       "metadata": {"team": "a"}, "error": {"category": "runtime_error", "message": "m",
                                                                            "retryable": False}})
        self.assertEqual((p.exit_code, p.metadata, p.error.category), (3, {"team": "a"}, "runtime_error"))
