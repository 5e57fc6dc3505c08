/*
 * Resources a job's processes are held to one by one: rlimits (CPU time,
 * file size, descriptors, no core dumps) and their place in the OOM order.
 * The job's memory, pids and CPU over all its processes are the box's
 * cgroup's, armed and read by the worker.
 */
#define _GNU_SOURCE
#include <sys/prctl.h>
#include <sys/resource.h>

#include "internal.h"

/* The worker lowered the zygote's oom_score_adj; the job, and its
 * namespace's reaper (pid 1), are the first the kernel ends at the box's
 * memory limit, as in a container. Written through the job's fresh /proc
 * before it is read-only. The process is dumpable for the writes only: a
 * non-dumpable process's /proc files belong to the host's root. No
 * process of the job exists yet. */
int rlimits_oom_order(struct kj_job *job)
{
	if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
		return kj_fail(job, "dumpable");
	int rc = kj_write_at(job, -1, "/proc/self/oom_score_adj", "1000");
	if (rc == 0)
		rc = kj_write_at(job, -1, "/proc/1/oom_score_adj", "1000");
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
