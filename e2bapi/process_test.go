package e2bapi

import (
	"context"
	"errors"
	"net/http"
	"slices"
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
	// stdin is what was written to the command's stdin; closed, whether
	// it was closed.
	stdin  []byte
	closed bool
}

func (c *scriptedCommand) answer(call job.SessionCall) *job.CallResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := *call.Command
	c.calls = append(c.calls, cmd)
	res := &job.CallResult{Seq: 7, Result: job.Result{Status: job.StatusSucceeded}}
	switch {
	case cmd.Op == job.CommandRun:
		res.Command = &job.CommandState{ID: "7", Background: true, Running: true, Stdin: cmd.Stdin}
	case cmd.Op == job.CommandList:
		code := 0
		res.Commands = []job.CommandState{
			{ID: "3", Background: true, ExitCode: &code, Cmd: "exec 'true'"},
			{ID: "7", Background: true, Running: !c.killed, Cmd: `cd '/work/data' && exec '/bin/bash' '-l' '-c' 'sleep 9'`},
		}
	case cmd.ID != "7":
		res.Command = &job.CommandState{ID: cmd.ID, Missing: true}
	case cmd.Op == job.CommandInput:
		res.Command = &job.CommandState{ID: "7", Background: true, Running: true, Stdin: !c.closed, StdinClosed: c.closed}
		if !c.closed {
			c.stdin = append(c.stdin, cmd.Input...)
			c.closed = cmd.CloseStdin
			res.Command.Stdin = !c.closed
		}
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
// found; a terminal is refused as not served, cwd outside the sandbox's
// files as invalid.
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
	outside := "/etc"
	for name, msg := range map[string]*envdpb.StartRequest{
		"pty":     {Process: &envdpb.ProcessConfig{Cmd: "ls"}, Pty: &envdpb.PTY{}},
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
		if name == "pty" {
			want = connect.CodeUnimplemented
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != want {
			t.Errorf("%s: %v; want %v", name, err, want)
		}
	}
}

// A command line commandLine made is listed as the process config it came
// from; any other line as the shell's.
func TestProcessConfigOfACommandLine(t *testing.T) {
	cwd := "/home/user/sub dir"
	for _, c := range []*envdpb.ProcessConfig{
		{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo 'hi' && sleep 1"}},
		{Cmd: "printf", Args: []string{"", "it's", "a b"}, Cwd: &cwd},
	} {
		line, err := commandLine(c)
		if err != nil {
			t.Fatal(err)
		}
		got := processConfig(line)
		want := "/home/user"
		if c.Cwd != nil {
			want = *c.Cwd
		}
		if got.Cmd != c.Cmd || !slices.Equal(got.Args, c.Args) || got.GetCwd() != want {
			t.Errorf("%q: got %v %q in %s, want %v %q in %s", line, got.Cmd, got.Args, got.GetCwd(), c.Cmd, c.Args, want)
		}
	}
	if got := processConfig("ls | wc -l"); got.Cmd != "/bin/sh" || !slices.Equal(got.Args, []string{"-c", "ls | wc -l"}) {
		t.Errorf("a line of another form: %v %q", got.Cmd, got.Args)
	}
}

// commands.run(cmd, {stdin: true}) starts the command with a stdin;
// sendStdin writes to it in parts of at most job.MaxCommandInputBytes;
// closeStdin closes it, and a write after that is refused; list names the
// running commands as they were started.
func TestProcessStdinAndList(t *testing.T) {
	sc := &scriptedCommand{out: []string{"x\n", "y\n"}}
	c, auth := processClient(t, sc)
	ctx := context.Background()
	yes := true
	start := connect.NewRequest(&envdpb.StartRequest{Process: &envdpb.ProcessConfig{Cmd: "cat"}, Stdin: &yes})
	auth(start)
	stream, err := c.Start(ctx, start)
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	if err := stream.Err(); err != nil || !sc.calls[0].Stdin {
		t.Fatalf("start with stdin: %v %+v", err, sc.calls[0])
	}
	pid := &envdpb.ProcessSelector{Selector: &envdpb.ProcessSelector_Pid{Pid: 7}}
	big := []byte(strings.Repeat("z", job.MaxCommandInputBytes+10))
	in := connect.NewRequest(&envdpb.SendInputRequest{Process: pid, Input: &envdpb.ProcessInput{Input: &envdpb.ProcessInput_Stdin{Stdin: big}}})
	auth(in)
	if _, err := c.SendInput(ctx, in); err != nil || string(sc.stdin) != string(big) {
		t.Fatalf("send input: %v (%d bytes arrived)", err, len(sc.stdin))
	}
	inputs := 0
	for _, call := range sc.calls {
		if call.Op == job.CommandInput {
			inputs++
			if len(call.Input) > job.MaxCommandInputBytes || call.CloseStdin {
				t.Errorf("an input call of %d bytes, close %v", len(call.Input), call.CloseStdin)
			}
		}
	}
	if inputs != 2 {
		t.Errorf("%d input calls for one input over the bound; want 2", inputs)
	}
	cl := connect.NewRequest(&envdpb.CloseStdinRequest{Process: pid})
	auth(cl)
	if _, err := c.CloseStdin(ctx, cl); err != nil || !sc.closed {
		t.Fatalf("close stdin: %v (closed %v)", err, sc.closed)
	}
	again := connect.NewRequest(&envdpb.SendInputRequest{Process: pid, Input: &envdpb.ProcessInput{Input: &envdpb.ProcessInput_Stdin{Stdin: []byte("late")}}})
	auth(again)
	if _, err := c.SendInput(ctx, again); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("input after close: %v; want failed_precondition", err)
	}
	other := connect.NewRequest(&envdpb.CloseStdinRequest{Process: &envdpb.ProcessSelector{Selector: &envdpb.ProcessSelector_Pid{Pid: 8}}})
	auth(other)
	if _, err := c.CloseStdin(ctx, other); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("close stdin of a pid not held: %v", err)
	}
	list := connect.NewRequest(&envdpb.ListRequest{})
	auth(list)
	got, err := c.List(ctx, list)
	if err != nil {
		t.Fatal(err)
	}
	if ps := got.Msg.Processes; len(ps) != 1 || ps[0].Pid != 7 || ps[0].Config.Cmd != "/bin/bash" ||
		!slices.Equal(ps[0].Config.Args, []string{"-l", "-c", "sleep 9"}) || ps[0].Config.GetCwd() != "/home/user/data" {
		t.Errorf("list: %v", got.Msg.Processes)
	}
}
