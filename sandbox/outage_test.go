package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kilnrun/kiln/sandbox/initproto"
)

// What counts as containerd not answering: its connection lost or refused,
// however the client wrapped it; never one of its answers.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), true},
		{fmt.Errorf("sandbox: get image: %w", status.Error(codes.Unavailable, "connection refused")), true},
		{fmt.Errorf("connection error: %w", errdefs.ErrUnavailable), true},
		{errdefs.FromGRPC(status.Error(codes.Unavailable, "transport is closing")), true},
		{status.Error(codes.NotFound, "task not found"), false},
		{errdefs.ErrNotFound, false},
		{status.Error(codes.DeadlineExceeded, "deadline"), false},
		{context.Canceled, false},
		{errors.New("runc: exit status 1"), false},
	} {
		if got := ctrd.Unreachable(tc.err); got != tc.want {
			t.Errorf("ctrd.Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A container's init has reported once its status file holds a report with
// the sandbox's nonce; an empty, foreign or missing file is no report.
func TestInitReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sb := &sandbox{statusPath: filepath.Join(dir, "status"), nonce: "0123456789abcdef0123456789abcdef"}
	if initReported(sb) {
		t.Fatal("reported with no status file")
	}
	if err := os.WriteFile(sb.statusPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if initReported(sb) {
		t.Fatal("reported with an empty status file (as created, before the job ends)")
	}
	forged := initproto.Status{Nonce: "fedcba9876543210fedcba9876543210", Ready: true}
	if err := os.WriteFile(sb.statusPath, forged.Encode(), 0o600); err != nil {
		t.Fatal(err)
	}
	if initReported(sb) {
		t.Fatal("reported with another nonce's status")
	}
	st := initproto.Status{Nonce: sb.nonce, Ready: true, ExitCode: 3}
	if err := os.WriteFile(sb.statusPath, st.Encode(), 0o600); err != nil {
		t.Fatal(err)
	}
	if !initReported(sb) {
		t.Fatal("not reported with the init's status written")
	}
	if initReported(&sandbox{}) {
		t.Fatal("reported for a sandbox without a status file (a box)")
	}
}
