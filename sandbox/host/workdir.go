package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
)

// MountWorkDir creates <dir>/work as a tmpfs of diskMB, owned by uid:gid,
// with the output dir in it, and returns the path to bind into the container.
func MountWorkDir(dir string, diskMB int64, uid, gid int) (string, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("sandbox: create work dir %s: %w", dir, err)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("sandbox: create work dir %s: %w", work, err)
	}
	// nr_inodes bounds the file count as size bounds the bytes (an empty
	// file costs no data page but an inode and its dentry in kernel memory).
	inodes := max(16384, diskMB*256)
	opts := fmt.Sprintf("size=%dm,nr_inodes=%d,mode=0755,uid=%d,gid=%d", diskMB, inodes, uid, gid)
	if err := unix.Mount("tmpfs", work, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("sandbox: mount work dir tmpfs on %s: %w", work, err)
	}
	out := filepath.Join(work, filepath.Base(job.OutputDir))
	if err := os.Mkdir(out, 0o755); err != nil {
		return work, fmt.Errorf("sandbox: create output dir: %w", err)
	}
	if err := os.Chown(out, uid, gid); err != nil {
		return work, fmt.Errorf("sandbox: chown output dir: %w", err)
	}
	return work, nil
}

// UnmountWorkDir unmounts dir/work (lazily: nothing of the sandbox should
// hold it, but a stuck reader must not keep the memory) and removes dir.
// A dir that is not there is not an error.
func UnmountWorkDir(dir string) error {
	work := filepath.Join(dir, "work")
	var errs []error
	if err := UnmountSmallFS(filepath.Join(dir, StatusFSDir)); err != nil {
		errs = append(errs, err)
	}
	if err := unix.Unmount(work, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", work, err))
	}
	// Remove, not RemoveAll: once unmounted the dir is empty, and should the
	// unmount have failed, nothing of the tmpfs is deleted file by file.
	for _, p := range []string{work, dir} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// MountSmallFS mounts a tmpfs of size bytes and a handful of inodes on dir
// (made if missing), owned by root, 0711.
func MountSmallFS(dir string, size int64, flags uintptr) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0711,uid=0,gid=0", size)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|flags, opts); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// UnmountSmallFS undoes MountSmallFS; a dir that is not there, or not a
// mount, is fine.
func UnmountSmallFS(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// StatusFSDir names the tmpfs of the status and output channel files in a
// sandbox's directory.
const StatusFSDir = "status"

// CreateOwnedFile creates an empty file at path owned by uid:gid, mode
// 0600: a status or output channel file a sandbox's process writes. It
// never opens what is already there (a link included); on failure nothing
// is left at path.
func CreateOwnedFile(path string, uid, gid int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	err = f.Chown(uid, gid)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}
