package e2bapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
	"github.com/kilnrun/kiln/e2bapi/envdpb/envdpbconnect"
	"github.com/kilnrun/kiln/job"
)

// envd's process service (E2B's commands) over a session's background
// commands (job/session_commands.go): Start starts the command line as a
// background command of the session and follows it, its pid the command's
// id; Connect follows one already started; SendSignal kills it; SendInput
// and CloseStdin write to and close its stdin; List lists the running
// ones. Following
// is a series of waits on the command, each a call of the session (so the
// session's other calls run between them), each sending what the command
// wrote since the last.

// Following a command: each wait on it lasts followWaitMin at first,
// doubling while it writes nothing, up to followWaitMax (so a quiet
// command holds the session little, and one that writes is seen soon).
const (
	followWaitMin = 250 * time.Millisecond
	followWaitMax = 2 * time.Second
)

// processes is envd's process service over a session's commands.
type processes struct {
	envdpbconnect.UnimplementedProcessHandler
	s *Surface
}

type writerCtx struct{}

// mount serves envd's process service (Connect) on mux.
func (p processes) mount(mux *http.ServeMux) {
	s := p.s
	path, h := envdpbconnect.NewProcessHandler(p)
	mux.Handle(path, s.sandboxed(func(w http.ResponseWriter, r *http.Request, tenant, id string) {
		ctx := context.WithValue(r.Context(), sandboxCtx{}, sandboxRef{tenant, id})
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, writerCtx{}, http.NewResponseController(w))))
	}))
}

// commandLine is the shell command line that runs c: its words quoted,
// exec'd in its working directory (a path of the sandbox's files, E2B's
// home by default).
func commandLine(c *envdpb.ProcessConfig) (string, error) {
	if c == nil || c.Cmd == "" {
		return "", errors.New("process.cmd is empty: name the program to run")
	}
	words := make([]string, 0, 1+len(c.Args))
	for _, w := range append([]string{c.Cmd}, c.Args...) {
		if strings.ContainsRune(w, 0) {
			return "", errors.New("a process's command and arguments hold no NUL byte")
		}
		words = append(words, shellQuote(w))
	}
	line := "exec " + strings.Join(words, " ")
	if c.Cwd != nil && *c.Cwd != "" {
		rel, err := workPath(*c.Cwd)
		if err != nil {
			return "", err
		}
		line = "cd " + shellQuote(strings.TrimSuffix("/work/"+rel, "/")) + " && " + line
	}
	return line, nil
}

// shellQuote is s as one word of a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pidOf is a command id as E2B's pid, and back.
func pidOf(cid string) (uint32, error) {
	n, err := strconv.ParseUint(cid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("command id %q is not a pid", cid)
	}
	return uint32(n), nil
}

func commandID(sel *envdpb.ProcessSelector) (string, error) {
	switch v := sel.GetSelector().(type) {
	case *envdpb.ProcessSelector_Pid:
		return strconv.FormatUint(uint64(v.Pid), 10), nil
	case *envdpb.ProcessSelector_Tag:
		return "", connect.NewError(connect.CodeUnimplemented, errors.New("processes are named by pid on Kiln; tags are not kept (docs/e2b.md)"))
	}
	return "", connect.NewError(connect.CodeInvalidArgument, errors.New("process: name it by pid"))
}

