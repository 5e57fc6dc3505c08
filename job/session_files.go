package job

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// A session's files: its /work as the API shows it (SessionFileInfo, from
// the checkpoint the worker records after each call), and the operations
// that change it between calls (SessionFileOp). An operation is a call of
// the session (SessionCall.File): it takes the next seq, so it is ordered
// with the calls, and the worker holding the session does it on the
// session's work dir from the host, never by code run in the interpreter.

// Bounds of the files API.
const (
	// SessionFilePathMax bounds a path under /work, in bytes.
	SessionFilePathMax = 1024
	// SessionFileListMax bounds the entries of one page of a listing.
	SessionFileListMax = 1000
	// SessionFilesMaxEntries bounds the entries of /work (files,
	// directories, links) a checkpoint records; past it /work is not
	// checkpointed (the previous checkpoint stays).
	SessionFilesMaxEntries = 10000
)

// SessionVariablesFile is where, under /work, a pausing python session's
// interpreter keeps its variables (pickled) for its resume, which loads and
// removes it. The checkpoint keeps it with the files; the API never lists
// or serves it (cache.SessionRecord.Variables).
const SessionVariablesFile = ".kiln-variables.pickle"

// Kinds of a session's files (SessionFileInfo.Type).
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
)

// File operations (SessionFileOp.Op).
const (
	FileOpPut    = "put"    // write Path from Content (parents made)
	FileOpRemove = "remove" // remove Path (a directory with Recursive)
	FileOpMkdir  = "mkdir"  // make the directory Path (parents made)
	FileOpMove   = "move"   // rename Path to To (To's parents made)
)

// SessionFileOp is a file operation on a session's /work. The body of POST
// /v1/sessions/{id}/files is one (op mkdir or move); PUT and DELETE
// /v1/sessions/{id}/files/{path} make the others.
type SessionFileOp struct {
	Op string `json:"op"`
	// Path is the file or directory operated on, relative to /work.
	Path string `json:"path"`
	// To is where a move puts Path, relative to /work.
	To string `json:"to,omitempty"`
	// Overwrite lets a move replace what is at To (a file, or an empty
	// directory when Path is one).
	Overwrite bool `json:"overwrite,omitempty"`
	// Recursive lets a remove take a directory and everything in it.
	Recursive bool `json:"recursive,omitempty"`
	// Content is a put's file, stored by the API in the object store
	// under the session's tenant (never sent by a client: the body's
	// schema refuses it).
	Content *ObjectRef `json:"content,omitempty"`
}

// Validate checks what the operation alone can tell: its kind and paths.
func (o SessionFileOp) Validate() error {
	switch o.Op {
	case FileOpPut, FileOpRemove, FileOpMkdir:
		if o.To != "" || o.Overwrite {
			return invalid("to", fmt.Sprintf("op %s takes no to or overwrite: they are a move's", o.Op))
		}
	case FileOpMove:
		if err := ValidSessionFilePath(o.To); err != nil {
			return fieldRenamedTo(err, "to")
		}
		if o.To == o.Path {
			return invalid("to", fmt.Sprintf("to is path (%q): a move needs another name", o.Path))
		}
	default:
		return invalid("op", fmt.Sprintf("op is %q; it must be %q or %q", o.Op, FileOpMkdir, FileOpMove))
	}
	if o.Recursive && o.Op != FileOpRemove {
		return invalid("recursive", "recursive is a remove's")
	}
	return ValidSessionFilePath(o.Path)
}

// Describe says what the operation does, in a line (audit records, logs);
// "" for no operation.
func (o *SessionFileOp) Describe() string {
	if o == nil {
		return ""
	}
	s := "file " + o.Op + " " + o.Path
	switch {
	case o.Op == FileOpMove:
		s += " -> " + o.To
	case o.Content != nil:
		s += fmt.Sprintf(" (%d bytes, sha256 %s)", o.Content.Size, o.Content.SHA256)
	}
	return s
}

func fieldRenamedTo(err error, field string) error {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return &InvalidError{Field: field, Message: ie.Message}
	}
	return err
}

