/* What a job's sandbox costs: argv[1] jobs, each a fork of a box's job
 * process making its whole sandbox (kj_enter), then the same with the
 * job's user namespace alone (unshare and its three map writes). Prints
 * the microseconds of wall time per job of each step of kj_enter
 * ("unshare_us", "mount_us", "become_us") and of the user namespace
 * ("userns_us"). */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/wait.h>

static int jobs;

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* run_jobs forks jobs job processes; each measures its steps (whole: the
 * three of kj_enter; else the user namespace alone) and sends the
 * microseconds each took. */
static int run_jobs(int whole)
{
	double spent[3] = {0, 0, 0};
	for (int i = 0; i < jobs; i++) {
		int p[2];
		CHECK(pipe(p) == 0, "pipe");
		pid_t c = fork();
		CHECK(c >= 0, "fork");
		if (c == 0) {
			struct kj_job j = test_job();
			j.keep[0] = p[1];
			double us[3] = {0, 0, 0};
			const char *err = NULL;
			double t0 = now_us();
			if (whole) {
				err = kj_unshare(&j);
				double t1 = now_us();
				if (err == NULL)
					err = kj_mount(&j);
				double t2 = now_us();
				if (err == NULL)
					err = kj_become(&j);
				double t3 = now_us();
				us[0] = t1 - t0, us[1] = t2 - t1, us[2] = t3 - t2;
			} else {
				err = kj_unshare(&j);
				if (err == NULL)
					err = kj_mount(&j);
				if (err == NULL && (setresgid(TEST_UID, TEST_UID, TEST_UID) || setresuid(TEST_UID, TEST_UID, TEST_UID) ||
						    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)))
					err = "drop to the job's uid";
				char map[32];
				snprintf(map, sizeof map, "%d %d 1\n", TEST_UID, TEST_UID);
				t0 = now_us();
				if (err == NULL && unshare(CLONE_NEWUSER))
					err = "unshare";
				const char *f[] = {"self/setgroups", "self/uid_map", "self/gid_map"};
				const char *d[] = {"deny", map, map};
				for (int k = 0; k < 3 && err == NULL; k++) {
					int fd = openat(j.proc_fd, f[k], O_WRONLY);
					if (fd < 0 || write(fd, d[k], strlen(d[k])) < 0)
						err = f[k];
					close(fd);
				}
				us[0] = now_us() - t0;
			}
			if (err) {
				fprintf(stderr, "    %s\n", err);
				_exit(1);
			}
			_exit(write(p[1], us, sizeof us) == sizeof us ? 0 : 1);
		}
		close(p[1]);
		double us[3];
		CHECK(read(p[0], us, sizeof us) == sizeof us, "job %d reported nothing", i);
		close(p[0]);
		int st;
		CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "job %d failed", i);
		for (int k = 0; k < 3; k++)
			spent[k] += us[k];
	}
	if (whole)
		printf("unshare_us %.1f mount_us %.1f become_us %.1f\n", spent[0] / jobs, spent[1] / jobs, spent[2] / jobs);
	else
		printf("userns_us %.1f\n", spent[0] / jobs);
	fflush(stdout);
	return 0;
}

static int both(void)
{
	return run_jobs(1) || run_jobs(0);
}

int main(int argc, char **argv)
{
	jobs = argc > 1 ? atoi(argv[1]) : 100;
	if (jobs <= 0)
		jobs = 100;
	return run_case("bench", both);
}
