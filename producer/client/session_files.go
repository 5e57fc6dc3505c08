package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// A session's files: read as its last call left them (the checkpoint), and
// changed by file operations, each a call of the session ordered with its
// calls and done by its worker between them. Every operation carries one
// Idempotency-Key across its tries, so a retry never does it twice; one
// that waits behind a long call is asked for again with the same key until
// it is done. A refusal the session's files cause is an *Error matching
// ErrFileConflict (or ErrNotFound), never a temporary one.

// filePath is the URL path of name in session id's /work: each element
// escaped, and a . or .. element sent as such (its dots escaped), so no
// path cleaning along the way turns it into another URL; the API refuses
// it, naming the path.
func filePath(id, name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if p == "." || p == ".." {
			parts[i] = strings.ReplaceAll(p, ".", "%2E")
			continue
		}
		parts[i] = url.PathEscape(p)
	}
	return sessionPath(id) + "/files/" + strings.Join(parts, "/")
}

// ReadFile reads a file of the session's /work as its last call left it.
func (s *Session) ReadFile(ctx context.Context, name string) ([]byte, error) {
	resp, err := s.c.openStream(ctx, filePath(s.ID, name), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// WriteFile writes data as the file name of the session's /work (its
// parents made, a file there replaced) and returns its entry.
func (s *Session) WriteFile(ctx context.Context, name string, data []byte) (job.SessionFileInfo, error) {
	var out job.SessionFileInfo
	err := s.fileOp(ctx, http.MethodPut, filePath(s.ID, name), rawBody(data), &out)
	return out, err
}

// StatFile describes the entry name of the session's /work (a file, a
// directory or a symbolic link).
func (s *Session) StatFile(ctx context.Context, name string) (job.SessionFileInfo, error) {
	var out job.SessionFileInfo
	err := s.c.withRetries(ctx, false, func() error {
		_, err := s.c.do(ctx, http.MethodGet, filePath(s.ID, name)+"?stat=true", nil, nil, &out)
		return err
	})
	return out, err
}

// ListFiles lists the directory dir of the session's /work ("" for /work
// itself; with recursive, every entry below it), every page, by path.
func (s *Session) ListFiles(ctx context.Context, dir string, recursive bool) ([]job.SessionFileInfo, error) {
	out := []job.SessionFileInfo{}
	cursor := ""
	for {
		q := url.Values{}
		if dir != "" {
			q.Set("path", dir)
		}
		if recursive {
			q.Set("recursive", "true")
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		path := sessionPath(s.ID) + "/files"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		var page job.SessionFileList
		err := s.c.withRetries(ctx, false, func() error {
			page = job.SessionFileList{}
			_, err := s.c.do(ctx, http.MethodGet, path, nil, nil, &page)
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, page.Entries...)
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// RemoveFile removes the entry name of the session's /work (a directory
// only when empty, or with recursive).
func (s *Session) RemoveFile(ctx context.Context, name string, recursive bool) error {
	path := filePath(s.ID, name)
	if recursive {
		path += "?recursive=true"
	}
	return s.fileOp(ctx, http.MethodDelete, path, nil, nil)
}

// Mkdir makes the directory name (and its parents) in the session's /work;
// one already there is not an error.
func (s *Session) Mkdir(ctx context.Context, name string) (job.SessionFileInfo, error) {
	var out job.SessionFileInfo
	err := s.fileOp(ctx, http.MethodPost, sessionPath(s.ID)+"/files", job.SessionFileOp{Op: job.FileOpMkdir, Path: name}, &out)
	return out, err
}

// MoveFile renames from to to in the session's /work (to's parents made;
// with overwrite, replacing what is there) and returns the entry at to.
func (s *Session) MoveFile(ctx context.Context, from, to string, overwrite bool) (job.SessionFileInfo, error) {
	var out job.SessionFileInfo
	op := job.SessionFileOp{Op: job.FileOpMove, Path: from, To: to, Overwrite: overwrite}
	err := s.fileOp(ctx, http.MethodPost, sessionPath(s.ID)+"/files", op, &out)
	return out, err
}

// fileOp sends a file operation until it is done: a 202 (it waits behind
// the session's calls) is asked for again with the same Idempotency-Key,
// which answers the operation once it is done, never doing it twice.
func (s *Session) fileOp(ctx context.Context, method, path string, in, out any) error {
	hdr := http.Header{}
	hdr.Set("Idempotency-Key", job.NewID())
	for {
		var raw json.RawMessage
		var status int
		err := s.c.withRetries(ctx, false, func() (err error) {
			status, err = s.c.do(ctx, method, path, in, hdr, &raw)
			return err
		})
		switch {
		case err != nil:
			return err
		case status == http.StatusAccepted:
			continue
		case out == nil || status == http.StatusNoContent:
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("kiln client: %s %s: decode answer: %w", method, path, err)
		}
		return nil
	}
}
