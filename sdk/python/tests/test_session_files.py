"""A session's files, shell commands, pause and resume from the Python SDK, sync and async, against a live Kiln.

Run by internal/e2e's TestSDKs (and TestSDKSessions alone), which starts
the pipeline and exports KILN_SERVER and KILN_API_KEY.
"""
import asyncio
import hashlib
import os
import tempfile
import unittest

import kiln

from . import live


class SessionFilesTest(unittest.TestCase):
    def setUp(self):
        self.c = live.client(self)

    def test_upload_download_list_stat_remove(self):
        with self.c.session() as s, tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "data.csv")
            with open(local, "wb") as f:
                f.write(b"a,b\n1,2\n")
            up = s.upload(local, "in/data.csv")
            self.assertEqual((up.path, up.name, up.type, up.size, up.mode), ("in/data.csv", "data.csv", "file", 8, "0644"))
            self.assertEqual(up.sha256, hashlib.sha256(b"a,b\n1,2\n").hexdigest())
            r = s.run("import pandas as pd\ndf = pd.read_csv('in/data.csv')\ndf['c'] = df.a + df.b\ndf.to_csv('out.csv', index=False)\nprint(int(df.c[0]))")
            self.assertEqual(r.stdout, "3\n")
            self.assertEqual(s.read_file("out.csv"), b"a,b,c\n1,2,3\n")
            got = s.download("out.csv", os.path.join(tmp, "back.csv"))
            with open(got, "rb") as f:
                self.assertEqual(f.read(), b"a,b,c\n1,2,3\n")
            # Text goes as UTF-8; a put over a file replaces it.
            s.write_file("notes/n.txt", "héllo")
            self.assertEqual(s.read_file("notes/n.txt"), "héllo".encode())
            self.assertEqual(s.mkdir("plots/2024").type, "dir")
            self.assertEqual(s.mkdir("plots/2024").type, "dir")  # already there: fine
            moved = s.move("notes/n.txt", "plots/n.txt")
            self.assertEqual((moved.path, moved.size), ("plots/n.txt", 6))
            names = {e.path: e.type for e in s.list_files()}
            self.assertEqual((names.get("in"), names.get("out.csv"), names.get("plots"), "in/data.csv" in names),
                             ("dir", "file", "dir", False))
            self.assertEqual([e.path for e in s.list_files("plots", recursive=True)], ["plots/2024", "plots/n.txt"])
            st = s.stat("plots")
            self.assertTrue(st.is_dir and st.mtime)
            self.assertTrue(s.exists("out.csv"))
            with self.assertRaises(kiln.FileConflict) as cm:
                s.remove("plots")
            self.assertEqual((cm.exception.status, cm.exception.field, cm.exception.temporary), (409, "path", False))
            s.remove("plots", recursive=True)
            self.assertFalse(s.exists("plots"))
            with self.assertRaises(kiln.NotFound):
                s.remove("plots")
            with self.assertRaises(kiln.NotFound):
                s.stat("nope.txt")
            with self.assertRaises(kiln.FileConflict):
                s.mkdir("out.csv")
            # A link the session made is never written through.
            s.run("import os\nos.symlink('/etc/passwd', 'pw')")
            self.assertEqual(s.stat("pw").type, "symlink")
            with self.assertRaises(kiln.FileConflict) as cm:
                s.write_file("pw", "owned")
            self.assertIn("symbolic link", cm.exception.detail)
            self.assertNotIn("owned", s.run("print(open('/etc/passwd').read())").stdout)
            with self.assertRaises(kiln.InvalidRequest) as cm:
                s.write_file("a/../../x", "x")
            self.assertEqual(cm.exception.field, "path")

    def test_node_session_keeps_state(self):
        # Issue 36, acceptance 4: globalThis, a required module and a file
        # persist between a node session's calls.
        with self.c.session(runtime="node") as s:
            self.assertEqual(s.run("globalThis.n = 40\nconst fs = require('fs')\nfs.writeFileSync('n.txt', String(n))").status, "succeeded")
            r = s.run("n += 2\nconsole.log(n, fs.readFileSync('n.txt', 'utf8'))")
            self.assertEqual((r.status, r.stdout), ("succeeded", "42 40\n"))
            self.assertEqual(s.read_file("n.txt"), b"40")

    def test_commands(self):
        with self.c.session() as s:
            s.write_file("data/a.csv", "a\n1\n")
            r = s.command("pip list")
            self.assertEqual((r.status, r.exit_code, r.command["running"], r.command["exit_code"]), ("succeeded", 0, False, 0))
            self.assertIn("pandas", r.stdout)
            r = s.command("ls -la data; echo $WHO >&2; exit 2", env={"WHO": "me"})
            self.assertEqual((r.status, r.exit_code, r.stderr), ("failed", 2, "me\n"))
            self.assertIn("a.csv", r.stdout)
            self.assertEqual(s.command("sleep 30", timeout=1).status, "timed_out")
            bg = s.command("echo hi; sleep 1; exit 4", background=True)
            self.assertEqual((bg.command["running"], bg.command["id"]), (True, str(bg.seq)))
            first = bg.command["id"]
            r = s.wait_command(bg.command["id"], wait=30)
            self.assertEqual((r.command["running"], r.command["exit_code"], r.stdout), (False, 4, "hi\n"))
            bg = s.command("exec sleep 300", background=True)
            self.assertTrue(s.wait_command(bg.command["id"]).command["running"])
            r = s.kill_command(bg.command["id"])
            self.assertEqual((r.command["killed"], r.command["running"], r.command["exit_code"]), (True, False, 137))
            with self.assertRaises(kiln.NotFound) as cm:
                s.wait_command("999")
            self.assertEqual(cm.exception.field, "cid")
            # A command with a stdin: written to twice, closed, it reads all of it and ends.
            cat = s.command("cat > fed.txt; echo fed", background=True, stdin=True)
            self.assertEqual((cat.command["running"], cat.command["stdin"]), (True, True))
            r = s.write_stdin(cat.command["id"], "one\n")
            self.assertTrue(r.command["stdin"])
            r = s.write_stdin(cat.command["id"], "two\n", close=True)
            self.assertFalse(r.command.get("stdin"))
            r = s.wait_command(cat.command["id"], wait=30)
            self.assertEqual((r.command["running"], r.command["exit_code"], r.stdout), (False, 0, "fed\n"))
            self.assertEqual(s.read_file("fed.txt"), b"one\ntwo\n")
            with self.assertRaises(kiln.Conflict) as cm:
                s.write_stdin(cat.command["id"], "late")
            self.assertEqual((cm.exception.status, cm.exception.type, cm.exception.temporary),
                             (409, "urn:kiln:problem:stdin-closed", False))
            with self.assertRaises(kiln.NotFound):
                s.write_stdin("999", close=True)
            # The list: every background command, oldest first, each where it stands.
            listed = s.list_commands()
            self.assertEqual([(c["id"], c["cmd"], c["running"], c.get("exit_code"), c.get("stdin", False)) for c in listed],
                             [(first, "echo hi; sleep 1; exit 4", False, 4, False),
                              (bg.command["id"], "exec sleep 300", False, 137, False),
                              (cat.command["id"], "cat > fed.txt; echo fed", False, 0, False)])

    def test_cancel_call(self):
        with self.c.session() as s:
            s.run("x = 41")
            with self.assertRaises(kiln.WaitTimeout) as cm:
                s.run("import time\nx = 7\ntime.sleep(120)", timeout=1)
            seq = cm.exception.job["seq"]
            r = s.cancel_call(seq)
            self.assertEqual((r.status, r.seq), ("canceled", seq))
            self.assertEqual(s.run("print(x)").stdout, "7\n")  # the same interpreter
            done = s.run("print(1)")
            self.assertEqual(s.cancel_call(done.seq).status, "succeeded")  # an ended call is left as it is
            with self.assertRaises(kiln.NotFound):
                s.cancel_call(999)

    def test_pause_resume(self):
        with self.c.session() as s:
            s.run("x = 1\nopen('kept.txt', 'w').write('kept')")
            self.assertIs(s.pause(), s)
            self.assertEqual(s.status, "paused")
            self.assertTrue(s.paused_at)
            self.assertEqual(s.refresh().status, "paused")
            self.assertEqual(s.pause().status, "paused")  # paused already: answered as it is
            self.assertIs(s.resume(), s)
            self.assertEqual((s.status, s.restored), ("ready", "files+variables"))
            # Its files came back, and its variables (restored says so).
            r = s.run("print(open('kept.txt').read(), x)")
            self.assertEqual(r.stdout, "kept 1\n")
            self.assertIn("variables came back", r.session_note)


