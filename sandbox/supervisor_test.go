package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// superviseAttack aims every process-directed call a job has at every pid
// and thread it can name (those /proc lists, and every pid up to 4096
// probed blind) and prints, as JSON, each call's outcomes on the job's own
// processes (its uid's) and on the others (its supervisors'), and the
// others it could name.
const superviseAttack = `
import ctypes, json, os, resource, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)
mine = subprocess.Popen(["sleep", "30"])
own = {os.getpid(), mine.pid}
targets = set(range(1, 4096))
for p in os.listdir("/proc"):
    if p.isdigit():
        targets.add(int(p))
        try:
            targets.update(int(t) for t in os.listdir("/proc/%s/task" % p))
        except OSError:
            pass
def uid_of(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
# The job's own: its uid's processes and threads (the launcher, the
# program, its children, their threads); every other is a supervisor.
me = os.getuid()
got, others = {}, set()
for pid in sorted(targets):
    if uid_of(pid) == me:
        own.add(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        continue
    except PermissionError:
        pass
    for name, call in (
        ("kill", lambda: os.kill(pid, signal.SIGCONT)),
        ("prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, 0)) if pid not in own else resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))),
        ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
        ("affinity", lambda: os.sched_setaffinity(pid, {0})),
        ("sched_idle", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
        ("ioprio", lambda: (_ for _ in ()).throw(OSError()) if libc.syscall(251, 1, pid, (3 << 13)) != 0 else None),
        ("ptrace", lambda: (_ for _ in ()).throw(OSError()) if libc.ptrace(16, pid, 0, 0) != 0 else None),
        ("oom_score_adj", lambda: open("/proc/%d/oom_score_adj" % pid, "w").write("-1000")),
        ("environ", lambda: open("/proc/%d/environ" % pid, "rb").read()),
    ):
        try:
            call(); ok = True
        except (OSError, ValueError):
            ok = False
        got.setdefault(("own " if pid in own else "other ") + name, set()).add(ok)
    if pid not in own:
        others.add(pid)
mine.kill()
for path in ("/run/kiln/status", "/run/kiln/outputs"):
    try:
        open(path, "ab").write(b"x" * 4096)
        got.setdefault("other write " + path, set()).add(True)
    except OSError:
        got.setdefault("other write " + path, set()).add(False)
print(json.dumps({"calls": {k: sorted(v) for k, v in got.items()}, "others": sorted(others)}))
`

// Issue 40: on every sandbox path (a box, a container of its own, a pooled
// one, gVisor), no process-directed call of the job reaches its
// supervisors, whatever pid or thread it aims at: in a container of its
// own kiln-init runs as a uid of the sandbox's that the job never has
// (supervisorUID), not behind a filter on pid 1. The run ends with its
// own status on its first attempt, and the sandbox's next job is fine.
func TestHostileSupervisorUnreachable(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res := run(t, rt, py(superviseAttack))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("attack: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	others := checkSupervisorAttack(t, res.Stdout)
	if underGVisor() && len(others) > 0 {
		// gVisor's kernel lets setpriority, sched_setaffinity and reading
		// /proc/<pid>/environ through across uids, so there the job must
		// not see its supervisor at all: its pid namespace is its own.
		t.Errorf("under gVisor the job names processes not its own: %v; want a pid namespace of the job's own", others)
	}
	healthy(t, rt)
}

// checkSupervisorAttack reads superviseAttack's (or its node twin's)
// report: every call on another process refused, the job's own calls on
// itself allowed. It returns the other processes the job could name.
func checkSupervisorAttack(t *testing.T, stdout string) (others []int) {
	t.Helper()
	var got struct {
		Calls  map[string][]bool
		Others []int
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), &got); err != nil {
		t.Fatalf("%q: %v", stdout, err)
	}
	t.Logf("other processes the job can name: %v; calls: %v", got.Others, got.Calls)
	tried := 0
	for k, v := range got.Calls {
		if !strings.HasPrefix(k, "other ") {
			continue
		}
		tried++
		if len(v) != 1 || v[0] {
			t.Errorf("%s on a process not the job's: %v; want refused every time", k, v)
		}
	}
	if len(got.Others) > 0 && tried < 5 {
		t.Errorf("calls on other processes: %v; want every call tried", got.Calls)
	}
	for _, k := range []string{"own kill", "own prlimit", "own setpriority"} {
		if v := got.Calls[k]; len(v) != 1 || !v[0] {
			t.Errorf("%s: %v; want the job's own processes its own to act on", k, v)
		}
	}
	return got.Others
}

