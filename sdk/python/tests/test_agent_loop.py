"""examples/agent_loop.py against the live API, with scripted stand-ins for the model."""
import importlib.util
import pathlib
import sys
import unittest

from . import live

_path = pathlib.Path(__file__).resolve().parents[3] / "examples" / "agent_loop.py"
_spec = importlib.util.spec_from_file_location("agent_loop", _path)
agent_loop = importlib.util.module_from_spec(_spec)
sys.modules["agent_loop"] = agent_loop  # dataclasses look their module up
_spec.loader.exec_module(agent_loop)


class Scripted:
    """Answers with the given programs in turn and records what it was shown."""

    def __init__(self, *programs):
        self.programs = list(programs)
        self.shown = []

    def __call__(self, task, attempts):
        self.shown.append([a.feedback() for a in attempts])
        return self.programs[min(len(self.shown) - 1, len(self.programs) - 1)]


class AgentLoopTest(unittest.TestCase):
    def setUp(self):
        self.c = live.client(self)

    def test_bug_then_fix(self):
        tag = live.unique()
        model = Scripted(tag + "xs = [3, 1, 2]\nprint(sorted(xs)[3])\n", tag + "xs = [3, 1, 2]\nprint(sorted(xs)[-1])\n")
        out = agent_loop.solve(self.c, model, "print the largest number", budget_s=120)
        self.assertTrue(out.ok, out.reason)
        self.assertEqual(len(out.attempts), 2)
        self.assertEqual(out.attempts[0].result.error.category, "runtime_error")
        self.assertEqual(out.result.stdout, "3\n")
        self.assertEqual(len(model.shown), 2)
        self.assertIn("category=runtime_error", model.shown[1][0])
        self.assertIn("IndexError", model.shown[1][0])

    def test_gives_up_after_three_retries(self):
        model = Scripted(live.unique() + "print(")
        out = agent_loop.solve(self.c, model, "anything", budget_s=120)
        self.assertFalse(out.ok)
        self.assertEqual(out.reason, "retries exhausted")
        self.assertEqual(len(out.attempts), 4)  # the first run and three retries
        self.assertTrue(all(a.result.error.category == "syntax_error" for a in out.attempts))

    def test_budget_bounds_the_loop(self):
        model = Scripted(live.unique() + "import time\ntime.sleep(30)\n")
        out = agent_loop.solve(self.c, model, "anything", budget_s=3)
        self.assertFalse(out.ok)
        self.assertEqual(out.attempts[0].result.error.category, "timeout")
        self.assertIn(out.reason, ("budget exhausted", "retries exhausted"))
        self.assertLessEqual(len(out.attempts), 2)


if __name__ == "__main__":
    unittest.main()
