package e2bapi

import (
	"context"
	"path"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
)

// envd's WatchDir over a session's /work: the files a watch sees are the
// ones reads and listings see, the checkpoint each call of the session
// leaves, so the watch reads it every watchPoll and sends what changed
// under the watched directory since the last look. A change a call made
// and undid within itself is not seen; a rename is a removal and a
// creation; a background command's writes are seen with the next call's
// checkpoint.

// watchPoll is how often a watch reads the session's files.
const watchPoll = 500 * time.Millisecond

// watchState is what a watch saw of one entry under its directory.
type watchState struct {
	dir        bool
	sum        string
	size       int64
	mode       uint32
	modifiedAt time.Time
}

// watched is what of tree t a watch of directory rel sees: each entry
// under it (at any depth when recursive, else its own entries), by its
// name relative to rel.
func (t tree) watched(rel string, recursive bool) map[string]watchState {
	prefix := ""
	if rel != "" {
		prefix = rel + "/"
	}
	out := map[string]watchState{}
	add := func(name string, st watchState) {
		under, ok := strings.CutPrefix(name, prefix)
		if !ok || under == "" || (!recursive && strings.Contains(under, "/")) {
			return
		}
		out[under] = st
	}
	for name, fe := range t.files {
		add(name, watchState{sum: fe.SHA256, size: fe.Size, mode: fe.Mode, modifiedAt: fe.MTime})
	}
	for name := range t.dirs {
		if name != "" {
			add(name, watchState{dir: true})
		}
	}
	return out
}

// changes are the events from what a watch saw before to what it sees
// now, in name order: a name new is created, one gone is removed, a file
// whose bytes changed is written, one whose mode alone changed is chmod.
func changes(before, now map[string]watchState) []*envdpb.FilesystemEvent {
	var out []*envdpb.FilesystemEvent
	ev := func(name string, typ envdpb.EventType) {
		out = append(out, &envdpb.FilesystemEvent{Name: name, Type: typ})
	}
	for name, st := range now {
		was, ok := before[name]
		switch {
		case !ok:
			ev(name, envdpb.EventType_EVENT_TYPE_CREATE)
		case was.dir != st.dir:
			ev(name, envdpb.EventType_EVENT_TYPE_REMOVE)
			ev(name, envdpb.EventType_EVENT_TYPE_CREATE)
		case st.dir:
		case was.sum != st.sum || was.size != st.size || !was.modifiedAt.Equal(st.modifiedAt):
			ev(name, envdpb.EventType_EVENT_TYPE_WRITE)
		case was.mode != st.mode:
			ev(name, envdpb.EventType_EVENT_TYPE_CHMOD)
		}
	}
	for name := range before {
		if _, ok := now[name]; !ok {
			ev(name, envdpb.EventType_EVENT_TYPE_REMOVE)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// WatchDir sends the changes under a directory of the sandbox's files
// until the client goes away or the sandbox ends.
func (f filesystem) WatchDir(ctx context.Context, req *connect.Request[envdpb.WatchDirRequest], stream *connect.ServerStream[envdpb.WatchDirResponse]) error {
	rel, err := workPath(req.Msg.GetPath())
	if err != nil {
		return invalidPath(err)
	}
	t, err := f.tree(ctx)
	if err != nil {
		return err
	}
	if err := t.dir(rel, req.Msg.GetPath()); err != nil {
		return err
	}
	send := func(r *envdpb.WatchDirResponse) error {
		return sendWithin(ctx, func() error { return stream.Send(r) })
	}
	if err := send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Start{Start: &envdpb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	recursive, withEntry := req.Msg.GetRecursive(), req.Msg.GetIncludeEntry()
	seen := t.watched(rel, recursive)
	keepAlive := keepAliveOf(req.Header())
	quietSince := time.Now()
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		t, err := f.tree(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := t.dir(rel, req.Msg.GetPath()); err != nil {
			return err
		}
		now := t.watched(rel, recursive)
		evs := changes(seen, now)
		seen = now
		for _, ev := range evs {
			if withEntry && ev.Type != envdpb.EventType_EVENT_TYPE_REMOVE {
				ev.Entry = t.entry(path.Join(rel, ev.Name))
			}
			if err := send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if len(evs) > 0 {
			quietSince = time.Now()
			continue
		}
		if keepAlive > 0 && time.Since(quietSince) >= keepAlive {
			if err := send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Keepalive{Keepalive: &envdpb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			quietSince = time.Now()
		}
	}
}
