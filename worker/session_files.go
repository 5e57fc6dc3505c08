package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// A session's files are checkpointed after every call: each regular file
// of its /work is stored in the object store under its SHA-256 (a file
// that did not change is not sent again), and the list of entries (files
// with their hashes, directories and symbolic links, each with its size,
// mode and mtime) is recorded with the call's result in the catalog, where
// the API lists and stats them without asking the worker. A session that
// comes back on another worker gets its files and directories back from
// there (links are listed, not restored).
//
// File operations (a call whose File is set: upload, mkdir, move, remove)
// are done here, between calls, on the box's /work through its
// sandboxapi.SessionFiles (from the host, never through a link the session
// made, never by code in the interpreter); a refusal the session's files
// cause is recorded as the operation's job.SessionFileError, which the API
// answers as a 4xx problem.

// checkpoint stores the session's files and returns their list.
func (h *sessionHost) checkpoint(ctx context.Context, ls *liveSession) ([]job.SessionFileEntry, error) {
	if h.w.objects.blobs == nil || !ls.box.Alive() {
		return nil, nil
	}
	var out []job.SessionFileEntry
	var total int64
	seen := map[string]job.SessionFileEntry{}
	err := ls.box.Entries(func(f sandboxapi.SessionFile, open func() (*os.File, error)) error {
		if len(out) >= job.SessionFilesMaxEntries {
			return fmt.Errorf("the session's /work holds over %d entries: %s and later entries are not checkpointed", job.SessionFilesMaxEntries, f.Name)
		}
		e := job.SessionFileEntry{Name: f.Name, Size: f.Size, Mode: uint32(f.Mode.Perm()), MTime: f.ModTime.UTC()}
		switch {
		case f.Mode.IsDir():
			e.Type, e.Size = job.FileTypeDir, 0
		case f.Mode&fs.ModeSymlink != 0:
			e.Type = job.FileTypeSymlink
		default:
			if total+f.Size > SessionFilesMaxSize {
				return fmt.Errorf("the session's files are over %d bytes: %s and later files are not checkpointed", SessionFilesMaxSize, f.Name)
			}
			fh, err := open()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(io.LimitReader(fh, SessionFilesMaxSize-total+1))
			fh.Close()
			if err != nil {
				return err
			}
			total += int64(len(data))
			sum := sha256.Sum256(data)
			e.SHA256, e.Size = hex.EncodeToString(sum[:]), int64(len(data))
			if old, ok := ls.files[f.Name]; !ok || old.SHA256 != e.SHA256 {
				ref := job.ObjectRef{Tenant: ls.rec.Tenant, SHA256: e.SHA256, Size: e.Size}
				if err := h.w.objects.blobs.Put(ctx, ref, bytes.NewReader(data)); err != nil {
					return fmt.Errorf("checkpoint %s: %w", f.Name, err)
				}
			}
		}
		seen[f.Name] = e
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	ls.files = seen
	if out == nil {
		out = []job.SessionFileEntry{}
	}
	return out, nil
}

// filesList is the last checkpoint, by name.
func (ls *liveSession) filesList() []job.SessionFileEntry {
	out := make([]job.SessionFileEntry, 0, len(ls.files))
	for _, e := range ls.files {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b job.SessionFileEntry) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// putFiles writes checkpointed entries into the session's box: its files
// (with their modes and mtimes) and directories, in order; links are not
// brought back.
func (h *sessionHost) putFiles(ctx context.Context, ls *liveSession, files []job.SessionFileEntry) error {
	for _, e := range files {
		switch {
		case e.Type == job.FileTypeDir:
			if _, _, err := ls.box.Mkdir(e.Name); err != nil {
				return fmt.Errorf("restore %s: %w", e.Name, err)
			}
		case e.IsFile():
			data, err := h.w.objects.blobs.GetBytes(ctx, job.ObjectRef{Tenant: ls.rec.Tenant, SHA256: e.SHA256, Size: e.Size}, SessionFilesMaxSize)
			if err != nil {
				return fmt.Errorf("restore %s: %w", e.Name, err)
			}
			if _, _, err := ls.box.WriteFile(e.Name, data, fs.FileMode(e.Mode), e.MTime); err != nil {
				return fmt.Errorf("restore %s: %w", e.Name, err)
			}
		default:
			continue
		}
		ls.files[e.Name] = e
	}
	return nil
}

// restore brings a session's state into its new box: at its first
// incarnation, the files it was created with; later (its worker was lost,
// or it was paused), the files of its last checkpoint, then the variables
// its last pause kept if it has them, else, with restore "replay", its
// successful calls re-run in order. A session resumed from a pause says
// what came back (ls.restored).
func (h *sessionHost) restore(ctx context.Context, ls *liveSession) error {
	rec := ls.rec
	if rec.Inc == 0 && !rec.Resumed {
		for _, f := range rec.Init {
			data, err := f.Bytes()
			if err != nil {
				return err
			}
			if _, _, err := ls.box.WriteFile(f.Name, data, 0o644, time.Time{}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := h.putFiles(ctx, ls, rec.Files); err != nil {
		return err
	}
	what := "the session's worker was lost and the session came back on another"
	if rec.Resumed {
		what, ls.restored = "the session was paused and resumed", job.RestoredFiles
	}
	if rec.Done == 0 {
		return nil // no call had left anything in its interpreter
	}
	if rec.Variables != nil && rec.Restore != job.RestoreReplay {
		// Its last pause kept its variables (session_variables.go).
		rep, err := h.restoreVariables(ctx, ls, *rec.Variables)
		if err == nil && (len(rep.Kept) > 0 || len(rep.Lost) == 0) {
			if rec.Resumed {
				ls.restored = job.RestoredFilesVariables
			}
			ls.note = fmt.Sprintf("%s: its %d variables came back as its pause kept them, and its files in /work", what, len(rep.Kept))
			if len(rep.Lost) > 0 {
				ls.fresh = true
				ls.note += "; these could not be kept and are gone: " + rep.lostNote() + ". Run again what the next steps need of them."
			}
			return nil
		}
		if err == nil {
			// Not one was kept: the session comes back with its files, and
			// the note says why.
			what += " (its variables could not be kept: " + rep.lostNote() + ")"
		} else if ctx.Err() == nil {
			h.w.log.WarnContext(ctx, "session: bring back the variables its pause kept", slog.String("session_id", rec.ID), slog.Any("error", err))
		}
	}
	ls.fresh = true
	ls.note = what + ": its variables and imports are gone; files in /work were restored from the checkpoint after its last call. " +
		"Run again what the next steps need."
	if rec.Restore != job.RestoreReplay {
		return nil
	}
	replayed := 0
	for seq := int64(1); seq <= rec.Done; seq++ {
		c, err := h.store.SessionCall(ctx, rec.ID, seq)
		if err != nil || c.Result == nil || c.Result.Status != job.StatusSucceeded || c.Spec.File != nil {
			continue // a file operation's outcome is in the checkpoint
		}
		spec := c.Spec.Spec(rec.Runtime, rec.Limits)
		spec.Files = nil // the checkpoint holds the files as the calls left them
		res, _, err := ls.box.Exec(ctx, sandboxapi.Request{ID: job.NewID(), Spec: spec, Tenant: rec.Tenant})
		if err != nil {
			return fmt.Errorf("replay call %d: %w", seq, err)
		}
		if res.Status != job.StatusSucceeded {
			ls.note = fmt.Sprintf("%s; replaying its calls stopped at call %d (%s): "+
				"the state of the calls before it is rebuilt, not that of the later ones", what, seq, res.Status)
			ls.fresh = true
			return nil
		}
		replayed++
	}
	ls.fresh = false
	ls.note = fmt.Sprintf("%s; its state was rebuilt by re-running its %d successful calls in order (restore: replay)", what, replayed)
	if rec.Resumed {
		ls.restored = job.RestoredFilesReplay
	}
	return nil
}

// runFileOp does the file operation call.File on the session's /work and
// checkpoints what it changed. Its result is a call's: succeeded with the
// outcome's entry, failed (invalid_request) with the SessionFileError the
// session's files caused, or internal_error.
func (h *sessionHost) runFileOp(ctx context.Context, ls *liveSession, seq int64, call job.SessionCall) (job.CallResult, []job.SessionFileEntry, bool) {
	op := *call.File
	id := call.EventsID
	if !job.ValidID(id) {
		id = job.NewID()
	}
	started := h.cfg.Now()
	out := &job.SessionFileOutcome{Op: op.Op, Path: op.Path, To: op.To}
	cr := job.CallResult{Seq: seq, StateRestored: true, File: out}
	res := job.Result{ID: id, Image: ls.box.Image()}
	finish := func(files []job.SessionFileEntry) (job.CallResult, []job.SessionFileEntry, bool) {
		finished := h.cfg.Now()
		res.Worker, res.StartedAt, res.FinishedAt, res.WallMS = h.w.cfg.ID, &started, &finished, finished.Sub(started).Milliseconds()
		cr.Result, cr.Incarnation = res, ls.holder.Inc
		return cr, files, true
	}
	if !ls.box.Alive() {
		// The box ended (an anomaly): a new one with the checkpoint's
		// files; the session's next call is told its interpreter is new.
		if err := h.rebox(ctx, ls); err != nil {
			res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, "the session's sandbox could not be made again: "+err.Error())
			return finish(nil)
		}
		ls.fresh, ls.restarted = true, false
	}
	f, created, err := h.fileOp(ctx, ls, op)
	var fe *sandboxapi.FileError
	if errors.As(err, &fe) {
		out.Error = fileError(op, fe)
	} else {
		errors.As(err, &out.Error) // a refusal of fileOp's own (too_large)
	}
	switch {
	case out.Error != nil:
		res.Status, res.Error = job.StatusFailed, job.NewFailure(job.CategoryInvalidRequest, out.Error.Detail)
		return finish(nil) // nothing changed
	case err != nil:
		h.w.log.WarnContext(ctx, "session: a file operation", slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq),
			slog.String("op", op.Describe()), slog.Any("error", err))
		res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, "the file operation failed: "+err.Error())
	default:
		res.Status, res.ExitCode, out.Created = job.StatusSucceeded, job.IntPtr(0), created
	}
	// What changed (on success; after an internal error, whatever did) is
	// checkpointed as a call's changes are.
	files, cerr := h.checkpoint(ctx, ls)
	if cerr != nil {
		h.w.log.WarnContext(ctx, "session: checkpoint", slog.String("session_id", ls.rec.ID), slog.Any("error", cerr))
		files = nil
	}
	if res.Status == job.StatusSucceeded && op.Op != job.FileOpRemove {
		info := job.SessionFileEntry{Name: f.Name, Size: f.Size, Mode: uint32(f.Mode.Perm()), MTime: f.ModTime.UTC()}
		if e, ok := ls.files[f.Name]; ok && files != nil {
			info = e
		} else if op.Op == job.FileOpPut {
			info.SHA256 = op.Content.SHA256
		}
		if f.Mode.IsDir() {
			info.Type = job.FileTypeDir
		} else if f.Mode&fs.ModeSymlink != 0 {
			info.Type = job.FileTypeSymlink
		}
		v := info.Info()
		out.Entry = &v
	}
	return finish(files)
}

// fileOp does op on the session's box.
func (h *sessionHost) fileOp(ctx context.Context, ls *liveSession, op job.SessionFileOp) (sandboxapi.SessionFile, bool, error) {
	switch op.Op {
	case job.FileOpPut:
		if op.Content == nil || h.w.objects.blobs == nil {
			return sandboxapi.SessionFile{}, false, errors.New("an upload without its content")
		}
		// What is checkpointed stays within SessionFilesMaxSize: an upload
		// past it is refused, not written and then left out of the
		// checkpoint.
		var total int64
		for _, e := range ls.files {
			if e.IsFile() && e.Name != op.Path {
				total += e.Size
			}
		}
		if total+op.Content.Size > SessionFilesMaxSize {
			return sandboxapi.SessionFile{}, false, &job.SessionFileError{Code: job.FileErrTooLarge, Field: "path", Limit: SessionFilesMaxSize,
				Detail: fmt.Sprintf("put %s: the session's files would be %d bytes, over the %d its /work may hold; remove some first",
					op.Path, total+op.Content.Size, SessionFilesMaxSize)}
		}
		// The object is read under the session's tenant, whatever the
		// operation names.
		ref := job.ObjectRef{Tenant: ls.rec.Tenant, SHA256: op.Content.SHA256, Size: op.Content.Size}
		data, err := h.w.objects.blobs.GetBytes(ctx, ref, SessionFilesMaxSize)
		if err != nil {
			return sandboxapi.SessionFile{}, false, fmt.Errorf("read the upload: %w", err)
		}
		return ls.box.WriteFile(op.Path, data, 0, time.Time{})
	case job.FileOpMkdir:
		return ls.box.Mkdir(op.Path)
	case job.FileOpRemove:
		return sandboxapi.SessionFile{}, false, ls.box.Remove(op.Path, op.Recursive)
	case job.FileOpMove:
		f, err := ls.box.Move(op.Path, op.To, op.Overwrite)
		return f, false, err
	}
	return sandboxapi.SessionFile{}, false, fmt.Errorf("unknown file operation %q", op.Op)
}

// fileErrorCodes are the wire codes of the sandbox's refusals.
var fileErrorCodes = []struct {
	err  error
	code string
}{
	{sandboxapi.ErrFileNotFound, job.FileErrNotFound}, {sandboxapi.ErrFileExists, job.FileErrExists},
	{sandboxapi.ErrNotDir, job.FileErrNotDir}, {sandboxapi.ErrIsDir, job.FileErrIsDir},
	{sandboxapi.ErrDirNotEmpty, job.FileErrNotEmpty}, {sandboxapi.ErrSymlink, job.FileErrSymlink},
	{sandboxapi.ErrMoveIntoSelf, job.FileErrMoveIntoSelf},
}

// fileError is the wire form of a refusal the session's files caused.
func fileError(op job.SessionFileOp, fe *sandboxapi.FileError) *job.SessionFileError {
	code := job.FileErrExists // a refusal of a kind not listed: something is in the way
	for _, c := range fileErrorCodes {
		if errors.Is(fe, c.err) {
			code = c.code
			break
		}
	}
	field := "path"
	if op.Op == job.FileOpMove && fe.Path == op.To {
		field = "to"
	}
	return &job.SessionFileError{Code: code, Field: field, Detail: fe.Error()}
}
