package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/kilnrun/kiln/internal/sandboxapi"
)

// A session's /work as the worker changes it between calls (the files API:
// upload, mkdir, move, remove; the checkpoint's walk). Every operation runs
// on the host, in the session's work dir opened as an os.Root, so nothing
// it does can reach outside /work whatever the session planted there; on
// top of that it refuses outright a path that goes through a symbolic link
// (the session's own links are its business inside the box, not a way for
// the worker to write), and names what stood in the way (a
// sandboxapi.FileError). What it makes is owned by the session's user.

// Errors of the files API (sandboxapi).
var (
	ErrFileNotFound = sandboxapi.ErrFileNotFound
	ErrFileExists   = sandboxapi.ErrFileExists
	ErrNotDir       = sandboxapi.ErrNotDir
	ErrIsDir        = sandboxapi.ErrIsDir
	ErrDirNotEmpty  = sandboxapi.ErrDirNotEmpty
	ErrSymlink      = sandboxapi.ErrSymlink
	ErrMoveIntoSelf = sandboxapi.ErrMoveIntoSelf
)

// FileError is a file operation the session's files make impossible.
type FileError = sandboxapi.FileError

// workRoot opens the session's work dir, once the box still serves.
func (s *Session) workRoot() (*os.Root, error) {
	if !s.Alive() {
		return nil, ErrSessionGone
	}
	root, err := os.OpenRoot(s.work.dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: session files: %w", err)
	}
	return root, nil
}

// validName refuses a name that is not a plain relative path (the API
// has checked it; this keeps the box's own guarantee).
func validName(names ...string) error {
	for _, n := range names {
		if !fs.ValidPath(n) || n == "." {
			return fmt.Errorf("sandbox: session file %q is not a relative path under /work", n)
		}
	}
	return nil
}

// hostUID is the session's user on the host (owner of what /work holds).
func (s *Session) hostUID() int { return s.sb.box.base + s.work.uid }

// Entries calls fn with every entry below /work in lexical order: regular
// files (open reads one, never through a link), directories and symbolic
// links (open nil). Other kinds (fifos, sockets) are not reported.
func (s *Session) Entries(fn func(f SessionFile, open func() (*os.File, error)) error) error {
	root, err := s.workRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	return fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		t := d.Type()
		if !t.IsRegular() && !t.IsDir() && t&fs.ModeSymlink == 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var open func() (*os.File, error)
		if t.IsRegular() {
			open = func() (*os.File, error) { return root.OpenFile(name, os.O_RDONLY|noFollow, 0) }
		}
		return fn(fileOf(name, info), open)
	})
}

// Stat describes the entry at name (a link itself, not its target).
func (s *Session) Stat(name string) (SessionFile, error) {
	if err := validName(name); err != nil {
		return SessionFile{}, err
	}
	root, err := s.workRoot()
	if err != nil {
		return SessionFile{}, err
	}
	defer root.Close()
	if err := checkParents(root, "stat", name); err != nil {
		return SessionFile{}, err
	}
	info, err := root.Lstat(name)
	if err != nil {
		return SessionFile{}, fileErr("stat", name, name, err)
	}
	return fileOf(name, info), nil
}

// WriteFile writes data to name (its parents made), replacing a regular
// file there: written beside it and renamed over it, so the interpreter's
// open handles keep the old content and a file hard-linked elsewhere is
// not written through. A directory or a link at name is refused.
func (s *Session) WriteFile(name string, data []byte, mode fs.FileMode, mtime time.Time) (SessionFile, bool, error) {
	const op = "put"
	if err := validName(name); err != nil {
		return SessionFile{}, false, err
	}
	root, err := s.workRoot()
	if err != nil {
		return SessionFile{}, false, err
	}
	defer root.Close()
	if err := checkParents(root, op, name); err != nil {
		return SessionFile{}, false, err
	}
	old, err := root.Lstat(name)
	created := errors.Is(err, fs.ErrNotExist)
	switch {
	case created:
		mode = cmpMode(mode, 0o644)
	case err != nil:
		return SessionFile{}, false, fileErr(op, name, name, err)
	case old.Mode()&fs.ModeSymlink != 0:
		return SessionFile{}, false, &FileError{Op: op, Path: name, At: name, Err: ErrSymlink}
	case old.IsDir():
		return SessionFile{}, false, &FileError{Op: op, Path: name, At: name, Err: ErrIsDir}
	case !old.Mode().IsRegular():
		return SessionFile{}, false, &FileError{Op: op, Path: name, At: name, Err: ErrFileExists}
	default:
		mode = cmpMode(mode, old.Mode().Perm())
	}
	if err := s.makeParents(root, op, name); err != nil {
		return SessionFile{}, false, err
	}
	tmp := path.Join(path.Dir(name), ".kiln-put-"+randomHex(8))
	if err := s.writeNew(root, tmp, data, mode, mtime); err != nil {
		_ = root.Remove(tmp)
		return SessionFile{}, false, fmt.Errorf("sandbox: session file %s: %w", name, err)
	}
	if err := root.Rename(tmp, name); err != nil {
		_ = root.Remove(tmp)
		return SessionFile{}, false, fileErr(op, name, name, err)
	}
	info, err := root.Lstat(name)
	if err != nil {
		return SessionFile{}, false, fileErr(op, name, name, err)
	}
	return fileOf(name, info), created, nil
}

