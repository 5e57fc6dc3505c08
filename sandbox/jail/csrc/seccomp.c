/*
 * no_new_privs, then the job seccomp filter (sandbox/jobfilter builds it;
 * the worker binds it into the box and the zygote reads it once). Filters
 * stack: the box's own profile still applies beneath it. The filter
 * refuses unshare, setns and mount, so it comes after every namespace
 * call of the job's set-up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

#include "internal.h"

int seccomp_install(struct kj_job *job)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return kj_fail(job, "no_new_privs");
	int64_t n = job->filter_len;
	if (job->filter == NULL || n <= 0 || n % (int64_t)sizeof(struct sock_filter) != 0 ||
	    n / (int64_t)sizeof(struct sock_filter) > BPF_MAXINSNS)
		return kj_failx(job, "the job seccomp filter has a bad length (%lld bytes)", (long long)n);
	struct sock_fprog prog = {
		.len = (unsigned short)(n / (int64_t)sizeof(struct sock_filter)),
		.filter = (struct sock_filter *)job->filter,
	};
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
		return kj_fail(job, "install the job seccomp filter");
	return 0;
}
