/*
 * Capabilities: none in any set. A user namespace hands its maker every
 * capability in it and a full bounding set, so this runs after the job's
 * own namespace is made (user.c): the bounding set first (dropping needs
 * CAP_SETPCAP, held until the last step), then the ambient set, then the
 * permitted, effective and inheritable sets; then each set is read back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "internal.h"

#define CAP_MAX 63

int caps_drop_all(struct kj_job *job)
{
	int last = -1;
	for (int cap = 0; cap <= CAP_MAX; cap++) {
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
			if (errno == EINVAL)
				break; /* past the kernel's last capability */
			return kj_fail(job, "drop capability %d from the bounding set", cap);
		}
		last = cap;
	}
	if (last < 0)
		return kj_failx(job, "the kernel knows no capability to drop");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
		return kj_fail(job, "clear the ambient capabilities");
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	memset(d, 0, sizeof d);
	if (syscall(SYS_capset, &h, d) != 0)
		return kj_fail(job, "capset");
	/* Read back: a securebit or a kernel that kept one is an error. */
	memset(d, 0xff, sizeof d);
	if (syscall(SYS_capget, &h, d) != 0)
		return kj_fail(job, "capget");
	for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
		if (d[i].effective || d[i].permitted || d[i].inheritable)
			return kj_failx(job, "the job still holds capabilities (word %d: %x %x %x)", i, d[i].effective,
					d[i].permitted, d[i].inheritable);
	for (int cap = 0; cap <= last; cap++) {
		if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 0)
			return kj_failx(job, "capability %d is still in the bounding set", cap);
		int amb = prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0);
		if (amb > 0)
			return kj_failx(job, "capability %d is still ambient", cap);
	}
	return 0;
}
