/*
 * Namespaces: a job's fresh mount, uts, ipc and network namespaces (and,
 * for a session's init, its pid namespace; a box job's is made by the
 * zygote for its next children, kj_job_pidns), and the zygote's own user
 * and pid namespaces. The job's user namespace is user.c's: it is made
 * after the job's uid is taken.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "internal.h"

int ns_unshare_job(struct kj_job *job)
{
	int flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
	if (job->new_pid)
		flags |= CLONE_NEWPID;
	if (unshare(flags) != 0)
		return kj_fail(job, "unshare the job's namespaces");
	return 0;
}

int ns_hostname(struct kj_job *job)
{
	if (sethostname(KJ_HOSTNAME, strlen(KJ_HOSTNAME)) != 0)
		return kj_fail(job, "sethostname");
	return 0;
}

KJ_API int kj_box_userns(void)
{
	/* Nothing of the zygote (its memory, its descriptors) is readable
	 * through /proc by a process of the same uid. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
		return -1;
	return unshare(CLONE_NEWUSER);
}

KJ_API int kj_box_root(void)
{
	if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
		return -1;
	return unshare(CLONE_NEWPID);
}

KJ_API int kj_job_pidns(void)
{
	return unshare(CLONE_NEWPID);
}

KJ_API int kj_box_pidns(int fd)
{
	return setns(fd, CLONE_NEWPID);
}
