/*
 * Mounts, made in the job's fresh mount namespace as the box's root: a
 * fresh /proc of the job's pid namespace that lists the job's processes
 * only (hidepid=2), with what runc masks and makes read-only in a
 * container's /proc masked and read-only, and itself read-only; fresh
 * size-capped tmpfs on /tmp and /dev/shm; a fresh mqueue; the job's own
 * work dir on /work; an empty /run/kiln over the box's own files.
 *
 * Before the job's /proc covers it, the box's own /proc (writable: the
 * worker leaves it so, box_spec.go) is opened: kj_become writes the job's
 * user namespace maps through that handle (the job's /proc is read-only by
 * then; "self" there is the job's process too, its pid namespace being a
 * descendant of the box's) and closes it before the job runs. No mount is
 * made and none detached for it: a detached mount costs an RCU grace
 * period per job.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/mount.h>

#include "internal.h"

#define PROC_FLAGS (MS_NOSUID | MS_NODEV | MS_NOEXEC)

static int do_mount(struct kj_job *job, const char *src, const char *target, const char *type, unsigned long flags,
		    const char *data)
{
	if (mount(src, target, type, flags, data) != 0)
		return kj_fail(job, "mount %s on %s", type ? type : src ? src : "(remount)", target);
	return 0;
}

/* is_dir and exists use open and access, not stat: stat's symbol is
 * versioned 2.33 in glibc, and the library links against symbols every
 * glibc has. */
static int is_dir(const char *path)
{
	int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

static int exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* proc_handle opens the box's /proc, which the job's /proc is about to
 * cover (job->proc_fd). */
static int proc_handle(struct kj_job *job)
{
	job->proc_fd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (job->proc_fd < 0)
		return kj_fail(job, "open the box's /proc");
	return 0;
}

/* each_path calls fn for every ':'-separated path of list. */
static int each_path(struct kj_job *job, const char *list, int (*fn)(struct kj_job *, const char *))
{
	char path[PATH_MAX];
	while (list && *list) {
		const char *end = strchr(list, ':');
		size_t n = end ? (size_t)(end - list) : strlen(list);
		if (n >= sizeof path)
			return kj_failx(job, "a /proc path of %zu bytes", n);
		if (n > 0) {
			memcpy(path, list, n);
			path[n] = 0;
			if (fn(job, path))
				return -1;
		}
		list = end ? end + 1 : NULL;
	}
	return 0;
}

static int mask(struct kj_job *job, const char *path)
{
	if (!exists(path))
		return 0;
	if (is_dir(path))
		return do_mount(job, "tmpfs", path, "tmpfs", MS_RDONLY | PROC_FLAGS, "size=0");
	return do_mount(job, "/dev/null", path, NULL, MS_BIND, NULL);
}

static int read_only(struct kj_job *job, const char *path)
{
	if (!exists(path))
		return 0;
	if (do_mount(job, path, path, NULL, MS_BIND | MS_REC, NULL))
		return -1;
	return do_mount(job, NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | PROC_FLAGS, NULL);
}

static int work(struct kj_job *job)
{
	const char *w = job->work;
	if (w == NULL || *w == 0 || strchr(w, '/') || strcmp(w, ".") == 0 || strcmp(w, "..") == 0)
		return kj_failx(job, "the job's work dir name %s is not a name", w ? w : "(none)");
	char src[PATH_MAX];
	if (snprintf(src, sizeof src, "%s/%s", KJ_JOBS_DIR, w) >= (int)sizeof src)
		return kj_failx(job, "the job's work dir name is too long");
	if (!is_dir(src) || !is_dir("/work"))
		return kj_failx(job, "the job's work dir %s (%d) or /work (%d) is missing", src, is_dir(src), is_dir("/work"));
	if (do_mount(job, src, "/work", NULL, MS_BIND, NULL))
		return -1;
	return do_mount(job, NULL, "/work", NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL);
}

static int tmpfs(struct kj_job *job)
{
	char opts[128];
	long long mb = job->tmp_mb;
	if (mb <= 0)
		return kj_failx(job, "the job's /tmp of %lld MiB: want a size (a tmpfs of size 0 is unbounded)", mb);
	long long inodes = mb * 256 > 16384 ? mb * 256 : 16384;
	snprintf(opts, sizeof opts, "mode=1777,size=%lldm,nr_inodes=%lld", mb, inodes);
	if (do_mount(job, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts))
		return -1;
	snprintf(opts, sizeof opts, "mode=1777,size=%lldm", mb);
	if (do_mount(job, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts))
		return -1;
	if (is_dir("/dev/mqueue") && do_mount(job, "mqueue", "/dev/mqueue", "mqueue", PROC_FLAGS, NULL))
		return -1;
	return 0;
}

int mnt_job(struct kj_job *job)
{
	if (do_mount(job, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) || proc_handle(job))
		return -1;
	/* hidepid=2: the job sees its own processes only, not its
	 * namespace's reaper (pid 1, the box's root). */
	if (do_mount(job, "proc", "/proc", "proc", PROC_FLAGS, "hidepid=2"))
		return -1;
	/* Through the job's /proc, before it is read-only. */
	if (rlimits_oom_order(job) || net_tcp_buffers(job))
		return -1;
	/* What runc masks and makes read-only in a container's /proc, in the
	 * job's (the box's own /proc is left whole, or no /proc could be
	 * mounted in a user namespace at all). */
	if (each_path(job, job->masked, mask) || each_path(job, job->readonly, read_only))
		return -1;
	/* No process of the job writes its own oom_score_adj, mem, attr or
	 * the other per-process knobs. */
	if (do_mount(job, NULL, "/proc", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | PROC_FLAGS, NULL))
		return -1;
	if (tmpfs(job) || work(job))
		return -1;
	/* Nothing of the box's own (kiln-init, its status file, the control
	 * socket, the other jobs' dirs, this library) is in the job's view. */
	return do_mount(job, "tmpfs", KJ_BOX_DIR, "tmpfs", PROC_FLAGS, "size=4k,mode=0555");
}
