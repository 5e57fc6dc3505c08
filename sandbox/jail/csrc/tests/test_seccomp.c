/* seccomp.c: no_new_privs and the job filter (argv[1]: the filter file
 * sandbox/jobfilter builds). */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/syscall.h>

static unsigned char filter[65536];
static int64_t filter_len;

/* After it: Seccomp 2, NoNewPrivs 1, and what the filter refuses is
 * refused with EPERM (a namespace, a mount), while fork works. */
static int refuses_namespaces_and_mounts(void)
{
	struct kj_job j = test_job();
	j.filter = filter;
	j.filter_len = filter_len;
	CHECK_OK(kj_enter(&j));
	char v[32];
	CHECK(strcmp(status_field("Seccomp", v, sizeof v), "2") == 0, "Seccomp %s", v);
	CHECK(strcmp(status_field("NoNewPrivs", v, sizeof v), "1") == 0, "NoNewPrivs %s", v);
	CHECK(unshare(CLONE_NEWUSER) != 0 && errno == EPERM, "unshare a user namespace");
	CHECK(unshare(CLONE_NEWNS) != 0 && errno == EPERM, "unshare a mount namespace");
	CHECK(mount("none", "/tmp", "tmpfs", 0, NULL) != 0 && errno == EPERM, "mount");
	CHECK(syscall(SYS_setns, 0, 0) != 0 && errno == EPERM, "setns");
	pid_t c = fork();
	CHECK(c >= 0, "fork");
	if (c == 0)
		_exit(0);
	return 0;
}

/* A filter of a bad length is refused, not installed in part. */
static int refuses_a_bad_filter(void)
{
	struct kj_job j = test_job();
	j.filter = filter;
	j.filter_len = 12;
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	const char *err = kj_become(&j);
	CHECK(err && strstr(err, "bad length"), "a 12-byte filter: %s", err ? err : "accepted");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s JOB_FILTER\n", argv[0]);
		return 2;
	}
	int fd = open(argv[1], O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, filter, sizeof filter);
	if (n <= 0) {
		fprintf(stderr, "read %s: %s\n", argv[1], strerror(errno));
		return 2;
	}
	filter_len = n;
	int failed = 0;
	failed += run_case("refuses_namespaces_and_mounts", refuses_namespaces_and_mounts);
	failed += run_case("refuses_a_bad_filter", refuses_a_bad_filter);
	return failed ? 1 : 0;
}