// Start runs the command line in the background of the session and
// follows it to its end.
func (p processes) Start(ctx context.Context, req *connect.Request[envdpb.StartRequest], stream *connect.ServerStream[envdpb.StartResponse]) error {
	switch {
	case req.Msg.Pty != nil:
		return connect.NewError(connect.CodeUnimplemented, errors.New("terminals (pty) are not served by Kiln; run the command without one (docs/e2b.md)"))
	}
	line, err := commandLine(req.Msg.Process)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	c := job.CommandRequest{Cmd: line, Background: true, Env: req.Msg.Process.GetEnvs(), Stdin: req.Msg.GetStdin()}
	if err := c.Validate(); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	ref := sandboxOf(ctx)
	o := p.s.runToEnd(ctx, ref.tenant, ref.id, job.SessionCall{Command: &job.SessionCommand{Cmd: c.Cmd, Background: true, Env: c.Env, Stdin: c.Stdin}}, nil)
	if err := o.commandErr(); err != nil {
		return connectError(err)
	}
	if o.res.Command.ID == "" {
		return connect.NewError(connect.CodeInternal, errors.New("the session started no background command"))
	}
	pid, err := pidOf(o.res.Command.ID)
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	send := func(ev *envdpb.ProcessEvent) error {
		return sendWithin(ctx, func() error { return stream.Send(&envdpb.StartResponse{Event: ev}) })
	}
	if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Start{Start: &envdpb.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	return p.follow(ctx, ref, o.res.Command.ID, 0, 0, keepAliveOf(req.Header()), send)
}

// Connect follows a command started before, from what it writes next.
func (p processes) Connect(ctx context.Context, req *connect.Request[envdpb.ConnectRequest], stream *connect.ServerStream[envdpb.ConnectResponse]) error {
	cid, err := commandID(req.Msg.Process)
	if err != nil {
		return err
	}
	pid, err := pidOf(cid)
	if err != nil {
		return connect.NewError(connect.CodeNotFound, err)
	}
	ref := sandboxOf(ctx)
	res, err := p.wait(ctx, ref, cid, 0)
	if err != nil {
		return err
	}
	send := func(ev *envdpb.ProcessEvent) error {
		return sendWithin(ctx, func() error { return stream.Send(&envdpb.ConnectResponse{Event: ev}) })
	}
	if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Start{Start: &envdpb.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	if !res.Command.Running {
		return send(endEvent(res.Command))
	}
	return p.follow(ctx, ref, cid, len(res.Stdout), len(res.Stderr), keepAliveOf(req.Header()), send)
}

// SendSignal ends a command: SIGTERM and SIGKILL both kill its process
// group.
func (p processes) SendSignal(ctx context.Context, req *connect.Request[envdpb.SendSignalRequest]) (*connect.Response[envdpb.SendSignalResponse], error) {
	cid, err := commandID(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if _, err := pidOf(cid); err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	ref := sandboxOf(ctx)
	o := p.s.runToEnd(ctx, ref.tenant, ref.id, job.SessionCall{Command: &job.SessionCommand{Op: job.CommandKill, ID: cid}}, nil)
	if err := o.commandErr(); err != nil {
		return nil, connectError(err)
	}
	if o.res.Command.Missing {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", cid))
	}
	return connect.NewResponse(&envdpb.SendSignalResponse{}), nil
}

// SendInput writes to a command's stdin (one started with stdin true).
func (p processes) SendInput(ctx context.Context, req *connect.Request[envdpb.SendInputRequest]) (*connect.Response[envdpb.SendInputResponse], error) {
	in := req.Msg.GetInput()
	if in.GetPty() != nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("terminals (pty) are not served by Kiln (docs/e2b.md)"))
	}
	if err := p.input(ctx, req.Msg.Process, in.GetStdin(), false); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.SendInputResponse{}), nil
}

// CloseStdin closes a command's stdin: it reads the end of its input.
func (p processes) CloseStdin(ctx context.Context, req *connect.Request[envdpb.CloseStdinRequest]) (*connect.Response[envdpb.CloseStdinResponse], error) {
	if err := p.input(ctx, req.Msg.Process, nil, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.CloseStdinResponse{}), nil
}

// input writes data to the stdin of the command sel names, in parts of at
// most job.MaxCommandInputBytes, and closes it after them when close.
func (p processes) input(ctx context.Context, sel *envdpb.ProcessSelector, data []byte, close bool) error {
	cid, err := commandID(sel)
	if err != nil {
		return err
	}
	if _, err := pidOf(cid); err != nil {
		return connect.NewError(connect.CodeNotFound, err)
	}
	ref := sandboxOf(ctx)
	for first := true; first || len(data) > 0; first = false {
		part := data[:min(len(data), job.MaxCommandInputBytes)]
		data = data[len(part):]
		o := p.s.runToEnd(ctx, ref.tenant, ref.id, job.SessionCall{Command: &job.SessionCommand{Op: job.CommandInput, ID: cid,
			Input: part, CloseStdin: close && len(data) == 0}}, nil)
		if err := o.commandErr(); err != nil {
			return connectError(err)
		}
		switch c := o.res.Command; {
		case c.Missing:
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", cid))
		case c.StdinClosed:
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %s has no open stdin (started without stdin, closed, or no longer reading it)", cid))
		}
	}
	return nil
}

// List lists the sandbox's running commands.
func (p processes) List(ctx context.Context, _ *connect.Request[envdpb.ListRequest]) (*connect.Response[envdpb.ListResponse], error) {
	ref := sandboxOf(ctx)
	o := p.s.runToEnd(ctx, ref.tenant, ref.id, job.SessionCall{Command: &job.SessionCommand{Op: job.CommandList}}, nil)
	if o.err != nil {
		return nil, connectError(o.err)
	}
	if o.res.Status != job.StatusSucceeded {
		return nil, connectError((callOutcome{res: o.res}).commandErr())
	}
	out := &envdpb.ListResponse{}
	for _, c := range o.res.Commands {
		pid, err := pidOf(c.ID)
		if err != nil || !c.Running {
			continue
		}
		out.Processes = append(out.Processes, &envdpb.ProcessInfo{Pid: pid, Config: processConfig(c.Cmd)})
	}
	return connect.NewResponse(out), nil
}

// processConfig is the process config a command line of commandLine's
// stands for (its words, its working directory); a line of another form
// is run by the shell.
func processConfig(line string) *envdpb.ProcessConfig {
	cwd := "/home/user"
	rest := line
	if dir, after, ok := strings.Cut(rest, " && "); ok && strings.HasPrefix(dir, "cd ") {
		if w, tail, ok := shellWord(strings.TrimPrefix(dir, "cd ")); ok && tail == "" {
			cwd, rest = "/home/user"+strings.TrimPrefix(w, "/work"), after
		}
	}
	if words, ok := shellWords(strings.TrimPrefix(rest, "exec ")); ok && strings.HasPrefix(rest, "exec ") && len(words) > 0 {
		return &envdpb.ProcessConfig{Cmd: words[0], Args: words[1:], Cwd: &cwd}
	}
	return &envdpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", line}, Cwd: &cwd}
}