class AsyncSessionFilesTest(unittest.TestCase):
    def test_async_session_and_files(self):
        live.require(self, "KILN_SERVER")

        async def main():
            async with kiln.AsyncClient() as c:
                async with await c.session(metadata={"suite": "async-files"}) as s:
                    self.assertIsInstance(s, kiln.AsyncSession)
                    self.assertEqual(s.status, "ready")
                    self.assertIn(s.id, [x.id for x in await c.sessions(tags={"suite": "async-files"})])
                    a = await s.run("x = 41")
                    self.assertEqual((a.status, a.seq), ("succeeded", 1))
                    info = await s.write_file("in/x.txt", b"async bytes")
                    self.assertEqual((info.path, info.size), ("in/x.txt", 11))
                    b = await s.run("print(x + 1, open('in/x.txt').read())")
                    self.assertEqual(b.stdout, "42 async bytes\n")
                    self.assertEqual(await s.read_file("in/x.txt"), b"async bytes")
                    self.assertEqual((await s.stat("in")).type, "dir")
                    self.assertEqual([e.path for e in await s.list_files("in")], ["in/x.txt"])
                    await s.move("in/x.txt", "y.txt")
                    await s.remove("in")
                    self.assertFalse(await s.exists("in"))
                    # Calls run concurrently from tasks are each answered once, in order.
                    rs = await asyncio.gather(*(s.run(f"x += 1\nprint(x)") for _ in range(3)))
                    self.assertEqual(sorted(r.stdout for r in rs), ["42\n", "43\n", "44\n"])
                    r = await s.command("cat y.txt; echo; pwd")
                    self.assertEqual((r.exit_code, r.stdout), (0, "async bytes\n/work\n"))
                    self.assertEqual(await s.list_commands(), [])  # no background command yet
                    with self.assertRaises(kiln.WaitTimeout) as cm:
                        await s.run("import time\ntime.sleep(120)", timeout=1)
                    self.assertEqual((await s.cancel_call(cm.exception.job["seq"])).status, "canceled")
                    bg = await s.command("tr a-z A-Z", background=True, stdin=True)
                    self.assertFalse((await s.write_stdin(bg.command["id"], "shout\n", close=True)).command.get("stdin"))
                    with self.assertRaises(kiln.Conflict):
                        await s.write_stdin(bg.command["id"], "more")
                    self.assertEqual((await s.wait_command(bg.command["id"], 30)).stdout, "SHOUT\n")
                    self.assertEqual([(c["id"], c["cmd"]) for c in await s.list_commands()], [(bg.command["id"], "tr a-z A-Z")])
                    self.assertEqual((await s.pause()).status, "paused")
                    self.assertEqual(((await s.resume()).status, s.restored), ("ready", "files+variables"))
                    self.assertEqual((await s.run("print(open('y.txt').read())")).stdout, "async bytes\n")
                    same = await c.get_session(s.id)
                    self.assertEqual(same.id, s.id)
                self.assertEqual(s.status, "ended")

        asyncio.run(main())
