/* caps.c: no capability in any set. */
#define _GNU_SOURCE
#include "harness.h"

#include <unistd.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

/* Before: the box's root holds every capability (in the box). After:
 * every set of /proc/self/status is empty, and capget agrees. */
static int none_in_any_set(void)
{
	const char *sets[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
	char v[32];
	CHECK(strcmp(status_field("CapEff", v, sizeof v), "0000000000000000") != 0, "the box's root has no capability before");
	struct kj_job j = test_job();
	CHECK_OK(kj_enter(&j));
	for (int i = 0; i < 5; i++)
		CHECK(strcmp(status_field(sets[i], v, sizeof v), "0000000000000000") == 0, "%s: %s", sets[i], v);
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	CHECK(syscall(SYS_capget, &h, d) == 0, "capget");
	for (int i = 0; i < 2; i++)
		CHECK(!d[i].effective && !d[i].permitted && !d[i].inheritable, "capget word %d", i);
	/* Nothing brings one back. */
	CHECK(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_BIND_SERVICE, 0, 0) != 0, "ambient raise");
	CHECK(prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) == 0, "CAP_SYS_ADMIN in the bounding set");
	return 0;
}

/* Dropping them alone (after the job's user namespace, as kj_become
 * does) leaves the sets empty too: the namespace's full set is gone. */
static int dropped_after_the_namespace(void)
{
	struct kj_job j = test_job();
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	CHECK_OK(kj_become(&j));
	char v[32];
	CHECK(strcmp(status_field("CapBnd", v, sizeof v), "0000000000000000") == 0, "CapBnd %s", v);
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("none_in_any_set", none_in_any_set);
	failed += run_case("dropped_after_the_namespace", dropped_after_the_namespace);
	return failed ? 1 : 0;
}
