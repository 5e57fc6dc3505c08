package e2bapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
	"github.com/kilnrun/kiln/e2bapi/envdpb/envdpbconnect"
	"github.com/kilnrun/kiln/job"
)

// scriptedCommand is a background command as the session's interpreter
// keeps it: each wait sees one more line of out, the last one ends it with
// exit; a kill ends it killed.
type scriptedCommand struct {
	mu     sync.Mutex
	out    []string
	exit   int
	waits  int
	killed bool
	calls  []job.SessionCommand
}

func (c *scriptedCommand) answer(call job.SessionCall) *job.CallResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := *call.Command
	c.calls = append(c.calls, cmd)
	res := &job.CallResult{Seq: 7, Result: job.Result{Status: job.StatusSucceeded}}
	switch {
	case cmd.Op == job.CommandRun:
		res.Command = &job.CommandState{ID: "7", Background: true, Running: true}
	case cmd.ID != "7":
		res.Command = &job.CommandState{ID: cmd.ID, Missing: true}
	case cmd.Op == job.CommandKill:
		c.killed = true
		code := 137
		res.Command = &job.CommandState{ID: "7", ExitCode: &code, Killed: true}
	default:
		c.waits++
		n := min(c.waits, len(c.out))
		res.Stdout = strings.Join(c.out[:n], "")
		res.Command = &job.CommandState{ID: "7", Background: true, Running: n < len(c.out) && !c.killed}
		if !res.Command.Running {
			code := c.exit
			res.Command.ExitCode = &code
		}
	}
	return res
}

func processClient(t *testing.T, c *scriptedCommand) (envdpbconnect.ProcessClient, func(connect.AnyRequest)) {
	hs := serve(t, &fakeDomain{command: c.answer})
	return envdpbconnect.NewProcessClient(http.DefaultClient, hs.URL, connect.WithProtoJSON()), func(r connect.AnyRequest) {
		r.Header().Set(headerSandboxID, "s1")
		r.Header().Set(headerSandboxPort, portEnvd)
		r.Header().Set(headerAccessToken, "tok-s1")
	}
}

// E2B's commands.run(cmd, {cwd, envs}): a background command of the
// session running bash -l -c cmd, quoted, in the sandbox's files; its
// output streamed as it grows (each part once), then its end.
func TestProcessStartFollowsTheCommand(t *testing.T) {
	sc := &scriptedCommand{out: []string{"one\n", "two\n", "three\n"}, exit: 3}
	c, auth := processClient(t, sc)
	cwd := "/home/user/data"
	req := connect.NewRequest(&envdpb.StartRequest{Process: &envdpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo it's $X"},
		Envs: map[string]string{"X": "1"}, Cwd: &cwd}})
	auth(req)
	stream, err := c.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	var out strings.Builder
	var end *envdpb.ProcessEvent_EndEvent
	for stream.Receive() {
		switch ev := stream.Msg().Event.Event.(type) {
		case *envdpb.ProcessEvent_Start:
			pid = ev.Start.Pid
		case *envdpb.ProcessEvent_Data:
			out.Write(ev.Data.GetStdout())
		case *envdpb.ProcessEvent_End:
			end = ev.End
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if pid != 7 || out.String() != "one\ntwo\nthree\n" || end == nil || end.ExitCode != 3 || !end.Exited {
		t.Fatalf("pid %d, output %q, end %+v", pid, out.String(), end)
	}
	run := sc.calls[0]
	if want := `cd '/work/data' && exec '/bin/bash' '-l' '-c' 'echo it'\''s $X'`; run.Cmd != want || !run.Background || run.Env["X"] != "1" {
		t.Errorf("the command started: %+v; want %q in the background", run, want)
	}
	for _, w := range sc.calls[1:] {
		if w.Op != job.CommandWait || w.ID != "7" || w.WaitMS <= 0 || w.WaitMS > followWaitMax.Milliseconds() {
			t.Errorf("a wait: %+v", w)
		}
	}
}

// Kill is SendSignal on the pid; a pid the session does not hold is not
// found; a terminal and stdin are refused as not served, cwd outside the
// sandbox's files as invalid.
func TestProcessSignalsAndRefusals(t *testing.T) {
	sc := &scriptedCommand{out: []string{"x\n", "y\n"}}
	c, auth := processClient(t, sc)
	ctx := context.Background()
	kill := connect.NewRequest(&envdpb.SendSignalRequest{Process: &envdpb.ProcessSelector{Selector: &envdpb.ProcessSelector_Pid{Pid: 7}}, Signal: envdpb.Signal_SIGNAL_SIGKILL})
	auth(kill)
	if _, err := c.SendSignal(ctx, kill); err != nil || !sc.killed {
		t.Fatalf("kill: %v (killed %v)", err, sc.killed)
	}
	other := connect.NewRequest(&envdpb.SendSignalRequest{Process: &envdpb.ProcessSelector{Selector: &envdpb.ProcessSelector_Pid{Pid: 8}}, Signal: envdpb.Signal_SIGNAL_SIGKILL})
	auth(other)
	if _, err := c.SendSignal(ctx, other); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("kill of a pid not held: %v", err)
	}
	yes, outside := true, "/etc"
	for name, msg := range map[string]*envdpb.StartRequest{
		"pty":     {Process: &envdpb.ProcessConfig{Cmd: "ls"}, Pty: &envdpb.PTY{}},
		"stdin":   {Process: &envdpb.ProcessConfig{Cmd: "ls"}, Stdin: &yes},
		"outside": {Process: &envdpb.ProcessConfig{Cmd: "ls", Cwd: &outside}},
		"no cmd":  {Process: &envdpb.ProcessConfig{}},
	} {
		req := connect.NewRequest(msg)
		auth(req)
		stream, err := c.Start(ctx, req)
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		want := connect.CodeInvalidArgument
		if name == "pty" || name == "stdin" {
			want = connect.CodeUnimplemented
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != want {
			t.Errorf("%s: %v; want %v", name, err, want)
		}
	}
}
