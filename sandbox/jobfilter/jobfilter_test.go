package jobfilter

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// installAndProbe installs the filter (as box.py does: no_new_privs, then
// PR_SET_SECCOMP) in a fresh python3 process, then makes each call and
// prints its errno (0: allowed).
const installAndProbe = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
f = open(sys.argv[1], "rb").read()
assert libc.prctl(38, 1, 0, 0, 0) == 0
prog = Prog(len(f) // 8, f)
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()
def errno(r):
    return 0 if r == 0 or r > 0 else ctypes.get_errno()
out = []
out.append(("unshare", errno(libc.unshare(0x00020000))))
out.append(("mount", errno(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))))
out.append(("keyctl", errno(libc.syscall(250, 0, 0, 0, 0))))
out.append(("clone3", errno(libc.syscall(435, 0, 0))))
out.append(("io_uring_setup", errno(libc.syscall(425, 1, 0))))
out.append(("clone_newuser", errno(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))))
out.append(("x32_getpid", errno(libc.syscall(0x40000000 + 39))))
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
out.append(("fork", 0))
out.append(("getpid", errno(0 if libc.getpid() > 0 else -1)))
print(" ".join("%s=%d" % kv for kv in out))
`

func TestFilterRefusesAndAllows(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("KILN_INTEGRATION") == "require" {
			t.Fatalf("python3 is needed to install the filter: %v", err)
		}
		t.Skip("python3 not installed")
	}
	prog, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "job.bpf")
	if err := os.WriteFile(path, prog, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "-c", installAndProbe, path).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// errno 1 is EPERM, 38 ENOSYS; the rest must work.
	want := "unshare=1 mount=1 keyctl=1 clone3=38 io_uring_setup=38 clone_newuser=1 x32_getpid=38 fork=0 getpid=0"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("under the job filter:\n got %s\nwant %s", got, want)
	}
}