// ValidSessionFilePath reports whether p may name a file of a session's
// /work in the files API: relative, at most SessionFilePathMax bytes, no
// empty, . or .. element, no NUL.
func ValidSessionFilePath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || len(p) > SessionFilePathMax || strings.IndexByte(p, 0) >= 0 {
		return invalid("path", fmt.Sprintf("file path %q must be a relative path under /work of at most %d bytes", p, SessionFilePathMax))
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return invalid("path", fmt.Sprintf("file path %q must not hold empty, . or .. elements: it must stay under /work", p))
		}
	}
	return nil
}

// Why a file operation could not be done (SessionFileError.Code): each is
// a state of the session's /work, so the same operation fails again until
// the session's files change; none is worth retrying as it is.
const (
	FileErrNotFound     = "not_found"       // the path (or a parent) does not exist
	FileErrExists       = "exists"          // something is already there (mkdir over a file; a move without overwrite)
	FileErrNotDir       = "not_a_directory" // a parent of the path is a file
	FileErrIsDir        = "is_a_directory"  // a file operation on a directory
	FileErrNotEmpty     = "not_empty"       // a directory holds entries (remove without recursive, move over it)
	FileErrSymlink      = "symlink"         // the path goes through (or writes to) a symbolic link the session made
	FileErrMoveIntoSelf = "move_into_self"  // a directory moved under itself
	FileErrTooLarge     = "too_large"       // the session's files would pass what is checkpointed
)

// SessionFileError is why a file operation was not done, as the worker
// records it; the API answers it as a problem (404, 409, 413 or 422).
type SessionFileError struct {
	Code string `json:"code"`
	// Field is the operation's input at fault: "path" or "to".
	Field  string `json:"field,omitempty"`
	Detail string `json:"detail"`
	// Limit is the bound passed (too_large: bytes).
	Limit int64 `json:"limit,omitempty"`
}

func (e *SessionFileError) Error() string { return e.Detail }

// SessionFileOutcome is a file operation's outcome, on its call's result
// (GET /v1/sessions/{id}/calls/{seq} of the operation's seq).
type SessionFileOutcome struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	To   string `json:"to,omitempty"`
	// Entry is what put, mkdir or move left at the path (at To for a
	// move); absent for a remove and on failure.
	Entry *SessionFileInfo `json:"entry,omitempty"`
	// Created: put or mkdir made the entry (it was not there).
	Created bool `json:"created,omitempty"`
	// Error is why the operation was not done.
	Error *SessionFileError `json:"error,omitempty"`
}

// SessionFileInfo is an entry of a session's /work as the API shows it.
type SessionFileInfo struct {
	// Path is the entry's path under /work; Name its last element.
	Path string `json:"path"`
	Name string `json:"name"`
	// Type is FileTypeFile, FileTypeDir or FileTypeSymlink.
	Type string `json:"type"`
	// Size in bytes (a file's content; a link's target's length; 0 for a
	// directory).
	Size int64 `json:"size"`
	// Mode is the permission bits, in octal ("0644").
	Mode  string    `json:"mode"`
	MTime time.Time `json:"mtime"`
	// SHA256 is a file's content hash (the download's ETag).
	SHA256 string `json:"sha256,omitempty"`
}

// SessionFileList is GET /v1/sessions/{id}/files: a directory's entries
// (every entry below it with recursive), by path, a page at a time.
type SessionFileList struct {
	// Path is the directory listed ("" for /work).
	Path    string            `json:"path"`
	Entries []SessionFileInfo `json:"entries"`
	// NextCursor, when set, reads the next page (?cursor=).
	NextCursor string `json:"next_cursor,omitempty"`
}

// Info is the entry as the API shows it.
func (e SessionFileEntry) Info() SessionFileInfo {
	t := e.Type
	if t == "" {
		t = FileTypeFile // checkpoints before directories were recorded
	}
	return SessionFileInfo{Path: e.Name, Name: path.Base(e.Name), Type: t, Size: e.Size,
		Mode: fmt.Sprintf("%04o", e.Mode&0o7777), MTime: e.MTime.UTC(), SHA256: e.SHA256}
}

// IsFile reports whether the entry is a regular file (its content in the
// object store).
func (e SessionFileEntry) IsFile() bool { return e.Type == "" || e.Type == FileTypeFile }
