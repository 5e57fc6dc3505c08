package e2bapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
	"github.com/kilnrun/kiln/e2bapi/envdpb/envdpbconnect"
	"github.com/kilnrun/kiln/job"
)

// What changed between two looks, as envd names it.
func TestWatchChanges(t *testing.T) {
	before := map[string]watchState{"a.txt": {sum: "1", size: 1, mode: 0o644}, "b.txt": {sum: "2", mode: 0o644}, "d": {dir: true}, "x": {sum: "3"}}
	now := map[string]watchState{"a.txt": {sum: "9", size: 1, mode: 0o644}, "b.txt": {sum: "2", mode: 0o600}, "c.txt": {sum: "4"}, "x": {dir: true}}
	var got []string
	for _, ev := range changes(before, now) {
		got = append(got, ev.Name+" "+ev.Type.String())
	}
	want := []string{"a.txt EVENT_TYPE_WRITE", "b.txt EVENT_TYPE_CHMOD", "c.txt EVENT_TYPE_CREATE", "d EVENT_TYPE_REMOVE", "x EVENT_TYPE_REMOVE", "x EVENT_TYPE_CREATE"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes: %q; want %q", got, want)
	}
}

// WatchDir sends what each new checkpoint changed under the directory it
// watches (its own entries, or every level when recursive), named relative
// to it; a file, a path outside the files and a directory not there are
// refused.
func TestWatchDir(t *testing.T) {
	f := &fakeDomain{files: []job.SessionFileEntry{{Name: "data/a.txt", SHA256: "1", Size: 1}, {Name: "top.txt", SHA256: "2"}}}
	hs := serve(t, f)
	c := envdpbconnect.NewFilesystemClient(http.DefaultClient, hs.URL, connect.WithProtoJSON())
	auth := func(r connect.AnyRequest) {
		r.Header().Set(headerSandboxID, "s1")
		r.Header().Set(headerSandboxPort, portEnvd)
		r.Header().Set(headerAccessToken, "tok-s1")
	}
	set := func(files ...job.SessionFileEntry) {
		f.mu.Lock()
		f.files = files
		f.mu.Unlock()
	}
	for _, recursive := range []bool{false, true} {
		t.Run(fmt.Sprint("recursive ", recursive), func(t *testing.T) {
			set(job.SessionFileEntry{Name: "data/a.txt", SHA256: "1", Size: 1}, job.SessionFileEntry{Name: "top.txt", SHA256: "2"})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req := connect.NewRequest(&envdpb.WatchDirRequest{Path: "/home/user/data", Recursive: recursive, IncludeEntry: true})
			auth(req)
			stream, err := c.WatchDir(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !stream.Receive() || stream.Msg().GetStart() == nil {
				t.Fatalf("the first event: %v %v", stream.Msg(), stream.Err())
			}
			// A new file, a deeper one, a change outside the directory,
			// and the old file rewritten: one checkpoint.
			set(job.SessionFileEntry{Name: "data/a.txt", SHA256: "9", Size: 2}, job.SessionFileEntry{Name: "data/b.txt", SHA256: "3"},
				job.SessionFileEntry{Name: "data/sub/c.txt", SHA256: "4"}, job.SessionFileEntry{Name: "top.txt", SHA256: "5"})
			want := []string{"a.txt EVENT_TYPE_WRITE", "b.txt EVENT_TYPE_CREATE", "sub EVENT_TYPE_CREATE"}
			if recursive {
				want = []string{"a.txt EVENT_TYPE_WRITE", "b.txt EVENT_TYPE_CREATE", "sub EVENT_TYPE_CREATE", "sub/c.txt EVENT_TYPE_CREATE"}
			}
			var got []string
			for len(got) < len(want) && stream.Receive() {
				ev := stream.Msg().GetFilesystem()
				if ev == nil {
					continue
				}
				got = append(got, ev.Name+" "+ev.Type.String())
				if e := ev.GetEntry(); e == nil || e.Path != "/home/user/data/"+ev.Name {
					t.Errorf("event %s: entry %v", ev.Name, e)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("events: %q; want %q", got, want)
			}
			set(job.SessionFileEntry{Name: "data/b.txt", SHA256: "3"}, job.SessionFileEntry{Name: "data/sub/c.txt", SHA256: "4"})
			if !stream.Receive() || stream.Msg().GetFilesystem().GetName() != "a.txt" || stream.Msg().GetFilesystem().GetType() != envdpb.EventType_EVENT_TYPE_REMOVE {
				t.Fatalf("a removal: %v %v", stream.Msg(), stream.Err())
			}
		})
	}
	for p, code := range map[string]connect.Code{"/home/user/top.txt": connect.CodeInvalidArgument, "/etc": connect.CodeInvalidArgument, "/home/user/none": connect.CodeNotFound} {
		set(job.SessionFileEntry{Name: "top.txt", SHA256: "2"})
		req := connect.NewRequest(&envdpb.WatchDirRequest{Path: p})
		auth(req)
		stream, err := c.WatchDir(t.Context(), req)
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		if connect.CodeOf(err) != code {
			t.Errorf("watch %s: %v; want %v", p, err, code)
		}
	}
}
