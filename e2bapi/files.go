package e2bapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
	"github.com/kilnrun/kiln/e2bapi/envdpb/envdpbconnect"
	"github.com/kilnrun/kiln/job"
)

// envd (E2b-Sandbox-Port 49983): a sandbox's files are its session's
// /work, which E2B's paths name /home/user (or /work). /files reads a file
// as the session's last call left it and writes files as a call of the
// session; the filesystem service lists and stats from the same
// checkpoint, and makes directories, moves and removes by a call.

// maxUpload bounds one POST /files body.
const maxUpload = 64 << 20

// workPath is E2B path p as a path relative to the session's /work ("" for
// /work itself).
func workPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("a path is required")
	}
	if !strings.HasPrefix(p, "/") {
		p = homeDir + "/" + p
	}
	p = path.Clean(p)
	for _, root := range []string{homeDir, "/work"} {
		if p == root {
			return "", nil
		}
		if rel, ok := strings.CutPrefix(p, root+"/"); ok {
			return rel, nil
		}
	}
	return "", fmt.Errorf("%s is outside the sandbox's files: Kiln keeps a sandbox's files under %s (its /work)", p, homeDir)
}

// e2bPath is a path relative to /work as E2B names it.
func e2bPath(rel string) string {
	if rel == "" {
		return homeDir
	}
	return homeDir + "/" + rel
}

func (s *Surface) handleFileRead(w http.ResponseWriter, r *http.Request, tenant, id string) {
	rel, err := workPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	o, size, err := s.d.OpenSessionFile(r.Context(), tenant, id, rel)
	if err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	defer o.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, o)
}

// entry is envd's answer for a file written.
type entry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func (s *Surface) handleFileWrite(w http.ResponseWriter, r *http.Request, tenant, id string) {
	r.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	target := r.URL.Query().Get("path")
	var files []job.File
	var written []entry
	add := func(p string, body []byte) error {
		rel, err := workPath(p)
		if err != nil {
			return err
		}
		if err := job.ValidSessionFilePath(rel); err != nil {
			return err
		}
		files = append(files, job.File{Name: rel, Content: base64.StdEncoding.EncodeToString(body), Encoding: "base64"})
		written = append(written, entry{Name: path.Base(rel), Type: "file", Path: e2bPath(rel)})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "the upload is not a multipart form: "+err.Error())
				return
			}
			p := target
			if p == "" {
				p = part.FileName()
			}
			body, err := io.ReadAll(part)
			if err == nil {
				err = add(p, body)
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
		}
	} else {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = add(target, body)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	if len(files) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the upload")
		return
	}
	if err := s.runHelper(r.Context(), tenant, id, job.SessionCall{Code: "pass", Files: files}); err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// helperFailed is a helper call that ran and failed.
type helperFailed struct{ msg string }

func (e *helperFailed) Error() string { return e.msg }

// runHelper runs one of the package's own calls (a file written, moved or
// removed) in the session and waits for its end.
func (s *Surface) runHelper(ctx context.Context, tenant, id string, call job.SessionCall) error {
	o := s.runToEnd(ctx, tenant, id, call, nil)
	if o.err != nil {
		return o.err
	}
	if o.res.Status != job.StatusSucceeded {
		msg := string(o.res.Status)
		if o.res.Error != nil {
			msg = o.res.Error.Message
		}
		return &helperFailed{msg: msg}
	}
	return nil
}

type sandboxCtx struct{}

type sandboxRef struct{ tenant, id string }

// mountFilesystem serves envd's filesystem service (Connect) on mux.
func (s *Surface) mountFilesystem(mux *http.ServeMux) {
	p, h := envdpbconnect.NewFilesystemHandler(filesystem{s: s})
	mux.Handle(p, s.sandboxed(func(w http.ResponseWriter, r *http.Request, tenant, id string) {
		ctx := context.WithValue(r.Context(), sandboxCtx{}, sandboxRef{tenant, id})
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, writerCtx{}, http.NewResponseController(w))))
	}))
}

// filesystem is envd's filesystem service over a session's /work.
type filesystem struct {
	envdpbconnect.UnimplementedFilesystemHandler
	s *Surface
}

