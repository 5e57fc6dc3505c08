package testkit

import (
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/kilnrun/kiln/internal/sandboxapi"
)

// A ScriptedSession's /work: entries in memory with the semantics of the
// real box's files API (sandbox/session_files.go): parents made on writes,
// links never gone through, refusals as sandboxapi.FileError. A test plants
// what a session's code would have made with the same calls, and a link
// with Symlink.

// scriptedFile is one entry of a ScriptedSession's /work.
type scriptedFile struct {
	data  []byte
	mode  fs.FileMode // permission bits and type (fs.ModeDir, fs.ModeSymlink)
	mtime time.Time
}

// ScriptedSession's clock for the entries it makes.
func scriptedNow() time.Time { return time.Now().Truncate(time.Millisecond) }

func (s *ScriptedSession) entry(name string) sandboxapi.SessionFile {
	f := s.files[name]
	return sandboxapi.SessionFile{Name: name, Size: int64(len(f.data)), Mode: f.mode, ModTime: f.mtime}
}

// Symlink plants a symbolic link at name (as the session's code could),
// its parents made.
func (s *ScriptedSession) Symlink(target, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mkdirs(path.Dir(name))
	s.files[name] = &scriptedFile{data: []byte(target), mode: fs.ModeSymlink | 0o777, mtime: scriptedNow()}
}

// File is the content of the file at name, and whether there is one.
func (s *ScriptedSession) File(name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.files[name]
	if !ok || f.mode.Type() != 0 {
		return nil, false
	}
	return slices.Clone(f.data), true
}

func (s *ScriptedSession) mkdirs(dir string) {
	for d := dir; d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := s.files[d]; !ok {
			s.files[d] = &scriptedFile{mode: fs.ModeDir | 0o755, mtime: scriptedNow()}
		}
	}
}

// check refuses name when a parent is a link or a file; called with s.mu
// held.
func (s *ScriptedSession) check(op, name string) error {
	if s.closed {
		return sandboxapi.ErrSessionGone
	}
	for i := range len(name) {
		if name[i] != '/' {
			continue
		}
		f, ok := s.files[name[:i]]
		switch {
		case !ok:
			return nil
		case f.mode&fs.ModeSymlink != 0:
			return &sandboxapi.FileError{Op: op, Path: name, At: name[:i], Err: sandboxapi.ErrSymlink}
		case !f.mode.IsDir():
			return &sandboxapi.FileError{Op: op, Path: name, At: name[:i], Err: sandboxapi.ErrNotDir}
		}
	}
	return nil
}

// Entries reports every entry in lexical order (files with an open that
// reads a temporary copy of their content).
func (s *ScriptedSession) Entries(fn func(sandboxapi.SessionFile, func() (*os.File, error)) error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sandboxapi.ErrSessionGone
	}
	names := make([]string, 0, len(s.files))
	for n := range s.files {
		names = append(names, n)
	}
	slices.Sort(names)
	entries := make([]sandboxapi.SessionFile, len(names))
	data := make([][]byte, len(names))
	for i, n := range names {
		entries[i], data[i] = s.entry(n), slices.Clone(s.files[n].data)
	}
	s.mu.Unlock()
	for i, e := range entries {
		var open func() (*os.File, error)
		if e.Mode.Type() == 0 {
			content := data[i]
			open = func() (*os.File, error) { return tempWith(content) }
		}
		if err := fn(e, open); err != nil {
			return err
		}
	}
	return nil
}

