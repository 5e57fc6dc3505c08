package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// buildKiln builds the kiln binary for a test.
func buildKiln(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kiln")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/kilnrun/kiln/cmd/kiln")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// kilnRun starts `kiln run args...` against the test's API.
func (e *env) kilnRun(t *testing.T, bin string, args ...string) (*exec.Cmd, io.Reader, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "KILN_SERVER="+e.apiURL)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stdout, &stderr
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// kiln run sends a local file, prints the output as the job writes it,
// saves the artifacts to --out and exits with the job's exit code.
func TestCLIRunLive(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	e.startWorker(t, "w-cli", 1)
	dir := t.TempDir()
	csv := filepath.Join(dir, "local.csv")
	if err := os.WriteFile(csv, []byte("a,b\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "job.py")
	if err := os.WriteFile(script, []byte(`
import os, sys, time, shutil
print("first", flush=True)
time.sleep(2)
out = os.environ["KILN_OUTPUT_DIR"]
shutil.copy("in/data.csv", out + "/copy.csv")
os.makedirs(out + "/sub")
open(out + "/sub/x.bin", "wb").write(bytes(range(256)))
print("second", sys.argv[1], flush=True)
print("to stderr", file=sys.stderr)
sys.exit(3)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	outDir := filepath.Join(dir, "out")
	cmd, stdout, stderr := e.kilnRun(t, bin, "--file", csv+":in/data.csv", "--out", outDir, "--no-cache", script, "--", "arg1")
	r := bufio.NewReader(stdout)
	line, err := r.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line %q (%v); stderr %s", line, err, stderr)
	}
	firstAt := time.Now()
	rest, _ := io.ReadAll(r)
	err = cmd.Wait()
	if gap := time.Since(firstAt); gap < 1500*time.Millisecond {
		t.Errorf("first line printed only %v before the end; want it live", gap)
	}
	if code := exitCode(err); code != 3 {
		t.Errorf("exit code %d (%v); want the job's 3; stderr %s", code, err, stderr)
	}
	if string(rest) != "second arg1\n" || !strings.Contains(stderr.String(), "to stderr\n") {
		t.Errorf("rest of stdout %q, stderr %q", rest, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(outDir, "copy.csv")); err != nil || string(b) != "a,b\n1,2\n" {
		t.Errorf("copy.csv: %q %v", b, err)
	}
	b, err := os.ReadFile(filepath.Join(outDir, "sub", "x.bin"))
	want := sha256.Sum256(func() []byte {
		x := make([]byte, 256)
		for i := range x {
			x[i] = byte(i)
		}
		return x
	}())
	if s := sha256.Sum256(b); err != nil || hex.EncodeToString(s[:]) != hex.EncodeToString(want[:]) {
		t.Errorf("sub/x.bin: %d bytes, %v", len(b), err)
	}
}

// Ctrl-C on kiln run cancels the job on the server.
func TestCLIRunInterruptCancels(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	e.startWorker(t, "w-cli-int", 1)
	script := filepath.Join(t.TempDir(), "sleep.py")
	if err := os.WriteFile(script, []byte("import time\nprint('ready', flush=True)\ntime.sleep(120)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, stdout, stderr := e.kilnRun(t, bin, "--no-cache", script)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("first line %q (%v); stderr %s", line, err, stderr)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(45 * time.Second):
		t.Fatalf("kiln run did not exit within 45s of SIGINT; stderr %s", stderr)
	}
	if code := exitCode(err); code != 130 {
		t.Errorf("exit code %d; want 130 (canceled); stderr %s", code, stderr)
	}
	id := ""
	for _, f := range strings.Fields(stderr.String()) {
		if job.ValidID(f) {
			id = f
		}
	}
	if id == "" {
		t.Fatalf("no job id on stderr: %s", stderr)
	}
	rec := e.waitRecord(t, id, 30*time.Second, func(r cache.Record) bool { return r.Status.Terminal() })
	if rec.Status != job.StatusCanceled {
		t.Errorf("job %s ended %s; want canceled", id, rec.Status)
	}
}
