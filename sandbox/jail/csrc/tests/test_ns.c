/* ns.c: a job's fresh namespaces, and the zygote's pid namespaces. */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/utsname.h>
#include <sys/wait.h>

static const char *names[] = {"mnt", "uts", "ipc", "net"};

/* Every namespace kj_unshare makes is a new one; the pid namespace is
 * left to the zygote. */
static int fresh_namespaces(void)
{
	unsigned long before[4], pid = ns_id("pid");
	for (int i = 0; i < 4; i++)
		before[i] = ns_id(names[i]);
	struct kj_job j = test_job();
	CHECK_OK(kj_unshare(&j));
	for (int i = 0; i < 4; i++)
		CHECK(ns_id(names[i]) != before[i] && ns_id(names[i]) != 0, "the %s namespace is the box's", names[i]);
	CHECK(ns_id("pid_for_children") == pid, "a pid namespace was made for a box job");
	return 0;
}

/* A session's init asks for a pid namespace too: its next child is pid 1. */
static int session_pid_namespace(void)
{
	struct kj_job j = test_job();
	j.new_pid = 1;
	CHECK_OK(kj_unshare(&j));
	pid_t c = fork();
	CHECK(c >= 0, "fork");
	if (c == 0)
		_exit(getpid() == 1 ? 0 : 1);
	int st;
	CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the session's init is not pid 1");
	return 0;
}

/* The hostname is the job's, in its own uts namespace: a process of the
 * box's (forked before) still sees the box's. */
static int hostname(void)
{
	struct utsname before, after;
	CHECK(uname(&before) == 0, "uname");
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	pid_t c = fork();
	CHECK(c >= 0, "fork");
	if (c == 0) {
		char b;
		struct utsname u;
		_exit(read(p[0], &b, 1) == 1 && uname(&u) == 0 && strcmp(u.nodename, before.nodename) == 0 ? 0 : 1);
	}
	struct kj_job j = test_job();
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	CHECK(uname(&after) == 0, "uname");
	CHECK(strcmp(after.nodename, KJ_HOSTNAME) == 0, "hostname %s", after.nodename);
	CHECK(write(p[1], "x", 1) == 1, "write");
	int st;
	CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the box's hostname changed");
	return 0;
}

/* The zygote makes a pid namespace for its next children and returns to
 * its own: a child before is pid 1 of the new one, a child after is not. */
static int zygote_pid_namespaces(void)
{
	int own = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	CHECK(own >= 0, "open the pid namespace");
	CHECK(kj_job_pidns() == 0, "kj_job_pidns");
	for (int round = 0; round < 2; round++) {
		pid_t c = fork();
		CHECK(c >= 0, "fork");
		if (c == 0)
			_exit(getpid() == 1 ? 1 : 2);
		int st;
		CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st), "wait");
		CHECK(WEXITSTATUS(st) == (round == 0 ? 1 : 2), "round %d: child pid 1 is %d", round, WEXITSTATUS(st) == 1);
		if (round == 0)
			CHECK(kj_box_pidns(own) == 0, "kj_box_pidns");
	}
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("fresh_namespaces", fresh_namespaces);
	failed += run_case("session_pid_namespace", session_pid_namespace);
	failed += run_case("hostname", hostname);
	failed += run_case("zygote_pid_namespaces", zygote_pid_namespaces);
	return failed ? 1 : 0;
}