// superviseAttackJS is superviseAttack in node: signals from the process
// itself, the rest through util-linux's tools aimed at each pid and thread.
const superviseAttackJS = `
const fs = require('fs'), cp = require('child_process');
const mine = cp.spawn('sleep', ['30']);
const own = new Set([process.pid, mine.pid]);
const targets = new Set();
for (const p of fs.readdirSync('/proc').filter(p => /^\d+$/.test(p))) {
  targets.add(Number(p));
  try { for (const t of fs.readdirSync('/proc/' + p + '/task')) targets.add(Number(t)); } catch (e) {}
}
for (let p = 1; p < 4096; p++) targets.add(p);
const calls = {}, others = [];
const tally = (k, ok) => { (calls[k] = calls[k] || new Set()).add(ok); };
const tool = (args) => cp.spawnSync(args[0], args.slice(1), { stdio: 'ignore' }).status === 0;
// The job's own: its uid's processes and threads; every other is a
// supervisor.
const uidOf = (pid) => { try { return Number(fs.readFileSync('/proc/' + pid + '/status', 'utf8').match(/^Uid:\s+(\d+)/m)[1]); } catch (e) { return null; } };
for (const pid of [...targets].sort((a, b) => a - b)) {
  if (uidOf(pid) === process.getuid()) own.add(pid);
  try { process.kill(pid, 0); } catch (e) { if (e.code === 'ESRCH') continue; }
  const who = own.has(pid) ? 'own ' : 'other ';
  const attempts = {
    kill: () => { process.kill(pid, 'SIGCONT'); return true; },
    prlimit: () => tool(['prlimit', '--pid', String(pid), own.has(pid) ? '--core=0:0' : '--fsize=0:0']),
    setpriority: () => tool(['renice', '-n', '19', '-p', String(pid)]),
    affinity: () => tool(['taskset', '-p', '1', String(pid)]),
    sched_idle: () => tool(['chrt', '-i', '-p', '0', String(pid)]),
    oom_score_adj: () => { fs.writeFileSync('/proc/' + pid + '/oom_score_adj', '-1000'); return true; },
    environ: () => { fs.readFileSync('/proc/' + pid + '/environ'); return true; },
  };
  for (const [name, f] of Object.entries(attempts)) {
    let ok; try { ok = f(); } catch (e) { ok = false; }
    tally(who + name, ok);
  }
  if (!own.has(pid)) others.push(pid);
}
mine.kill();
for (const path of ['/run/kiln/status', '/run/kiln/outputs']) {
  try { fs.appendFileSync(path, 'x'.repeat(4096)); tally('other write ' + path, true); } catch (e) { tally('other write ' + path, false); }
}
console.log(JSON.stringify({ calls: Object.fromEntries(Object.entries(calls).map(([k, v]) => [k, [...v].sort()])), others }));
`

// TestNodeSupervisorUnreachable is TestHostileSupervisorUnreachable on the
// node path (a container per job).
func TestNodeSupervisorUnreachable(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	res := run(t, rt, js(superviseAttackJS))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("attack: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	checkSupervisorAttack(t, res.Stdout)
	requireSucceeded(t, run(t, rt, js("console.log(6*7)")), "42\n")
}
