/*
 * Credentials: the job's uid and gid (drawn at random by the worker for
 * each job, never 0), no supplementary group, and a user namespace of the
 * job's own, nested in the box's, that maps that uid and gid alone.
 *
 * In the job's view every other uid (the box's root that owns the image's
 * files, the supervisors, the jobs before and after it) is the overflow
 * uid: it can name none of them (setuid, chown, a uid_map), and no
 * capability it could get in its own namespace counts in the box's. A
 * process may map into a namespace it makes only its own uid: so the
 * job's uid is taken first (as the box's root, in the box's namespace),
 * then the namespace made and its single mapping written, setgroups
 * denied first as the kernel requires for the gid map.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "internal.h"

int user_drop(struct kj_job *job)
{
	if (job->uid <= 0)
		return kj_failx(job, "a job never runs as root of the box (uid %d)", job->uid);
	if (setgroups(0, NULL) != 0)
		return kj_fail(job, "setgroups");
	if (setresgid(job->uid, job->uid, job->uid) != 0)
		return kj_fail(job, "setresgid %d", job->uid);
	if (setresuid(job->uid, job->uid, job->uid) != 0)
		return kj_fail(job, "setresuid %d", job->uid);
	return 0;
}

int user_own_ns(struct kj_job *job)
{
	if (job->proc_fd < 0)
		return kj_failx(job, "the job's user namespace: no /proc handle (kj_mount first)");
	/* The job owns its /proc/self files (setresuid made it non-dumpable,
	 * and a non-dumpable process's are the host's root's). */
	if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
		return kj_fail(job, "dumpable");
	if (unshare(CLONE_NEWUSER) != 0)
		return kj_fail(job, "unshare the job's user namespace");
	char map[64];
	snprintf(map, sizeof map, "%d %d 1\n", job->uid, job->uid);
	int rc = kj_write_at(job, job->proc_fd, "self/setgroups", "deny");
	if (rc == 0)
		rc = kj_write_at(job, job->proc_fd, "self/uid_map", map);
	if (rc == 0)
		rc = kj_write_at(job, job->proc_fd, "self/gid_map", map);
	close(job->proc_fd);
	job->proc_fd = -1;
	return rc;
}