// writeNew creates name (which must not exist) with data, owned by the
// session's user.
func (s *Session) writeNew(root *os.Root, name string, data []byte, mode fs.FileMode, mtime time.Time) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chown(s.hostUID(), s.hostUID())
	}
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && !mtime.IsZero() {
		err = root.Chtimes(name, mtime, mtime)
	}
	return err
}

// Mkdir makes the directory name and its parents; one already there is
// not an error (created false), anything else there is ErrFileExists.
func (s *Session) Mkdir(name string) (SessionFile, bool, error) {
	const op = "mkdir"
	if err := validName(name); err != nil {
		return SessionFile{}, false, err
	}
	root, err := s.workRoot()
	if err != nil {
		return SessionFile{}, false, err
	}
	defer root.Close()
	if err := checkParents(root, op, name); err != nil {
		return SessionFile{}, false, err
	}
	info, err := root.Lstat(name)
	switch {
	case err == nil && info.IsDir():
		return fileOf(name, info), false, nil
	case err == nil && info.Mode()&fs.ModeSymlink != 0:
		return SessionFile{}, false, &FileError{Op: op, Path: name, At: name, Err: ErrSymlink}
	case err == nil:
		return SessionFile{}, false, &FileError{Op: op, Path: name, At: name, Err: ErrFileExists}
	case !errors.Is(err, fs.ErrNotExist):
		return SessionFile{}, false, fileErr(op, name, name, err)
	}
	if err := s.makeDirs(root, op, name, name); err != nil {
		return SessionFile{}, false, err
	}
	if info, err = root.Lstat(name); err != nil {
		return SessionFile{}, false, fileErr(op, name, name, err)
	}
	return fileOf(name, info), true, nil
}

// Remove removes the file, link (never its target) or empty directory at
// name; with recursive, a directory and everything in it.
func (s *Session) Remove(name string, recursive bool) error {
	const op = "remove"
	if err := validName(name); err != nil {
		return err
	}
	root, err := s.workRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := checkParents(root, op, name); err != nil {
		return err
	}
	info, err := root.Lstat(name)
	if err != nil {
		return fileErr(op, name, name, err)
	}
	if info.IsDir() && recursive {
		err = root.RemoveAll(name)
	} else {
		err = root.Remove(name)
	}
	if err != nil {
		return fileErr(op, name, name, err)
	}
	return nil
}

// Move renames from to to (to's parents made). Without overwrite anything
// at to is ErrFileExists; with it, a file (or, for a directory, an empty
// directory) there is replaced. A link at from moves as itself.
func (s *Session) Move(from, to string, overwrite bool) (SessionFile, error) {
	const op = "move"
	if err := validName(from, to); err != nil {
		return SessionFile{}, err
	}
	root, err := s.workRoot()
	if err != nil {
		return SessionFile{}, err
	}
	defer root.Close()
	if err := checkParents(root, op, from); err != nil {
		return SessionFile{}, err
	}
	if err := checkParents(root, op, to); err != nil {
		return SessionFile{}, err
	}
	src, err := root.Lstat(from)
	if err != nil {
		return SessionFile{}, fileErr(op, from, from, err)
	}
	if src.IsDir() && strings.HasPrefix(to, from+"/") {
		return SessionFile{}, &FileError{Op: op, Path: to, At: from, Err: ErrMoveIntoSelf}
	}
	dst, err := root.Lstat(to)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return SessionFile{}, fileErr(op, to, to, err)
	case !overwrite:
		return SessionFile{}, &FileError{Op: op, Path: to, At: to, Err: ErrFileExists}
	case dst.IsDir() && !src.IsDir():
		return SessionFile{}, &FileError{Op: op, Path: to, At: to, Err: ErrIsDir}
	case !dst.IsDir() && src.IsDir():
		return SessionFile{}, &FileError{Op: op, Path: to, At: to, Err: ErrNotDir}
	}
	if err := s.makeParents(root, op, to); err != nil {
		return SessionFile{}, err
	}
	if err := root.Rename(from, to); err != nil {
		return SessionFile{}, fileErr(op, to, to, err)
	}
	info, err := root.Lstat(to)
	if err != nil {
		return SessionFile{}, fileErr(op, to, to, err)
	}
	return fileOf(to, info), nil
}

