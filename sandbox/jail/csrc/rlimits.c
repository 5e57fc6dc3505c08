/*
 * Resources a job's processes are held to one by one: rlimits (CPU time,
 * file size, descriptors, no core dumps) and their place in the OOM order.
 * The job's memory, pids and CPU over all its processes are the box's
 * cgroup's, armed and read by the worker.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The worker lowered the zygote's oom_score_adj; the job, and its
 * namespace's reaper (pid 1), are the first the kernel ends at the box's
 * memory limit, as in a container. Written through the job's fresh /proc
 * before it is read-only. The process is dumpable for the writes only: a
 * non-dumpable process's /proc files belong to the host's root. No
 * process of the job exists yet. */
/* How long the reaper may stay hidden: its exec's last steps take
 * microseconds; seconds only on a host stalled for seconds. */
#define REAPER_VISIBLE_NS (5LL * 1000 * 1000 * 1000)

static long long monotonic_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The namespace's reaper (pid 1) is visible in this /proc (hidepid) once
 * its exec has made its new memory dumpable. The zygote waits for its
 * exec to close a close-on-exec pipe, and the kernel closes those just
 * before it sets dumpability (fs/exec.c, begin_new_exec): a window within
 * one system call of the reaper's, seen once on a slow host. No event
 * marks its end, so it is waited out, bounded; the write then says why it
 * failed if it still does. */
static void await_reaper(void)
{
	long long deadline = monotonic_ns() + REAPER_VISIBLE_NS;
	struct timespec pause = {0, 50 * 1000};
	while (access("/proc/1/oom_score_adj", F_OK) != 0 && errno == ENOENT && monotonic_ns() < deadline) {
		nanosleep(&pause, NULL);
		if (pause.tv_nsec < 10 * 1000 * 1000)
			pause.tv_nsec *= 2;
	}
}

int rlimits_oom_order(struct kj_job *job)
{
	if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
		return kj_fail(job, "dumpable");
	int rc = kj_write_at(job, -1, "/proc/self/oom_score_adj", "1000");
	if (rc == 0) {
		await_reaper();
		rc = kj_write_at(job, -1, "/proc/1/oom_score_adj", "1000");
	}
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 && rc == 0)
		return kj_fail(job, "not dumpable");
	return rc;
}

static int set(struct kj_job *job, int resource, const char *name, rlim_t soft, rlim_t hard)
{
	struct rlimit r = {soft, hard};
	if (setrlimit(resource, &r) != 0)
		return kj_fail(job, "setrlimit %s %llu", name, (unsigned long long)soft);
	return 0;
}

int rlimits_set(struct kj_job *job)
{
	if (job->cpu_s > 0 && set(job, RLIMIT_CPU, "RLIMIT_CPU", (rlim_t)job->cpu_s, (rlim_t)job->cpu_s + 1))
		return -1;
	if (job->fsize > 0 && set(job, RLIMIT_FSIZE, "RLIMIT_FSIZE", (rlim_t)job->fsize, (rlim_t)job->fsize))
		return -1;
	if (job->nofile > 0 && set(job, RLIMIT_NOFILE, "RLIMIT_NOFILE", (rlim_t)job->nofile, (rlim_t)job->nofile))
		return -1;
	return set(job, RLIMIT_CORE, "RLIMIT_CORE", 0, 0);
}
