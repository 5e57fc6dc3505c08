package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// commandOp is what kiln session exec's shell command flags ask for: run
// req (--cmd), or wait on, kill, write to the stdin of, or list background
// commands.
type commandOp struct {
	req     job.CommandRequest
	waitID  string
	wait    time.Duration
	killID  string
	stdinID string
	// data is --data; nil when not given: this process's stdin is written.
	data   *string
	close  bool
	list   bool
	asJSON bool
}

// sessionCommand runs kiln session exec's --cmd, --command-wait,
// --command-kill, --command-stdin or --command-list in session id.
func sessionCommand(ctx context.Context, cf clientFlags, id string, op commandOp) int {
	s, fail := openSession(ctx, cf, id, "session exec")
	if s == nil {
		return fail
	}
	var res job.CallResult
	var err error
	switch {
	case op.list:
		return listCommands(ctx, s, op.asJSON)
	case op.stdinID != "":
		return feedCommand(ctx, s, op)
	case op.killID != "":
		res, err = s.KillCommand(ctx, op.killID)
	case op.waitID != "":
		res, err = s.WaitCommand(ctx, op.waitID, op.wait)
	default:
		res, err = s.Command(ctx, op.req)
	}
	if err != nil {
		return clientFail("session exec", err)
	}
	if code := showCommandCall(res, op.asJSON); code != 0 {
		return code
	}
	cmd := res.Command
	switch {
	case cmd == nil || !cmd.Background || res.Status != job.StatusSucceeded:
		return jobExitCode(client.JobView{Result: res.Result})
	case cmd.Running && op.waitID == "" && op.killID == "":
		if !op.asJSON {
			fmt.Println(cmd.ID)
		}
		return 0
	case cmd.Running:
		fmt.Fprintf(os.Stderr, "kiln session exec: command %s is still running\n", cmd.ID)
		return 0
	case cmd.ExitCode != nil:
		return *cmd.ExitCode
	}
	return 0
}

// showCommandCall prints a command call's result: the API's JSON, or its
// output and the session's note.
func showCommandCall(res job.CallResult, asJSON bool) int {
	if asJSON {
		return printJobJSON(res)
	}
	writeOutput(os.Stdout, res.Stdout, res.StdoutBase64)
	writeOutput(os.Stderr, res.Stderr, res.StderrBase64)
	if !res.StateRestored && res.SessionNote != "" {
		fmt.Fprintf(os.Stderr, "kiln session exec: %s\n", res.SessionNote)
	}
	return 0
}

// listCommands prints the session's background commands, one a line: its
// id, "running" or its exit code, and its command line.
func listCommands(ctx context.Context, s *client.Session, asJSON bool) int {
	res, err := s.Commands(ctx)
	if err != nil {
		return clientFail("session exec", err)
	}
	if asJSON {
		return printJobJSON(res)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCMD")
	for _, c := range res.Commands {
		state := "ended"
		switch {
		case c.Running && c.Stdin:
			state = "running, stdin open"
		case c.Running:
			state = "running"
		case c.ExitCode != nil:
			state = "exit " + strconv.Itoa(*c.ExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.ID, state, c.Cmd)
	}
	_ = tw.Flush()
	return 0
}

// feedCommand writes --data, or else this process's stdin to its end, to
// background command op.stdinID's stdin, closing it after with --close.
// It prints nothing (--json: the last write's answer); a stdin not open is
// an error saying so.
func feedCommand(ctx context.Context, s *client.Session, op commandOp) int {
	var res job.CallResult
	var err error
	if op.data != nil {
		res, err = s.WriteStdin(ctx, op.stdinID, *op.data, op.close)
	} else {
		res, err = writeCommandStdin(ctx, s, op.stdinID, os.Stdin, op.close)
	}
	if err != nil {
		return clientFail("session exec", err)
	}
	if op.asJSON && res.Command != nil {
		return printJobJSON(res)
	}
	return 0
}

// writeCommandStdin writes r to the stdin of background command id, a write
// per read (so a pipe's lines reach the command as they come), each at most
// job.MaxCommandInputBytes and cut between characters, then closes it when
// close. The API carries text: input that is not UTF-8 is refused rather
// than changed. The answer is the last write's (none when r was empty and
// close false). A read blocked on a terminal ends with ctx.
func writeCommandStdin(ctx context.Context, s *client.Session, id string, r io.Reader, close bool) (job.CallResult, error) {
	type chunk struct {
		b   []byte
		err error
	}
	reads := make(chan chunk)
	go func() {
		// Ends with the input; on a ctx cancelled first it stays blocked in
		// Read until the process exits, which follows at once.
		for {
			buf := make([]byte, job.MaxCommandInputBytes)
			n, err := r.Read(buf)
			select {
			case reads <- chunk{buf[:n], err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var res job.CallResult
	var carry []byte // the start of a character the last read cut
	for {
		var c chunk
		select {
		case c = <-reads:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		eof := errors.Is(c.err, io.EOF)
		if c.err != nil && !eof {
			return res, fmt.Errorf("read stdin: %w", c.err)
		}
		text := append(carry, c.b...)
		if !eof {
			n := wholeRunes(text)
			text, carry = text[:n], append([]byte(nil), text[n:]...)
		}
		// At most two writes: a read's bytes and the few carried over.
		for first := true; len(text) > 0 || (first && eof && close); first = false {
			n := len(text)
			if n > job.MaxCommandInputBytes {
				n = wholeRunes(text[:job.MaxCommandInputBytes])
			}
			part := text[:n]
			text = text[n:]
			if !utf8.Valid(part) {
				return res, errors.New("stdin is not UTF-8 text, and a command's stdin takes text")
			}
			var err error
			if res, err = s.WriteStdin(ctx, id, string(part), eof && close && len(text) == 0); err != nil {
				return res, err
			}
		}
		if eof {
			return res, nil
		}
	}
}

// wholeRunes is how much of b holds whole characters: b less the start of a
// UTF-8 character cut at its end.
func wholeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}