func sandboxOf(ctx context.Context) sandboxRef {
	ref, _ := ctx.Value(sandboxCtx{}).(sandboxRef)
	return ref
}

// connectError is a domain call's refusal as a Connect error.
func connectError(err error) error {
	var hf *helperFailed
	if errors.As(err, &hf) {
		return connect.NewError(connect.CodeInternal, err)
	}
	code := connect.CodeInternal
	switch domainStatus(err) {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		code = connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		code = connect.CodeUnauthenticated
	case http.StatusNotFound, http.StatusGone:
		code = connect.CodeNotFound
	case http.StatusTooManyRequests:
		code = connect.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	case http.StatusNotImplemented:
		code = connect.CodeUnimplemented
	}
	return connect.NewError(code, err)
}

// tree is the session's /work as its last call left it: files by path,
// and every directory above one.
type tree struct {
	files map[string]job.SessionFileEntry
	dirs  map[string]bool
}

func (f filesystem) tree(ctx context.Context) (tree, error) {
	ref := sandboxOf(ctx)
	_, files, err := f.s.d.GetSession(ctx, ref.tenant, ref.id)
	if err != nil {
		return tree{}, connectError(err)
	}
	t := tree{files: map[string]job.SessionFileEntry{}, dirs: map[string]bool{"": true}}
	for _, fe := range files {
		if fe.Type == job.FileTypeDir {
			t.dirs[fe.Name] = true
		} else {
			t.files[fe.Name] = fe
		}
		for d := path.Dir(fe.Name); d != "." && !t.dirs[d]; d = path.Dir(d) {
			t.dirs[d] = true
		}
	}
	return t, nil
}

func (t tree) entry(rel string) *envdpb.EntryInfo {
	if fe, ok := t.files[rel]; ok {
		mode := fs.FileMode(fe.Mode & 0o777)
		return &envdpb.EntryInfo{Name: path.Base(rel), Type: envdpb.FileType_FILE_TYPE_FILE, Path: e2bPath(rel), Size: fe.Size,
			Mode: uint32(mode), Permissions: mode.String(), Owner: "user", Group: "user"}
	}
	if t.dirs[rel] {
		mode := fs.ModeDir | 0o755
		return &envdpb.EntryInfo{Name: path.Base(e2bPath(rel)), Type: envdpb.FileType_FILE_TYPE_DIRECTORY, Path: e2bPath(rel),
			Mode: uint32(mode.Perm()), Permissions: mode.String(), Owner: "user", Group: "user"}
	}
	return nil
}

// dir refuses rel (E2B path p) unless it is a directory of t: a file is
// an invalid argument, nothing there not found.
func (t tree) dir(rel, p string) error {
	if t.dirs[rel] {
		return nil
	}
	if _, isFile := t.files[rel]; isFile {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is a file, not a directory", p))
	}
	return notFound(p)
}

