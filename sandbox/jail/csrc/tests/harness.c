#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static struct sock_filter allow_all[] = {{BPF_RET | BPF_K, 0, 0, SECCOMP_RET_ALLOW}};

struct kj_job test_job(void)
{
	struct kj_job j;
	memset(&j, 0, sizeof j);
	j.abi = KJ_ABI;
	j.uid = TEST_UID;
	j.egress_fd = -1;
	j.proc_fd = -1;
	for (int i = 0; i < 4; i++)
		j.keep[i] = -1;
	j.tmp_mb = 8;
	j.work = TEST_WORK;
	j.rmem = "4096 131072 4194304";
	j.wmem = "4096 16384 4194304";
	j.filter = allow_all;
	j.filter_len = sizeof allow_all;
	return j;
}

int read_file(const char *path, char *buf, size_t n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t got = 0, r;
	while ((size_t)got < n - 1 && (r = read(fd, buf + got, n - 1 - (size_t)got)) > 0)
		got += r;
	close(fd);
	buf[got] = 0;
	return (int)got;
}

const char *status_field(const char *field, char *buf, size_t n)
{
	static char status[8192];
	buf[0] = 0;
	if (read_file("/proc/self/status", status, sizeof status) < 0)
		return buf;
	size_t fl = strlen(field);
	for (char *line = status; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
			char *v = line + fl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			size_t len = strcspn(v, "\n");
			if (len >= n)
				len = n - 1;
			memcpy(buf, v, len);
			buf[len] = 0;
			break;
		}
	}
	return buf;
}

unsigned long ns_id(const char *name)
{
	char path[64];
	struct stat st;
	snprintf(path, sizeof path, "/proc/self/ns/%s", name);
	return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

static void die(const char *what)
{
	fprintf(stderr, "    box: %s: %s\n", what, strerror(errno));
	_exit(2);
}

static void write_or_die(const char *path, const char *data)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, data, strlen(data)) != (ssize_t)strlen(data))
		die(path);
	close(fd);
}

static void mkdir_or_die(const char *path, mode_t mode)
{
	if (mkdir(path, mode) != 0 && errno != EEXIST)
		die(path);
}

/* box_root makes the box's root file system in a tmpfs and pivots into
 * it (not chroot: a chrooted process may not make a user namespace). */
static void box_root(void)
{
	/* Over the host's /tmp, in this mount namespace only: nothing is
	 * left on the host. */
	const char *root = "/tmp";
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		die("make / private");
	if (mount("tmpfs", root, "tmpfs", 0, "size=1m,mode=0755") != 0)
		die("mount the box's root");
	if (chdir(root) != 0)
		die("chdir the box's root");
	const char *dirs[] = {"proc", "dev", "tmp", "work", "run", "run/kiln", "run/kiln/jobs", "run/kiln/jobs/" TEST_WORK,
			      "old"};
	for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
		mkdir_or_die(dirs[i], 0755);
	if (chmod("tmp", 01777) != 0 || chown("run/kiln/jobs/" TEST_WORK, TEST_UID, TEST_UID) != 0)
		die("the box's dirs");
	const char *markers[] = {"run/kiln/marker", "run/kiln/jobs/" TEST_WORK "/marker"};
	for (size_t i = 0; i < 2; i++) {
		int fd = open(markers[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0)
			die(markers[i]);
		close(fd);
	}
	/* A fully visible /proc, as a box's, or no proc could be mounted in
	 * this user namespace; the host's devices. */
	if (mount("/proc", "proc", NULL, MS_BIND | MS_REC, NULL) != 0 || mount("/dev", "dev", NULL, MS_BIND | MS_REC, NULL) != 0)
		die("bind /proc and /dev");
	if (syscall(SYS_pivot_root, ".", "old") != 0)
		die("pivot_root");
	if (chdir("/") != 0 || umount2("/old", MNT_DETACH) != 0 || rmdir("/old") != 0)
		die("detach the old root");
}

/* box runs fn in a job process of a fresh box (see harness.h). */
static int box(int (*fn)(void))
{
	int up[2], go[2];
	if (pipe2(up, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0)
		die("pipe");
	pid_t b = fork();
	if (b < 0)
		die("fork");
	if (b == 0) {
		char c;
		if (unshare(CLONE_NEWUSER) != 0)
			die("unshare the box's user namespace");
		if (write(up[1], "u", 1) != 1 || read(go[0], &c, 1) != 1)
			die("wait for the box's maps");
		if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
			die("become the box's root");
		if (unshare(CLONE_NEWNS) != 0)
			die("unshare the box's mount namespace");
		box_root();
		if (kj_job_pidns() != 0)
			die("kj_job_pidns");
		pid_t j = fork();
		if (j < 0)
			die("fork the job");
		if (j == 0) {
			/* As a job's reaper, pid 1 of its namespace: dumpable (the
			 * box's root became root by setresuid, which clears it). */
			if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
				die("dumpable");
			_exit(fn());
		}
		int st;
		if (waitpid(j, &st, 0) != j)
			die("wait for the job");
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	}
	char c, path[64], map[64];
	if (read(up[0], &c, 1) != 1)
		die("the box did not make its user namespace");
	snprintf(map, sizeof map, "0 %u 65536\n", TEST_BOX_BASE);
	snprintf(path, sizeof path, "/proc/%d/uid_map", b);
	write_or_die(path, map);
	snprintf(path, sizeof path, "/proc/%d/gid_map", b);
	write_or_die(path, map);
	if (write(go[1], "g", 1) != 1)
		die("start the box");
	close(up[0]);
	close(up[1]);
	close(go[0]);
	close(go[1]);
	int st;
	if (waitpid(b, &st, 0) != b)
		die("wait for the box");
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int run_case(const char *name, int (*fn)(void))
{
	fflush(stdout);
	fflush(stderr);
	int rc = box(fn);
	printf("%s %s\n", rc == 0 ? "ok" : "FAIL", name);
	fflush(stdout);
	return rc != 0;
}
