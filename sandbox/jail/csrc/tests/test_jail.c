/* jail.c: the steps' order, descriptors, the layout check. */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <unistd.h>

/* The job holds 0, 1, 2 and what it was given, nothing of the zygote's;
 * it leads a session of its own, in /work. */
static int descriptors_session_and_cwd(void)
{
	int kept = open("/dev/null", O_RDONLY);
	int dropped = open("/dev/null", O_RDONLY);
	int high = fcntl(kept, F_DUPFD, 900);
	CHECK(kept > 2 && dropped > 2 && high >= 900, "open");
	struct kj_job j = test_job();
	j.keep[2] = high;
	j.keep[3] = kept;
	CHECK_OK(kj_enter(&j));
	CHECK(fcntl(kept, F_GETFD) >= 0 && fcntl(high, F_GETFD) >= 0, "a kept descriptor was closed");
	CHECK(fcntl(dropped, F_GETFD) < 0 && errno == EBADF, "descriptor %d reached the job", dropped);
	for (int fd = 3; fd < 1024; fd++)
		CHECK(fd == kept || fd == high || fcntl(fd, F_GETFD) < 0, "descriptor %d reached the job", fd);
	CHECK(getsid(0) == getpid(), "the job does not lead a session");
	char cwd[64];
	CHECK(getcwd(cwd, sizeof cwd) && strcmp(cwd, "/work") == 0, "cwd %s", cwd);
	return 0;
}

/* A caller of another layout is refused before anything is done. */
static int refuses_another_layout(void)
{
	struct kj_job j = test_job();
	j.abi = KJ_ABI + 1;
	const char *err = kj_enter(&j);
	CHECK(err && strstr(err, "layout"), "abi %d: %s", j.abi, err ? err : "accepted");
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("descriptors_session_and_cwd", descriptors_session_and_cwd);
	failed += run_case("refuses_another_layout", refuses_another_layout);
	return failed ? 1 : 0;
}