func invalidPath(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

func notFound(p string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: %w", p, errNoFile))
}

func (f filesystem) Stat(ctx context.Context, req *connect.Request[envdpb.StatRequest]) (*connect.Response[envdpb.StatResponse], error) {
	rel, err := workPath(req.Msg.GetPath())
	if err != nil {
		return nil, invalidPath(err)
	}
	t, err := f.tree(ctx)
	if err != nil {
		return nil, err
	}
	e := t.entry(rel)
	if e == nil {
		return nil, notFound(req.Msg.GetPath())
	}
	return connect.NewResponse(&envdpb.StatResponse{Entry: e}), nil
}

func (f filesystem) ListDir(ctx context.Context, req *connect.Request[envdpb.ListDirRequest]) (*connect.Response[envdpb.ListDirResponse], error) {
	rel, err := workPath(req.Msg.GetPath())
	if err != nil {
		return nil, invalidPath(err)
	}
	depth := int(max(req.Msg.GetDepth(), 1))
	t, err := f.tree(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.dir(rel, req.Msg.GetPath()); err != nil {
		return nil, err
	}
	prefix := ""
	if rel != "" {
		prefix = rel + "/"
	}
	var out []*envdpb.EntryInfo
	add := func(name string) {
		under, ok := strings.CutPrefix(name, prefix)
		if !ok || name == rel || strings.Count(under, "/") >= depth {
			return
		}
		out = append(out, t.entry(name))
	}
	for name := range t.files {
		add(name)
	}
	for name := range t.dirs {
		if name != "" {
			add(name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return connect.NewResponse(&envdpb.ListDirResponse{Entries: out}), nil
}

// pathEnv names the environment variables that carry paths into the
// helper calls below (paths are never spliced into code).
const (
	pathEnv = "E2B_FS_PATH"
	destEnv = "E2B_FS_DEST"
)

const (
	makeDirCode = "import os\nos.makedirs(os.environ['" + pathEnv + "'], exist_ok=True)\n"
	removeCode  = "import os, shutil\np = os.environ['" + pathEnv + "']\nif os.path.isdir(p) and not os.path.islink(p):\n    shutil.rmtree(p)\nelse:\n    os.remove(p)\n"
	moveCode    = "import os\nd = os.environ['" + destEnv + "']\nos.makedirs(os.path.dirname(d) or '.', exist_ok=True)\nos.replace(os.environ['" + pathEnv + "'], d)\n"
)

func (f filesystem) helper(ctx context.Context, code string, env map[string]string) error {
	ref := sandboxOf(ctx)
	if err := f.s.runHelper(ctx, ref.tenant, ref.id, job.SessionCall{Code: code, Env: env}); err != nil {
		return connectError(err)
	}
	return nil
}

func (f filesystem) MakeDir(ctx context.Context, req *connect.Request[envdpb.MakeDirRequest]) (*connect.Response[envdpb.MakeDirResponse], error) {
	rel, err := workPath(req.Msg.GetPath())
	if err != nil {
		return nil, invalidPath(err)
	}
	t, err := f.tree(ctx)
	if err != nil {
		return nil, err
	}
	if e := t.entry(rel); e != nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", req.Msg.GetPath()))
	}
	if err := f.helper(ctx, makeDirCode, map[string]string{pathEnv: "/work/" + rel}); err != nil {
		return nil, err
	}
	mode := fs.ModeDir | 0o755
	return connect.NewResponse(&envdpb.MakeDirResponse{Entry: &envdpb.EntryInfo{Name: path.Base(rel), Type: envdpb.FileType_FILE_TYPE_DIRECTORY,
		Path: e2bPath(rel), Mode: uint32(mode.Perm()), Permissions: mode.String(), Owner: "user", Group: "user"}}), nil
}

func (f filesystem) Remove(ctx context.Context, req *connect.Request[envdpb.RemoveRequest]) (*connect.Response[envdpb.RemoveResponse], error) {
	rel, err := workPath(req.Msg.GetPath())
	if err != nil {
		return nil, invalidPath(err)
	}
	if rel == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is the sandbox's home: remove what is in it", homeDir))
	}
	t, err := f.tree(ctx)
	if err != nil {
		return nil, err
	}
	if t.entry(rel) == nil {
		return nil, notFound(req.Msg.GetPath())
	}
	if err := f.helper(ctx, removeCode, map[string]string{pathEnv: "/work/" + rel}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.RemoveResponse{}), nil
}

func (f filesystem) Move(ctx context.Context, req *connect.Request[envdpb.MoveRequest]) (*connect.Response[envdpb.MoveResponse], error) {
	src, err := workPath(req.Msg.GetSource())
	if err != nil {
		return nil, invalidPath(err)
	}
	dst, err := workPath(req.Msg.GetDestination())
	if err != nil {
		return nil, invalidPath(err)
	}
	if src == "" || dst == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s itself cannot be moved, nor replaced", homeDir))
	}
	t, err := f.tree(ctx)
	if err != nil {
		return nil, err
	}
	e := t.entry(src)
	if e == nil {
		return nil, notFound(req.Msg.GetSource())
	}
	if err := f.helper(ctx, moveCode, map[string]string{pathEnv: "/work/" + src, destEnv: "/work/" + dst}); err != nil {
		return nil, err
	}
	e.Name, e.Path = path.Base(dst), e2bPath(dst)
	return connect.NewResponse(&envdpb.MoveResponse{Entry: e}), nil
}