// checkParents refuses name when one of its parents is a symbolic link
// (ErrSymlink) or not a directory (ErrNotDir); a parent that does not
// exist is not an error here (a write makes it; a read or remove finds
// nothing).
func checkParents(root *os.Root, op, name string) error {
	for _, dir := range parents(name) {
		info, err := root.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fileErr(op, name, dir, err)
		case info.Mode()&fs.ModeSymlink != 0:
			return &FileError{Op: op, Path: name, At: dir, Err: ErrSymlink}
		case !info.IsDir():
			return &FileError{Op: op, Path: name, At: dir, Err: ErrNotDir}
		}
	}
	return nil
}

// makeParents makes name's missing parents.
func (s *Session) makeParents(root *os.Root, op, name string) error {
	if dir := path.Dir(name); dir != "." {
		return s.makeDirs(root, op, name, dir)
	}
	return nil
}

// makeDirs makes dir and its missing parents, owned by the session's
// user (checkParents has refused a link or a file among them).
func (s *Session) makeDirs(root *os.Root, op, name, dir string) error {
	for _, d := range append(parents(dir), dir) {
		err := root.Mkdir(d, 0o755)
		if errors.Is(err, fs.ErrExist) {
			if info, lerr := root.Lstat(d); lerr == nil && info.IsDir() && info.Mode()&fs.ModeSymlink == 0 {
				continue
			}
			return &FileError{Op: op, Path: name, At: d, Err: ErrNotDir}
		}
		if err != nil {
			return fileErr(op, name, d, err)
		}
		if err := root.Lchown(d, s.hostUID(), s.hostUID()); err != nil {
			return fmt.Errorf("sandbox: session file %s: %w", d, err)
		}
	}
	return nil
}

// parents lists name's parent directories, outermost first.
func parents(name string) []string {
	var out []string
	for i := range len(name) {
		if name[i] == '/' {
			out = append(out, name[:i])
		}
	}
	return out
}

// fileErr names the state of /work behind err, or wraps err as the fault
// it is (the disk, the box).
func fileErr(op, name, at string, err error) error {
	var why error
	switch {
	case errors.Is(err, fs.ErrNotExist):
		why = ErrFileNotFound
	case errors.Is(err, syscall.ENOTEMPTY):
		why = ErrDirNotEmpty
	case errors.Is(err, fs.ErrExist):
		why = ErrFileExists
	case errors.Is(err, syscall.ENOTDIR):
		why = ErrNotDir
	case errors.Is(err, syscall.EISDIR):
		why = ErrIsDir
	case errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "path escapes from parent"):
		// os.Root's refusal of a link that leads out of /work (its error
		// has no sentinel): a link swapped in behind checkParents' back.
		why = ErrSymlink
	case errors.Is(err, syscall.EINVAL) && op == "move":
		why = ErrMoveIntoSelf
	default:
		return fmt.Errorf("sandbox: session file %s %s: %w", op, name, err)
	}
	return &FileError{Op: op, Path: name, At: at, Err: why}
}

// fileOf is info as a SessionFile: the permission bits and, but for a
// regular file, the type.
func fileOf(name string, info fs.FileInfo) SessionFile {
	m := info.Mode()
	return SessionFile{Name: name, Size: info.Size(), Mode: m.Perm() | m&(fs.ModeDir|fs.ModeSymlink), ModTime: info.ModTime()}
}

func cmpMode(m, def fs.FileMode) fs.FileMode {
	if m.Perm() == 0 {
		return def
	}
	return m.Perm()
}
