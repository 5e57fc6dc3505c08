package host

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The file is new, empty, 0600 and its owner's; a name already taken (a
// link to a file elsewhere included) is refused and left as it was.
func TestCreateOwnedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 4242, 4343 // root can give it away: check it does
	}
	p := filepath.Join(dir, "status")
	if err := CreateOwnedFile(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Size() != 0 || int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("created %v size %d owned %d:%d; want a regular 0600 empty file owned %d:%d", fi.Mode(), fi.Size(), st.Uid, st.Gid, uid, gid)
	}
	if err := CreateOwnedFile(p, uid, gid); err == nil {
		t.Errorf("an existing file is created again")
	}
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := CreateOwnedFile(link, uid, gid); err == nil {
		t.Errorf("a link is created over")
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Errorf("the link's target changed: %q, %v", b, err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link is gone: %v", err)
	}
}
