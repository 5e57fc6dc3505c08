package sandboxapi

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// A session's /work as the worker reads and changes it between calls: from
// the host, confined to the session's work dir (os.Root), never through a
// symbolic link the session made, and owned by the session's user. Each
// operation's error wraps one of the sentinels below (in a *FileError
// naming the path at fault) when the session's files make it impossible.
var (
	// The texts follow the path in the way: "data/x.csv does not exist".
	ErrFileNotFound = errors.New("does not exist")
	ErrFileExists   = errors.New("already exists")
	ErrNotDir       = errors.New("is not a directory")
	ErrIsDir        = errors.New("is a directory")
	ErrDirNotEmpty  = errors.New("is a directory that is not empty")
	ErrSymlink      = errors.New("is a symbolic link, and file operations do not go through links")
	ErrMoveIntoSelf = errors.New("is a directory, which cannot move under itself")
)

// FileError is a file operation refused for the state of the session's
// files: Path is the operation's path at fault (its path, or a move's
// target), At what stood in the way (Path, or one of its parents), Err one
// of the sentinels above.
type FileError struct {
	Op, Path, At string
	Err          error
}

func (e *FileError) Error() string {
	at := e.At
	if at == "" {
		at = e.Path
	}
	return e.Op + " " + e.Path + ": " + at + " " + e.Err.Error()
}
func (e *FileError) Unwrap() error { return e.Err }

// SessionFiles are the file operations of a session's box.
type SessionFiles interface {
	// Entries calls fn with every entry of /work below it, in lexical
	// order: regular files (open reads one), directories and symbolic
	// links (open is nil; a link is never followed). Call it between
	// calls.
	Entries(fn func(f SessionFile, open func() (*os.File, error)) error) error
	// Stat describes one entry (a link itself, not its target).
	Stat(name string) (SessionFile, error)
	// WriteFile writes a file (its parents made), replacing a file there;
	// mode 0 keeps a replaced file's mode (0644 for a new one), a zero
	// mtime is now. created: there was nothing at name.
	WriteFile(name string, data []byte, mode fs.FileMode, mtime time.Time) (f SessionFile, created bool, err error)
	// Mkdir makes a directory and its parents; one already there is not
	// an error (created false).
	Mkdir(name string) (f SessionFile, created bool, err error)
	// Remove removes a file, a link (not its target) or an empty
	// directory; with recursive, a directory and everything in it.
	Remove(name string, recursive bool) error
	// Move renames from to to (to's parents made); with overwrite it
	// replaces a file (or an empty directory, for a directory) at to.
	Move(from, to string, overwrite bool) (SessionFile, error)
}
