/* mnt.c: the job's mounts. */
#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

/* mount_line finds the /proc/self/mountinfo line of the last mount on
 * target, or returns NULL; *count is how many mounts of type fstype there
 * are in all. */
static const char *mount_line(const char *target, const char *fstype, int *count)
{
	static char info[65536];
	static char line[1024];
	const char *found = NULL;
	*count = 0;
	if (read_file("/proc/self/mountinfo", info, sizeof info) < 0)
		return NULL;
	for (char *l = info; l && *l;) {
		char *nl = strchr(l, '\n');
		size_t n = nl ? (size_t)(nl - l) : strlen(l);
		char buf[1024], mp[512], fs[64];
		if (n < sizeof buf) {
			memcpy(buf, l, n);
			buf[n] = 0;
			/* id parent maj:min root mountpoint opts ... - fstype src superopts */
			char *dash = strstr(buf, " - ");
			if (dash && sscanf(buf, "%*s %*s %*s %*s %511s", mp) == 1 && sscanf(dash + 3, "%63s", fs) == 1) {
				if (strcmp(fs, fstype) == 0)
					(*count)++;
				if (strcmp(mp, target) == 0 && strcmp(fs, fstype) == 0) {
					memcpy(line, buf, n + 1);
					found = line;
				}
			}
		}
		l = nl ? nl + 1 : NULL;
	}
	return found;
}

static int pids_in_proc(int *pids, int max)
{
	DIR *d = opendir("/proc");
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && n < max)
			pids[n++] = atoi(e->d_name);
	closedir(d);
	return n;
}

static int entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* /proc is the job's pid namespace's, read-only, hidepid=2; the handle
 * kj_become writes the user maps through is the box's /proc, no mount of
 * its own. */
static int proc(void)
{
	struct kj_job j = test_job();
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	int procs;
	const char *l = mount_line("/proc", "proc", &procs);
	CHECK(l != NULL, "no proc mount on /proc");
	CHECK(strstr(l, " ro,") != NULL, "/proc is not read-only: %s", l);
	CHECK(strstr(l, "hidepid=invisible") || strstr(l, "hidepid=2"), "/proc without hidepid: %s", l);
	CHECK(procs == 2, "%d proc mounts; want the box's and the job's", procs);
	CHECK(j.proc_fd >= 0 && fcntl(j.proc_fd, F_GETFD) >= 0, "no /proc handle");
	char self[32];
	CHECK(readlink("/proc/self", self, sizeof self) > 0 && atoi(self) == getpid(), "/proc is not the job's pid namespace's");
	/* A root process of the box (a reaper) is hidden from the job's uid. */
	pid_t box = fork();
	CHECK(box >= 0, "fork");
	if (box == 0) {
		pause();
		_exit(0);
	}
	CHECK_OK(kj_become(&j));
	int pids[16];
	int n = pids_in_proc(pids, 16);
	kill(box, SIGKILL);
	CHECK(n == 1 && pids[0] == getpid(), "the job sees %d processes (first %d); want itself alone", n, n > 0 ? pids[0] : 0);
	/* The job owns its /proc/self now, and still cannot write it. */
	int fd = open("/proc/self/oom_score_adj", O_WRONLY);
	CHECK(fd < 0 && errno == EROFS, "/proc/self/oom_score_adj is writable");
	return 0;
}

/* What runc masks is masked, what it makes read-only is read-only. */
static int masked_and_read_only(void)
{
	struct kj_job j = test_job();
	j.masked = "/proc/version:/proc/fs:/proc/no-such-path";
	j.readonly = "/proc/sys:/proc/bus";
	CHECK(entries("/proc/fs") > 0, "/proc/fs is empty before");
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	char buf[16];
	CHECK(read_file("/proc/version", buf, sizeof buf) == 0, "/proc/version is readable");
	CHECK(entries("/proc/fs") == 0, "/proc/fs is not empty");
	/* A mount of their own, read-only (the rest of /proc is read-only
	 * too, which says nothing of these). */
	const char *ro[] = {"/proc/sys", "/proc/bus"};
	for (int i = 0; i < 2; i++) {
		int n;
		const char *l = mount_line(ro[i], "proc", &n);
		CHECK(l && strstr(l, " ro,"), "%s: %s", ro[i], l ? l : "no mount of its own");
	}
	return 0;
}

/* /tmp and /dev/shm are fresh tmpfs of the job's size; /work is the
 * job's own dir; /run/kiln shows nothing of the box. */
static int tmpfs_work_and_run(void)
{
	struct kj_job j = test_job();
	j.tmp_mb = 3;
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	const char *dirs[] = {"/tmp", "/dev/shm"};
	for (int i = 0; i < 2; i++) {
		struct statvfs v;
		struct stat st;
		CHECK(statvfs(dirs[i], &v) == 0 && stat(dirs[i], &st) == 0, "%s", dirs[i]);
		CHECK((unsigned long long)v.f_blocks * v.f_frsize == 3ULL << 20, "%s holds %llu bytes", dirs[i],
		      (unsigned long long)v.f_blocks * v.f_frsize);
		CHECK((st.st_mode & 07777) == 01777 && entries(dirs[i]) == 0, "%s mode %o, %d entries", dirs[i], st.st_mode, entries(dirs[i]));
		CHECK(v.f_flag & ST_NOSUID, "%s is not nosuid", dirs[i]);
	}
	CHECK(access("/work/marker", F_OK) == 0, "/work is not the job's work dir");
	CHECK(entries("/run/kiln") == 0, "/run/kiln shows %d entries of the box's", entries("/run/kiln"));
	return 0;
}

/* A work dir name that is a path, and a /tmp of no size, are refused. */
static int refuses_bad_params(void)
{
	const char *bad[] = {"../j1", "j1/x", "..", ""};
	for (int i = 0; i < 4; i++) {
		struct kj_job j = test_job();
		j.work = bad[i];
		CHECK_OK(kj_unshare(&j));
		const char *err = kj_mount(&j);
		CHECK(err && strstr(err, "not a name"), "work %s: %s", bad[i], err ? err : "accepted");
	}
	struct kj_job j = test_job();
	j.tmp_mb = 0;
	CHECK_OK(kj_unshare(&j));
	const char *err = kj_mount(&j);
	CHECK(err && strstr(err, "/tmp"), "tmp_mb 0: %s", err ? err : "accepted");
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("proc", proc);
	failed += run_case("masked_and_read_only", masked_and_read_only);
	failed += run_case("tmpfs_work_and_run", tmpfs_work_and_run);
	failed += run_case("refuses_bad_params", refuses_bad_params);
	return failed ? 1 : 0;
}