// shellWords splits s into the words shellQuote made, one space apart.
func shellWords(s string) ([]string, bool) {
	var words []string
	for s != "" {
		w, tail, ok := shellWord(s)
		if !ok {
			return nil, false
		}
		words = append(words, w)
		if s = tail; s != "" {
			if s[0] != ' ' {
				return nil, false
			}
			s = s[1:]
		}
	}
	return words, true
}

// shellWord reads one word shellQuote made at the start of s: quoted parts
// and \' between them.
func shellWord(s string) (word, tail string, ok bool) {
	var b strings.Builder
	read := false
	for len(s) > 0 {
		if strings.HasPrefix(s, `\'`) {
			b.WriteByte('\'')
			s, read = s[2:], true
			continue
		}
		if s[0] != '\'' {
			break
		}
		end := strings.IndexByte(s[1:], '\'')
		if end < 0 {
			return "", "", false
		}
		b.WriteString(s[1 : 1+end])
		s, read = s[2+end:], true
	}
	return b.String(), s, read
}

// wait waits at most d for command cid and answers where it stands with
// its output so far.
func (p processes) wait(ctx context.Context, ref sandboxRef, cid string, d time.Duration) (*job.CallResult, error) {
	ms := d.Milliseconds()
	o := p.s.runToEnd(ctx, ref.tenant, ref.id, job.SessionCall{Limits: job.Limits{TimeoutMS: ms + 30_000},
		Command: &job.SessionCommand{Op: job.CommandWait, ID: cid, WaitMS: ms}}, nil)
	if err := o.commandErr(); err != nil {
		return nil, connectError(err)
	}
	if o.res.Command.Missing {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found (a sandbox whose interpreter started anew has none of its predecessor's)", cid))
	}
	return o.res, nil
}

// follow waits on command cid until it ends, sending what it writes past
// outOff and errOff of its stdout and stderr, a keep-alive when it wrote
// nothing for keepAlive, and its end.
func (p processes) follow(ctx context.Context, ref sandboxRef, cid string, outOff, errOff int, keepAlive time.Duration, send func(*envdpb.ProcessEvent) error) error {
	d := followWaitMin
	quietSince := time.Now()
	for {
		res, err := p.wait(ctx, ref, cid, d)
		if err != nil {
			return err
		}
		wrote := false
		for _, part := range []struct {
			text string
			off  *int
			data func([]byte) *envdpb.ProcessEvent_DataEvent
		}{
			{res.Stdout, &outOff, func(b []byte) *envdpb.ProcessEvent_DataEvent {
				return &envdpb.ProcessEvent_DataEvent{Output: &envdpb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			}},
			{res.Stderr, &errOff, func(b []byte) *envdpb.ProcessEvent_DataEvent {
				return &envdpb.ProcessEvent_DataEvent{Output: &envdpb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			}},
		} {
			if len(part.text) <= *part.off {
				continue
			}
			if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Data{Data: part.data([]byte(part.text[*part.off:]))}}); err != nil {
				return err
			}
			*part.off, wrote = len(part.text), true
		}
		if !res.Command.Running {
			return send(endEvent(res.Command))
		}
		if wrote {
			d, quietSince = followWaitMin, time.Now()
			continue
		}
		d = min(2*d, followWaitMax)
		if keepAlive > 0 && time.Since(quietSince) >= keepAlive {
			if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Keepalive{Keepalive: &envdpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			quietSince = time.Now()
		}
	}
}

// sendWithin sends one event of a stream (a command's, a watch's) with a
// write deadline of its own, so a stream may last as long as what it
// follows and only a client that stops reading ends it.
func sendWithin(ctx context.Context, f func() error) error {
	if rc, ok := ctx.Value(writerCtx{}).(*http.ResponseController); ok {
		_ = rc.SetWriteDeadline(time.Now().Add(writeGrace))
	}
	return f()
}

// endEvent is a command's end as envd reports it.
func endEvent(c *job.CommandState) *envdpb.ProcessEvent {
	code := 0
	if c.ExitCode != nil {
		code = *c.ExitCode
	}
	end := &envdpb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: !c.Killed, Status: fmt.Sprintf("exit status %d", code)}
	if c.Killed {
		end.Status = "signal: killed"
	}
	return &envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_End{End: end}}
}

// keepAliveOf is the interval of keep-alive events a client asks for
// (Keepalive-Ping-Interval, seconds).
func keepAliveOf(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// commandErr is o's failure as a command call: the domain's refusal, or a
// call that ended without saying where its command stands (the session's
// interpreter failed it).
func (o callOutcome) commandErr() error {
	if o.err != nil {
		return o.err
	}
	if o.res.Command == nil {
		msg := "the command call ended " + string(o.res.Status)
		if o.res.Error != nil {
			msg = o.res.Error.Message
		}
		return &helperFailed{msg: msg}
	}
	return nil
}