// tempWith is an unlinked temporary file holding data, at its start.
func tempWith(data []byte) (*os.File, error) {
	f, err := os.CreateTemp("", "kiln-scripted-*")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Stat describes the entry at name.
func (s *ScriptedSession) Stat(name string) (sandboxapi.SessionFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check("stat", name); err != nil {
		return sandboxapi.SessionFile{}, err
	}
	if _, ok := s.files[name]; !ok {
		return sandboxapi.SessionFile{}, &sandboxapi.FileError{Op: "stat", Path: name, At: name, Err: sandboxapi.ErrFileNotFound}
	}
	return s.entry(name), nil
}

// WriteFile writes a file, its parents made.
func (s *ScriptedSession) WriteFile(name string, data []byte, mode fs.FileMode, mtime time.Time) (sandboxapi.SessionFile, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check("put", name); err != nil {
		return sandboxapi.SessionFile{}, false, err
	}
	old, ok := s.files[name]
	switch {
	case ok && old.mode&fs.ModeSymlink != 0:
		return sandboxapi.SessionFile{}, false, &sandboxapi.FileError{Op: "put", Path: name, At: name, Err: sandboxapi.ErrSymlink}
	case ok && old.mode.IsDir():
		return sandboxapi.SessionFile{}, false, &sandboxapi.FileError{Op: "put", Path: name, At: name, Err: sandboxapi.ErrIsDir}
	}
	if mode.Perm() == 0 {
		mode = 0o644
		if ok {
			mode = old.mode.Perm()
		}
	}
	if mtime.IsZero() {
		mtime = scriptedNow()
	}
	s.mkdirs(path.Dir(name))
	s.files[name] = &scriptedFile{data: slices.Clone(data), mode: mode.Perm(), mtime: mtime}
	return s.entry(name), !ok, nil
}

// Mkdir makes a directory and its parents.
func (s *ScriptedSession) Mkdir(name string) (sandboxapi.SessionFile, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check("mkdir", name); err != nil {
		return sandboxapi.SessionFile{}, false, err
	}
	if f, ok := s.files[name]; ok {
		if f.mode.IsDir() {
			return s.entry(name), false, nil
		}
		return sandboxapi.SessionFile{}, false, &sandboxapi.FileError{Op: "mkdir", Path: name, At: name, Err: sandboxapi.ErrFileExists}
	}
	s.mkdirs(name)
	return s.entry(name), true, nil
}

// Remove removes an entry (a directory's only when empty, or recursive).
func (s *ScriptedSession) Remove(name string, recursive bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check("remove", name); err != nil {
		return err
	}
	f, ok := s.files[name]
	if !ok {
		return &sandboxapi.FileError{Op: "remove", Path: name, At: name, Err: sandboxapi.ErrFileNotFound}
	}
	below := s.below(name)
	if f.mode.IsDir() && len(below) > 0 && !recursive {
		return &sandboxapi.FileError{Op: "remove", Path: name, At: name, Err: sandboxapi.ErrDirNotEmpty}
	}
	for _, n := range below {
		delete(s.files, n)
	}
	delete(s.files, name)
	return nil
}

func (s *ScriptedSession) below(dir string) []string {
	var out []string
	for n := range s.files {
		if strings.HasPrefix(n, dir+"/") {
			out = append(out, n)
		}
	}
	return out
}

// Move renames an entry (and what is below it).
func (s *ScriptedSession) Move(from, to string, overwrite bool) (sandboxapi.SessionFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(p string, err error) (sandboxapi.SessionFile, error) {
		return sandboxapi.SessionFile{}, &sandboxapi.FileError{Op: "move", Path: p, At: p, Err: err}
	}
	if err := s.check("move", from); err != nil {
		return sandboxapi.SessionFile{}, err
	}
	if err := s.check("move", to); err != nil {
		return sandboxapi.SessionFile{}, err
	}
	src, ok := s.files[from]
	switch {
	case !ok:
		return fail(from, sandboxapi.ErrFileNotFound)
	case src.mode.IsDir() && strings.HasPrefix(to, from+"/"):
		return fail(to, sandboxapi.ErrMoveIntoSelf)
	}
	if dst, ok := s.files[to]; ok {
		switch {
		case !overwrite:
			return fail(to, sandboxapi.ErrFileExists)
		case dst.mode.IsDir() && !src.mode.IsDir():
			return fail(to, sandboxapi.ErrIsDir)
		case dst.mode.IsDir() && len(s.below(to)) > 0:
			return fail(to, sandboxapi.ErrDirNotEmpty)
		case !dst.mode.IsDir() && src.mode.IsDir():
			return fail(to, sandboxapi.ErrNotDir)
		}
	}
	s.mkdirs(path.Dir(to))
	for _, n := range s.below(from) {
		s.files[to+n[len(from):]] = s.files[n]
		delete(s.files, n)
	}
	s.files[to] = src
	delete(s.files, from)
	return s.entry(to), nil
}

var _ sandboxapi.SessionFiles = (*ScriptedSession)(nil)
