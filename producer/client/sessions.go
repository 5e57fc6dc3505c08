package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Session is a session of the API: a sandbox whose interpreter and /work
// are kept between calls. Run code in it with Run; Close ends it.
type Session struct {
	c *Client
	job.Session
}

// CreateSession makes a session and returns it once its sandbox is ready.
// It retries as Submit does (a retry may make a second session when the
// first answer was lost; that one expires with its idle timeout).
func (c *Client) CreateSession(ctx context.Context, spec job.SessionSpec) (*Session, error) {
	s := &Session{c: c}
	err := c.withRetries(ctx, true, func() error {
		_, err := c.do(ctx, http.MethodPost, "/v1/sessions", spec, nil, &s.Session)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// OpenSession returns the session id, as the API shows it now.
func (c *Client) OpenSession(ctx context.Context, id string) (*Session, error) {
	s := &Session{c: c}
	if _, err := c.do(ctx, http.MethodGet, sessionPath(id), nil, nil, &s.Session); err != nil {
		return nil, err
	}
	return s, nil
}

// Sessions lists the caller's live sessions, oldest first; with tags
// ("KEY=VALUE"), only those whose metadata holds every one.
func (c *Client) Sessions(ctx context.Context, tags ...string) ([]job.Session, error) {
	var out struct {
		Sessions []job.Session `json:"sessions"`
	}
	path := "/v1/sessions"
	if len(tags) > 0 {
		q := url.Values{"tag": tags}
		path += "?" + q.Encode()
	}
	err := c.withRetries(ctx, false, func() error {
		out.Sessions = nil
		_, err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out.Sessions, nil
}

func sessionPath(id string) string { return "/v1/sessions/" + url.PathEscape(id) }

// Run runs code as the session's next call and waits for its result. Every
// try carries one Idempotency-Key, so a retry never runs the call twice.
func (s *Session) Run(ctx context.Context, code string) (job.CallResult, error) {
	return s.Exec(ctx, job.SessionCall{Code: code})
}

// Exec runs call as the session's next call and waits for its result
// (long-polling past the server's longest wait: a 202 answer is a
// job.CallPending, read again at its seq).
func (s *Session) Exec(ctx context.Context, call job.SessionCall) (job.CallResult, error) {
	return s.call(ctx, http.MethodPost, sessionPath(s.ID)+"/exec?wait="+waitParam(time.Minute), call)
}

// Command runs a shell command line in the session's sandbox (cwd /work)
// as its next call and waits for it: the result's stdout, stderr and exit
// code are the command's, and Command says where it stands. A background
// command (req.Background) answers at once; its Command.ID is for
// WaitCommand and KillCommand.
func (s *Session) Command(ctx context.Context, req job.CommandRequest) (job.CallResult, error) {
	return s.call(ctx, http.MethodPost, sessionPath(s.ID)+"/commands?wait="+waitParam(time.Minute), req)
}

// WaitCommand waits up to wait (at most a minute) for background command
// id to end and answers where it stands, with everything it wrote so far.
// An id the session's interpreter does not hold is an *Error matching
// ErrNotFound.
func (s *Session) WaitCommand(ctx context.Context, id string, wait time.Duration) (job.CallResult, error) {
	return s.call(ctx, http.MethodGet, sessionPath(s.ID)+"/commands/"+url.PathEscape(id)+"?wait="+waitParam(wait), nil)
}

// KillCommand kills background command id (its process group) and answers
// where it stands.
func (s *Session) KillCommand(ctx context.Context, id string) (job.CallResult, error) {
	return s.call(ctx, http.MethodPost, sessionPath(s.ID)+"/commands/"+url.PathEscape(id)+"/kill", nil)
}

// Commands lists the session's background commands (the ones its
// interpreter holds, running or ended), oldest first: the result's
// Commands.
func (s *Session) Commands(ctx context.Context) (job.CallResult, error) {
	return s.call(ctx, http.MethodGet, sessionPath(s.ID)+"/commands?wait="+waitParam(time.Minute), nil)
}

// WriteStdin writes data to the stdin of background command id (one
// started with Stdin) and closes its stdin after it when close is true. A
// stdin that is not open is an *Error matching ErrStdinClosed.
func (s *Session) WriteStdin(ctx context.Context, id string, data string, close bool) (job.CallResult, error) {
	return s.call(ctx, http.MethodPost, sessionPath(s.ID)+"/commands/"+url.PathEscape(id)+"/stdin?wait="+waitParam(time.Minute),
		job.StdinRequest{Data: data, Close: close})
}

// CancelCall cancels call seq of the session: one still waiting behind the
// session's earlier calls is withdrawn and never runs, a running one is
// interrupted (the interpreter and its state stay), one that ended is
// left as it is. It waits for the call's result: canceled, unless the call
// ended first. A seq the session has no call of is an *Error matching
// ErrNotFound.
func (s *Session) CancelCall(ctx context.Context, seq int64) (job.CallResult, error) {
	return s.call(ctx, http.MethodPost, fmt.Sprintf("%s/calls/%d/cancel?wait=%s", sessionPath(s.ID), seq, waitParam(time.Minute)), nil)
}

// Start sends call as the session's next call and answers at once, without
// waiting for it to run: done is true when the call had already ended and
// res is its result; otherwise res holds only the call's Seq, which
// WaitCall waits on and CancelCall cancels. The call is made once however
// often the request is retried (one Idempotency-Key).
func (s *Session) Start(ctx context.Context, call job.SessionCall) (res job.CallResult, done bool, err error) {
	status, raw, err := s.send(ctx, http.MethodPost, sessionPath(s.ID)+"/exec?wait=0s", call)
	if err != nil {
		return res, false, err
	}
	if status == http.StatusAccepted {
		var p job.CallPending
		if err := json.Unmarshal(raw, &p); err != nil {
			return res, false, fmt.Errorf("kiln client: decode a pending call: %w", err)
		}
		res.Seq = p.Seq
		return res, false, nil
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return res, false, fmt.Errorf("kiln client: decode a call's result: %w", err)
	}
	return res, true, nil
}

// WaitCall waits for call seq of the session to end (long-polling past the
// server's longest wait) and answers its result. Its context ending leaves
// the call as it is: CancelCall stops it.
func (s *Session) WaitCall(ctx context.Context, seq int64) (job.CallResult, error) {
	status, raw, err := s.readCall(ctx, seq)
	if err != nil {
		return job.CallResult{}, err
	}
	return s.wait(ctx, status, raw)
}

// call sends a request that makes a call of the session and waits for the
// call's result. Every try carries one Idempotency-Key, so a retry never
// makes the call twice.
func (s *Session) call(ctx context.Context, method, path string, body any) (job.CallResult, error) {
	status, raw, err := s.send(ctx, method, path, body)
	if err != nil {
		return job.CallResult{}, err
	}
	return s.wait(ctx, status, raw)
}

// send sends a request that makes a call of the session, each try with one
// Idempotency-Key, and answers the first answer's status and body.
func (s *Session) send(ctx context.Context, method, path string, body any) (int, json.RawMessage, error) {
	hdr := http.Header{}
	hdr.Set("Idempotency-Key", job.NewID())
	var status int
	var raw json.RawMessage
	err := s.c.withRetries(ctx, false, func() (err error) {
		status, err = s.c.do(ctx, method, path, body, hdr, &raw)
		return err
	})
	return status, raw, err
}

// wait reads a call's answer: a 202 is a job.CallPending, read again at its
// seq until the call has ended.
func (s *Session) wait(ctx context.Context, status int, raw json.RawMessage) (job.CallResult, error) {
	var res job.CallResult
	var err error
	for err == nil && status == http.StatusAccepted {
		var p job.CallPending
		if err = json.Unmarshal(raw, &p); err != nil {
			return res, fmt.Errorf("kiln client: decode a pending call: %w", err)
		}
		status, raw, err = s.readCall(ctx, p.Seq)
	}
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return res, fmt.Errorf("kiln client: decode a call's result: %w", err)
	}
	return res, nil
}

// readCall long-polls call seq once.
func (s *Session) readCall(ctx context.Context, seq int64) (int, json.RawMessage, error) {
	var raw json.RawMessage
	status, err := s.c.do(ctx, http.MethodGet, fmt.Sprintf("%s/calls/%d?wait=%s", sessionPath(s.ID), seq, waitParam(time.Minute)), nil, nil, &raw)
	return status, raw, err
}

// Refresh reads the session again.
func (s *Session) Refresh(ctx context.Context) error {
	_, err := s.c.do(ctx, http.MethodGet, sessionPath(s.ID), nil, nil, &s.Session)
	return err
}

// Pause frees the session's sandbox and memory once the calls accepted
// before have ended, keeping its files; it returns once the session is
// paused (long-polling past the server's longest wait).
func (s *Session) Pause(ctx context.Context) error {
	for {
		status, err := s.c.do(ctx, http.MethodPost, sessionPath(s.ID)+"/pause?wait="+waitParam(time.Minute), nil, nil, &s.Session)
		if err != nil || status != http.StatusAccepted {
			return err
		}
	}
}

// Resume brings a paused session back on a worker; s.Restored then says
// what came back (job.RestoredFilesVariables, job.RestoredFiles,
// job.RestoredFilesReplay). A session that is not paused is read as it is.
func (s *Session) Resume(ctx context.Context) error {
	_, err := s.c.do(ctx, http.MethodPost, sessionPath(s.ID)+"/resume", nil, nil, &s.Session)
	return err
}

// Close ends the session and removes its sandbox.
func (s *Session) Close(ctx context.Context) error {
	_, err := s.c.do(ctx, http.MethodDelete, sessionPath(s.ID), nil, nil, &s.Session)
	return err
}
