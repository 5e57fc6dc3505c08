"""Helpers for the suites that run against a live Kiln API.

The API is given by $KILN_SERVER / $KILN_API_KEY; $KILN_TEST_CONTROL is the test
harness's control endpoint (internal/e2e/sdk_test.go) that restarts the API or
stops NATS. Without them a live test is skipped, or fails when
KILN_INTEGRATION=require.
"""
import json
import os
import re
import unittest
import urllib.request
import uuid

import kiln


def require(test: unittest.TestCase, *names: str) -> None:
    missing = [n for n in names if not os.environ.get(n)]
    if not missing:
        return
    msg = "live API tests need " + ", ".join(missing)
    if os.environ.get("KILN_INTEGRATION") == "require":
        test.fail(msg + " (KILN_INTEGRATION=require)")
    test.skipTest(msg)


def client(test: unittest.TestCase, **kw) -> kiln.Client:
    require(test, "KILN_SERVER")
    return kiln.Client(**kw)


def control(test: unittest.TestCase, method: str, path: str) -> str:
    require(test, "KILN_TEST_CONTROL")
    req = urllib.request.Request(os.environ["KILN_TEST_CONTROL"] + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def unique() -> str:
    """A comment that makes code unique, so the result cache does not answer it."""
    return f"# run {uuid.uuid4()}\n"


def post_tool_call(test: unittest.TestCase, call: dict) -> dict:
    """POST /v1/tool-calls with the call as it is, without the SDK: what the server returns."""
    require(test, "KILN_SERVER")
    req = urllib.request.Request(os.environ["KILN_SERVER"].rstrip("/") + "/v1/tool-calls", method="POST",
                                 data=json.dumps(call).encode(), headers={"Content-Type": "application/json"})
    if os.environ.get("KILN_API_KEY"):
        req.add_header("Authorization", "Bearer " + os.environ["KILN_API_KEY"])
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def without_job_ids(v):
    """v with every job id replaced: a result-cache hit answers under an id of its own."""
    return json.loads(re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", json.dumps(v)))
