/*
 * The order of a job's sandbox: each step's preconditions are the previous
 * steps' results.
 *
 * Mounts first, as the box's root: /proc must be mounted by a process
 * holding CAP_SYS_ADMIN over the user namespace that owns the job's pid
 * namespace (the box's: the zygote made it). Then the job's uid, and only
 * then the job's own user namespace: a process may map into a namespace it
 * makes only its own uid, and the single mapping is what leaves every other
 * uid (the box's root, the supervisors, the jobs before and after) unmapped
 * in the job's view. A fresh user namespace hands its maker every
 * capability in it and a full bounding set, so capabilities are dropped
 * after it, then no_new_privs and the filter (which refuses unshare, so it
 * must come last of the namespace calls), then rlimits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "internal.h"

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

static int check_abi(struct kj_job *job)
{
	if (job->abi != KJ_ABI)
		return kj_failx(job, "jail: the caller's job layout is version %d, this library's %d", job->abi, KJ_ABI);
	return 0;
}

static const char *result(struct kj_job *job, int rc)
{
	return rc == 0 ? NULL : job->err;
}

KJ_API const char *kj_unshare(struct kj_job *job)
{
	job->err[0] = 0;
	if (check_abi(job) || ns_unshare_job(job))
		return job->err;
	if (job->egress_port > 0 && net_egress(job))
		return job->err;
	return NULL;
}

KJ_API const char *kj_mount(struct kj_job *job)
{
	job->err[0] = 0;
	if (check_abi(job))
		return job->err;
	return result(job, mnt_job(job) || net_loopback_up(job) || ns_hostname(job));
}

/* close_fds closes every descriptor but 0, 1, 2 and job->keep: nothing of
 * the zygote's (its control socket, its pid namespace, the pipes of other
 * steps) reaches the job. */
static int close_fds(struct kj_job *job)
{
	int keep[4], n = 0;
	for (int i = 0; i < 4; i++) {
		int fd = job->keep[i];
		if (fd < 3)
			continue;
		int at = n++;
		while (at > 0 && keep[at - 1] > fd) {
			keep[at] = keep[at - 1];
			at--;
		}
		keep[at] = fd;
	}
	unsigned int from = 3;
	for (int i = 0; i <= n; i++) {
		unsigned int to = i < n ? (unsigned int)keep[i] : ~0U;
		if (to > from) {
			if (syscall(SYS_close_range, from, to - 1, 0) != 0) {
				if (errno != ENOSYS)
					return kj_fail(job, "close the zygote's descriptors");
				for (unsigned int fd = from; fd < to && fd < 65536; fd++)
					close((int)fd);
			}
		}
		if (i < n)
			from = (unsigned int)keep[i] + 1;
	}
	return 0;
}

KJ_API const char *kj_become(struct kj_job *job)
{
	job->err[0] = 0;
	if (check_abi(job))
		return job->err;
	if (user_drop(job) || user_own_ns(job) || close_fds(job) || caps_drop_all(job) || seccomp_install(job) ||
	    rlimits_set(job))
		return job->err;
	/* The job leads a session of its own: no terminal, no process group
	 * shared with the zygote. */
	if (setsid() < 0 && errno != EPERM) {
		kj_fail(job, "setsid");
		return job->err;
	}
	if (chdir("/work") != 0) {
		kj_fail(job, "chdir /work");
		return job->err;
	}
	return NULL;
}

KJ_API const char *kj_enter(struct kj_job *job)
{
	const char *err = kj_unshare(job);
	if (err == NULL)
		err = kj_mount(job);
	if (err == NULL)
		err = kj_become(job);
	return err;
}

static int vfail(struct kj_job *job, int errnum, const char *fmt, va_list ap)
{
	int n = vsnprintf(job->err, sizeof job->err, fmt, ap);
	if (errnum && n >= 0 && (size_t)n < sizeof job->err)
		snprintf(job->err + n, sizeof job->err - (size_t)n, ": %s", strerror(errnum));
	return -1;
}

int kj_fail(struct kj_job *job, const char *fmt, ...)
{
	int errnum = errno;
	va_list ap;
	va_start(ap, fmt);
	vfail(job, errnum, fmt, ap);
	va_end(ap);
	errno = errnum;
	return -1;
}

int kj_failx(struct kj_job *job, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(job, 0, fmt, ap);
	va_end(ap);
	return -1;
}

int kj_write_at(struct kj_job *job, int dirfd, const char *path, const char *data)
{
	int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return kj_fail(job, "open %s", path);
	size_t n = strlen(data);
	ssize_t w = write(fd, data, n);
	int errnum = errno;
	close(fd);
	if (w != (ssize_t)n) {
		errno = w < 0 ? errnum : EIO;
		return kj_fail(job, "write %s", path);
	}
	return 0;
}
