/*
 * The job's network namespace: loopback alone, up; TCP buffers bounded as
 * a container's are (the box's own namespace serves no job); and, for a
 * job with a network, its egress proxy's listener on 127.0.0.1, made here
 * and handed to the worker, which serves it (the job only connects).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "internal.h"

int net_loopback_up(struct kj_job *job)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return kj_fail(job, "loopback: socket");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
	int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
	if (rc == 0 && !(ifr.ifr_flags & IFF_UP)) {
		ifr.ifr_flags |= IFF_UP;
		rc = ioctl(s, SIOCSIFFLAGS, &ifr);
	}
	int errnum = errno;
	close(s);
	if (rc != 0) {
		errno = errnum;
		return kj_fail(job, "loopback up");
	}
	return 0;
}

int net_tcp_buffers(struct kj_job *job)
{
	if (job->rmem && *job->rmem && kj_write_at(job, -1, "/proc/sys/net/ipv4/tcp_rmem", job->rmem))
		return -1;
	if (job->wmem && *job->wmem && kj_write_at(job, -1, "/proc/sys/net/ipv4/tcp_wmem", job->wmem))
		return -1;
	return 0;
}

/* send_fd sends fd on the unix socket chan with one byte, "L". */
static int send_fd(int chan, int fd)
{
	char byte = 'L';
	struct iovec iov = {&byte, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	ssize_t n;
	do
		n = sendmsg(chan, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == 1 ? 0 : -1;
}

int net_egress(struct kj_job *job)
{
	if (job->egress_port > 65535 || job->egress_fd < 0)
		return kj_failx(job, "egress: port %d on descriptor %d", job->egress_port, job->egress_fd);
	if (net_loopback_up(job))
		return -1;
	int ln = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ln < 0)
		return kj_fail(job, "egress: socket");
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)job->egress_port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int rc = -1;
	if (bind(ln, (struct sockaddr *)&a, sizeof a) != 0)
		kj_fail(job, "egress: bind 127.0.0.1:%d", job->egress_port);
	else if (listen(ln, 128) != 0)
		kj_fail(job, "egress: listen");
	else if (send_fd(job->egress_fd, ln) != 0)
		kj_fail(job, "egress: hand the listener over");
	else
		rc = 0;
	close(ln);
	return rc;
}
