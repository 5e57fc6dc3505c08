/* rlimits.c: the job's rlimits and OOM order. */
#define _GNU_SOURCE
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>
#include <sys/resource.h>

static int limit_is(int resource, rlim_t soft, rlim_t hard)
{
	struct rlimit r;
	return getrlimit(resource, &r) == 0 && r.rlim_cur == soft && r.rlim_max == hard;
}

/* Read back: CPU (hard one second past soft), file size, descriptors, no
 * core; and the job first in the OOM order. */
static int limits_read_back(void)
{
	struct kj_job j = test_job();
	j.cpu_s = 7;
	j.fsize = 1 << 20;
	j.nofile = 64;
	CHECK_OK(kj_enter(&j));
	CHECK(limit_is(RLIMIT_CPU, 7, 8), "RLIMIT_CPU");
	CHECK(limit_is(RLIMIT_FSIZE, 1 << 20, 1 << 20), "RLIMIT_FSIZE");
	CHECK(limit_is(RLIMIT_NOFILE, 64, 64), "RLIMIT_NOFILE");
	CHECK(limit_is(RLIMIT_CORE, 0, 0), "RLIMIT_CORE");
	char v[16];
	CHECK(read_file("/proc/self/oom_score_adj", v, sizeof v) > 0 && atoi(v) == 1000, "oom_score_adj %s", v);
	/* The job cannot raise them again. */
	struct rlimit r = {9, 9};
	CHECK(setrlimit(RLIMIT_CPU, &r) != 0 && errno == EPERM, "raised RLIMIT_CPU");
	return 0;
}

/* Zero leaves a limit as it was (the worker sends 0 for none). */
static int zero_is_none(void)
{
	struct rlimit before;
	CHECK(getrlimit(RLIMIT_NOFILE, &before) == 0, "getrlimit");
	struct kj_job j = test_job();
	CHECK_OK(kj_enter(&j));
	CHECK(limit_is(RLIMIT_NOFILE, before.rlim_cur, before.rlim_max), "RLIMIT_NOFILE changed");
	CHECK(limit_is(RLIMIT_CORE, 0, 0), "RLIMIT_CORE");
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("limits_read_back", limits_read_back);
	failed += run_case("zero_is_none", zero_is_none);
	return failed ? 1 : 0;
}
