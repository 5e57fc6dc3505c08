/* user.c: the job's uid and gid, and its own user namespace. */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static int enter(struct kj_job *j)
{
	CHECK_OK(kj_enter(j));
	return 0;
}

static int send_fd(int sock, int fd)
{
	char b = 'n';
	struct iovec iov = {&b, 1};
	char cbuf[CMSG_SPACE(sizeof(int))];
	memset(cbuf, 0, sizeof cbuf);
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char b;
	struct iovec iov = {&b, 1};
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	if (recvmsg(sock, &m, 0) != 1 || CMSG_FIRSTHDR(&m) == NULL)
		return -1;
	int fd;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
	return fd;
}

/* The job runs as its uid and gid, no group, in a user namespace of its
 * own nested in the box's, which maps its uid and gid alone. */
static int own_namespace(void)
{
	struct stat boxst;
	CHECK(stat("/proc/self/ns/user", &boxst) == 0, "the box's user namespace");
	/* A process of the box's (its root) checks the job's namespace's
	 * parent: the job itself cannot name it. */
	int sp[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0, "socketpair");
	pid_t w = fork();
	CHECK(w >= 0, "fork");
	if (w == 0) {
		int ns = recv_fd(sp[0]);
		int parent = ns >= 0 ? ioctl(ns, NS_GET_PARENT) : -1;
		struct stat st;
		_exit(parent >= 0 && fstat(parent, &st) == 0 && st.st_ino == boxst.st_ino ? 0 : 1);
	}
	struct kj_job j = test_job();
	j.keep[0] = sp[1];
	if (enter(&j))
		return 1;
	CHECK(getuid() == TEST_UID && geteuid() == TEST_UID && getgid() == TEST_UID && getegid() == TEST_UID, "uid %d gid %d",
	      getuid(), getgid());
	CHECK(getgroups(0, NULL) == 0, "%d supplementary groups", getgroups(0, NULL));
	const char *maps[] = {"/proc/self/uid_map", "/proc/self/gid_map"};
	for (int i = 0; i < 2; i++) {
		char buf[256];
		unsigned a, b, n;
		int len = read_file(maps[i], buf, sizeof buf);
		CHECK(len > 0 && sscanf(buf, "%u %u %u", &a, &b, &n) == 3 && a == TEST_UID && b == TEST_UID && n == 1 &&
			      strchr(buf, '\n') == buf + len - 1,
		      "%s: %s; want one line mapping the job's id alone", maps[i], buf);
	}
	char sg[16];
	CHECK(read_file("/proc/self/setgroups", sg, sizeof sg) > 0 && strcmp(sg, "deny\n") == 0, "setgroups %s", sg);
	int own = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
	struct stat ownst;
	CHECK(own >= 0 && fstat(own, &ownst) == 0 && ownst.st_ino != boxst.st_ino, "the job is in the box's user namespace");
	CHECK(ioctl(own, NS_GET_PARENT) < 0 && errno == EPERM, "the job reached its namespace's parent");
	uid_t owner = (uid_t)-1;
	CHECK(ioctl(own, NS_GET_OWNER_UID, &owner) == 0 && owner == TEST_UID, "owner %d", (int)owner);
	CHECK(send_fd(sp[1], own) == 0, "send the namespace");
	int st;
	CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the job's namespace is not the box's child");
	return 0;
}

/* Every other uid is the overflow uid: the job names none of them. */
static int other_uids_unmapped(void)
{
	struct kj_job j = test_job();
	if (enter(&j))
		return 1;
	struct stat st;
	CHECK(stat("/", &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534, "/ is owned by %d:%d; want the overflow ids",
	      st.st_uid, st.st_gid);
	CHECK(stat("/work", &st) == 0 && st.st_uid == TEST_UID, "/work is owned by %d", st.st_uid);
	errno = 0;
	CHECK(setuid(0) != 0 && errno == EINVAL, "setuid(0)");
	CHECK(setresuid(TEST_UID + 1, TEST_UID + 1, TEST_UID + 1) != 0 && errno == EINVAL, "setresuid to another uid");
	CHECK(setgid(0) != 0 && errno == EINVAL, "setgid(0)");
	gid_t g = 0;
	CHECK(setgroups(1, &g) != 0 && errno == EPERM, "setgroups");
	int fd = open("/work/f", O_WRONLY | O_CREAT | O_EXCL, 0644);
	CHECK(fd >= 0, "create in /work");
	CHECK(fchown(fd, 0, 0) != 0 && errno == EINVAL, "chown to root");
	CHECK(fchown(fd, TEST_UID + 1, -1) != 0 && errno == EINVAL, "chown to another uid");
	/* The maps are written once; the job cannot rewrite them. */
	int m = open("/proc/self/uid_map", O_WRONLY);
	CHECK(m < 0, "uid_map opened for writing");
	return 0;
}

/* The box's root never becomes a job's uid: uid 0 is refused. */
static int refuses_root(void)
{
	struct kj_job j = test_job();
	j.uid = 0;
	CHECK_OK(kj_unshare(&j));
	CHECK_OK(kj_mount(&j));
	const char *err = kj_become(&j);
	CHECK(err && strstr(err, "root"), "uid 0: %s", err ? err : "accepted");
	return 0;
}

/* The job holds no capability in the box's namespace either: it cannot
 * join it, nor act as its owner. */
static int no_capability_in_the_box(void)
{
	int box = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
	CHECK(box >= 0, "open the box's user namespace");
	struct kj_job j = test_job();
	j.keep[0] = box;
	if (enter(&j))
		return 1;
	CHECK(setns(box, CLONE_NEWUSER) != 0 && errno == EPERM, "joined the box's user namespace");
	/* Another user namespace, then maps from it, is the job's filter's to
	 * refuse (test_seccomp); without it, a nested one maps nothing but
	 * the job's own uid either. */
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("own_namespace", own_namespace);
	failed += run_case("other_uids_unmapped", other_uids_unmapped);
	failed += run_case("refuses_root", refuses_root);
	failed += run_case("no_capability_in_the_box", no_capability_in_the_box);
	return failed ? 1 : 0;
}
