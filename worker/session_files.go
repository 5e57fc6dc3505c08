package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// A session's files are checkpointed after every call: each regular file
// of its /work is stored in the object store under its SHA-256 (a file
// that did not change is not sent again), and the list of names, hashes,
// sizes and modes is recorded with the call's result in the catalog. A
// session that comes back on another worker gets them back from there.

// checkpoint stores the session's files and returns their list.
func (h *sessionHost) checkpoint(ctx context.Context, ls *liveSession) ([]job.SessionFileEntry, error) {
	if h.w.blobs == nil || !ls.box.Alive() {
		return nil, nil
	}
	var out []job.SessionFileEntry
	var total int64
	seen := map[string]job.SessionFileEntry{}
	err := ls.box.WalkFiles(func(f sandboxapi.SessionFile, open func() (*os.File, error)) error {
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
		e := job.SessionFileEntry{Name: f.Name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), Mode: uint32(f.Mode)}
		if old, ok := ls.files[f.Name]; !ok || old.SHA256 != e.SHA256 {
			ref := job.ObjectRef{Tenant: ls.rec.Tenant, SHA256: e.SHA256, Size: e.Size}
			if err := h.w.blobs.Put(ctx, ref, bytes.NewReader(data)); err != nil {
				return fmt.Errorf("checkpoint %s: %w", f.Name, err)
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
	slices.SortFunc(out, func(a, b job.SessionFileEntry) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// putFiles writes checkpointed files into the session's box.
func (h *sessionHost) putFiles(ctx context.Context, ls *liveSession, files []job.SessionFileEntry) error {
	for _, e := range files {
		data, err := h.w.blobs.GetBytes(ctx, job.ObjectRef{Tenant: ls.rec.Tenant, SHA256: e.SHA256, Size: e.Size}, SessionFilesMaxSize)
		if err != nil {
			return fmt.Errorf("restore %s: %w", e.Name, err)
		}
		if err := ls.box.PutFile(e.Name, data, fs.FileMode(e.Mode)); err != nil {
			return err
		}
		ls.files[e.Name] = e
	}
	return nil
}

// restore brings a session's state into its new box: at its first
// incarnation, the files it was created with; later (its worker was lost,
// or it was paused), the files of its last checkpoint and, with restore
// "replay", its successful calls re-run in order. A session resumed from a
// pause says what came back (ls.restored).
func (h *sessionHost) restore(ctx context.Context, ls *liveSession) error {
	rec := ls.rec
	if rec.Inc == 0 && !rec.Resumed {
		for _, f := range rec.Init {
			data, err := f.Bytes()
			if err != nil {
				return err
			}
			if err := ls.box.PutFile(f.Name, data, 0o644); err != nil {
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
	ls.fresh = true
	ls.note = what + ": its variables and imports are gone; files in /work were restored from the checkpoint after its last call. " +
		"Run again what the next steps need."
	if rec.Restore != job.RestoreReplay {
		return nil
	}
	replayed := 0
	for seq := int64(1); seq <= rec.Done; seq++ {
		c, err := h.store.SessionCall(ctx, rec.ID, seq)
		if err != nil || c.Result == nil || c.Result.Status != job.StatusSucceeded {
			continue
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
